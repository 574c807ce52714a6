"""The synthetic workload: speed from the profile, progress, checkpoint on SIGTERM, resume."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from agent.workload import granted_resources, load_profile, tput
from tests.agent.fake_service import wait_for

ROOT = Path(__file__).resolve().parents[2]


def workload(args: list[str], tmp_path: Path, **env: str) -> subprocess.Popen:
    base = {k: v for k, v in os.environ.items() if not k.startswith("ATTUNE_")}
    base.update(
        {
            "PYTHONPATH": str(ROOT),
            "CUDA_VISIBLE_DEVICES": "GPU-a",
            "ATTUNE_MEM_GB": "62.5",
            "ATTUNE_PROGRESS_PATH": str(tmp_path / "progress.json"),
            "ATTUNE_CHECKPOINT_PATH": str(tmp_path / "checkpoint.json"),
        }
    )
    base.update(env)
    return subprocess.Popen(
        [sys.executable, "-m", "agent.workload", *args],
        env=base,
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def rate_of(output: str) -> float:
    match = re.search(r"done: \d+ iterations in [\d.]+ s \(([\d.]+) it/s\)", output)
    assert match, output
    return float(match.group(1))


def test_tput_lookup_uses_the_largest_grid_points_below():
    profile = load_profile("res18")
    assert tput(profile, 3, 62.5) == 1.0
    assert tput(profile, 9, 62.5) == 2.4
    assert tput(profile, 10.5, 100) == 2.4  # between grid points: the one below
    assert tput(profile, 0.5, 10) == 0.1  # below the grid: the smallest point


def test_resources_from_the_environment():
    env = {"CUDA_VISIBLE_DEVICES": "GPU-a,GPU-b", "ATTUNE_CPUS_GRANTED": "18", "ATTUNE_MEM_GB": "125"}
    assert granted_resources(env) == (2, 9.0, 62.5)
    gpus, cpus_per_gpu, _ = granted_resources({"ATTUNE_MEM_GB": "10"})
    assert (gpus, cpus_per_gpu) == (1, len(os.sched_getaffinity(0)))  # no grant: its own affinity


def test_image_model_runs_faster_with_more_cores(tmp_path):
    # res18 at 9 vs 3 cores per GPU: the profile says 2.4x. Both run at once to keep the test short.
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    args = ["--model", "res18", "--iters", "150", "--log-every", "1000"]
    fast = workload(args, tmp_path / "a", ATTUNE_CPUS_GRANTED="9", ATTUNE_TIME_SCALE="0.01")
    slow = workload(args, tmp_path / "b", ATTUNE_CPUS_GRANTED="3", ATTUNE_TIME_SCALE="0.01")
    fast_out, _ = fast.communicate(timeout=30)
    slow_out, _ = slow.communicate(timeout=30)
    assert fast.returncode == slow.returncode == 0
    ratio = rate_of(fast_out) / rate_of(slow_out)
    assert 2.1 < ratio < 2.7, (ratio, fast_out, slow_out)


def test_profile_from_the_environment_wins_over_the_catalog(tmp_path):
    profile = {
        "iter_time_s": 0.001,
        "cpu_per_gpu_grid": [1, 4],
        "mem_gb_per_gpu_grid": [1],
        "tput": [[1], [4]],
    }
    proc = workload(
        ["--model", "not-in-catalog", "--iters", "50"],
        tmp_path,
        ATTUNE_PROFILE_JSON=json.dumps(profile),
        ATTUNE_CPUS_GRANTED="4",
    )
    out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 0, out
    assert "tput 4, 0.00025 s/iter" in out


def test_sigterm_checkpoints_then_resume_continues(tmp_path):
    args = ["--model", "res18", "--iters", "100000", "--progress-every-s", "0.05"]
    proc = workload(args, tmp_path, ATTUNE_CPUS_GRANTED="3", ATTUNE_TIME_SCALE="0.01")
    progress = tmp_path / "progress.json"
    wait_for(lambda: progress.exists() and json.loads(progress.read_text())["done_iters"] > 10)
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=5)
    assert proc.returncode == 0
    assert "SIGTERM received: checkpointed at iteration" in out
    saved = json.loads((tmp_path / "checkpoint.json").read_text())["done_iters"]
    assert saved > 10 and json.loads(progress.read_text())["done_iters"] == saved

    # The checkpoint is ahead of what the service stored: resume from the checkpoint.
    proc = workload(
        ["--model", "res18", "--iters", str(saved + 5)],
        tmp_path,
        ATTUNE_RESUME_ITERS="3",
        ATTUNE_CPUS_GRANTED="3",
        ATTUNE_TIME_SCALE="0.01",
    )
    out, _ = proc.communicate(timeout=10)
    assert proc.returncode == 0
    assert f"resuming from iteration {saved} (checkpoint {saved}, service 3)" in out
    assert "done: 5 iterations" in out

    # On another node (no checkpoint file) the service's number is the floor.
    (tmp_path / "checkpoint.json").unlink()
    proc = workload(
        ["--model", "res18", "--iters", "40"],
        tmp_path,
        ATTUNE_RESUME_ITERS="30",
        ATTUNE_CPUS_GRANTED="3",
        ATTUNE_TIME_SCALE="0.01",
    )
    out, _ = proc.communicate(timeout=10)
    assert "resuming from iteration 30" in out and "done: 10 iterations" in out


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--model", "nope", "--iters", "5"], "unknown model 'nope'"),
        (["--model", "res18", "--iters", "0"], "--iters must be positive"),
    ],
)
def test_bad_usage_exits_2(tmp_path, args, message):
    proc = workload(args, tmp_path)
    out, _ = proc.communicate(timeout=10)
    assert proc.returncode == 2 and message in out
