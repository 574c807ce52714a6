"""docs/examples/train_single.sh keeps the checkpoint contract it documents: on SIGTERM it saves, and a
restart resumes from there (ddp_multinode.sh runs end to end in tests/e2e/test_multinode_jobs.py)."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[1] / "docs" / "examples"


def _start(workdir: Path, ckpt_dir: Path, progress: Path) -> subprocess.Popen:
    env = {
        # What the agent gives a job: a clean environment with the lease's variables.
        "PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin",
        "HOME": str(workdir),
        "ATTUNE_CHECKPOINT_DIR": str(ckpt_dir),
        "ATTUNE_PROGRESS_PATH": str(progress),
    }
    return subprocess.Popen(
        ["bash", str(workdir / "train_single.sh")],
        cwd=workdir,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,  # as the agent starts a lease: SIGTERM goes to the whole group
    )


def _wait_for(predicate, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.1)
    raise AssertionError("timed out")


def _steps_done(progress: Path) -> int:
    try:
        return int(re.search(r'"done_iters": (\d+)', progress.read_text()).group(1))
    except (OSError, AttributeError):
        return 0


def test_the_single_gpu_example_saves_on_sigterm_and_resumes(tmp_path):
    pytest.importorskip("torch", reason="the CPU build of PyTorch (requirements-profiling.txt) is needed")
    for name in ("train_single.sh", "train_ddp.py"):
        shutil.copy(EXAMPLES / name, tmp_path / name)
    ckpt_dir, progress = tmp_path / "ckpt", tmp_path / "progress.json"
    first = _start(tmp_path, ckpt_dir, progress)
    try:
        _wait_for(lambda: _steps_done(progress) >= 3, timeout_s=60)
        os.killpg(first.pid, signal.SIGTERM)  # the agent's preemption notice
        out, _ = first.communicate(timeout=30)
    finally:
        if first.poll() is None:
            os.killpg(first.pid, signal.SIGKILL)
    stopped_at = int(re.search(r"SIGTERM at step (\d+), checkpoint saved", out).group(1))
    assert (ckpt_dir / "last.pt").exists()

    second = _start(tmp_path, ckpt_dir, progress)
    try:
        line = second.stdout.readline()
        while line and "starting at step" not in line:
            line = second.stdout.readline()
    finally:
        os.killpg(second.pid, signal.SIGKILL)
        second.wait(timeout=10)
    assert f"starting at step {stopped_at}" in line
