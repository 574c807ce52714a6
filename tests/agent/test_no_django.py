"""The agent is a standalone program: importing any of its modules pulls in no Django."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_agent_modules_import_without_django():
    # A fresh interpreter: the test process itself may well have Django loaded.
    code = (
        "import pkgutil, sys, agent, agent.workload\n"
        "for info in pkgutil.iter_modules(agent.__path__):\n"
        "    if info.name != '__main__':\n"
        "        __import__('agent.' + info.name)\n"
        "service = {'django', 'rest_framework', 'scheduler_app', 'cluster_app', 'profiles_app', 'config'}\n"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in service)\n"
        "assert not bad, bad\n"
        "print('ok', len([m for m in sys.modules if m.startswith('agent')]))\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"}
    env["PYTHONPATH"] = str(ROOT)
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("ok")
