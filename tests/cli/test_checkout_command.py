"""The checkout's `.venv/bin/attune` (Makefile): the command line from any directory, on its own cli/."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import cli

REPO = Path(__file__).resolve().parents[2]


def test_the_checkouts_venv_has_the_attune_command_on_this_checkouts_code(tmp_path):
    venv = Path(sys.prefix).resolve()
    if venv != REPO / ".venv":
        pytest.skip(f"runs in the checkout's .venv (make venv installs its attune), not in {venv}")
    program = venv / "bin" / "attune"
    assert program.is_file(), "make venv installs it: Makefile, $(VENV)/bin/attune"
    # From a directory outside the checkout, where `python -m cli` finds no module named cli.
    version = subprocess.run([str(program), "--version"], cwd=tmp_path, capture_output=True, text=True)
    assert version.returncode == 0 and version.stdout.strip() == f"attune {cli.__version__}"
    where = subprocess.run(
        [sys.executable, "-c", "import cli; print(cli.__file__)"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
    )
    # Editable: it runs the checkout's own cli/, so a change there needs no reinstall.
    assert where.returncode == 0 and Path(where.stdout.strip()).resolve() == REPO / "cli" / "__init__.py"
