"""Proof that a standalone program (the node agent, the command line) imports nothing of the service."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SERVICE_PACKAGES = ("django", "rest_framework", "scheduler_app", "cluster_app", "profiles_app", "config")


def standalone_env() -> dict[str, str]:
    """This environment without Django's settings, with the repository importable."""
    env = {k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"}
    env["PYTHONPATH"] = str(ROOT)
    return env


def assert_imports_no_service(package: str, *, also: str = "") -> None:
    """Import every module of `package` (and `also`) in a fresh interpreter, since this test process
    may well have Django loaded, and fail naming any service module that came with them."""
    code = (
        f"import pkgutil, sys, {package}\n"
        + (f"import {also}\n" if also else "")
        + f"for info in pkgutil.iter_modules({package}.__path__):\n"
        "    if info.name != '__main__':\n"
        f"        __import__('{package}.' + info.name)\n"
        f"bad = sorted(m for m in sys.modules if m.split('.')[0] in {SERVICE_PACKAGES!r})\n"
        "assert not bad, bad\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=standalone_env(), capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr
