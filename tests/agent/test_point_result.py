"""What a finished profiling launch reports: a point with its speed, or an error that says what to do."""

from __future__ import annotations

import json
import signal
from pathlib import Path

from agent.exit_status import ExitStatus
from agent.launch_spec import LaunchSpec
from agent.profiler import point_result

IDENT = {"config": "n1k1b8", "node_rank": 0}


def spec(tmp_path: Path) -> LaunchSpec:
    lease_dir = tmp_path / "lease"
    (lease_dir / "job").mkdir(parents=True)
    return LaunchSpec(
        lease_id="run-1",
        job_id=None,
        argv=("python", "-m", "agent.torch_workload"),
        env={},
        gpu_uuids=("GPU-0",),
        cpus=(0,),
        mem_gb=4.0,
        resume_iters=0,
        lease_dir=lease_dir,
        checkpoint_path=lease_dir / "job" / "ckpt",
    )


def result(s: LaunchSpec, status: ExitStatus, *, wall_s: float, at_limit: bool) -> tuple[str, dict]:
    return point_result(s, status, ident=IDENT, wall_s=wall_s, time_scale=1.0, stopped_at_limit=at_limit)


def test_a_launch_stopped_at_its_bound_after_measuring_is_a_point(tmp_path):
    s = spec(tmp_path)
    s.progress_path.write_text(json.dumps({"iters_per_s": 4.0, "done_iters": 40, "startup_s": 2.5}))
    kind, data = result(s, ExitStatus(exit_code=0, signal=None), wall_s=9.1, at_limit=True)
    assert kind == "profile_point"
    assert data["sec_per_iter"] == 0.25 and data["stopped_at_limit"] is True and data["startup_s"] == 2.5


def test_a_launch_killed_by_its_bound_before_it_could_measure_says_to_give_it_more_time(tmp_path):
    """The bound's SIGTERM reached a workload still importing (no handler yet): not "died of signal 15"."""
    kind, data = result(
        spec(tmp_path), ExitStatus(exit_code=None, signal=signal.SIGTERM), wall_s=9.02, at_limit=True
    )
    assert kind == "profile_error"
    assert "no speed measured within the configuration's max_s (9 s)" in data["error"]
    assert "--max-s-per-config" in data["error"]
    assert data["signal"] == signal.SIGTERM and data["config"] == "n1k1b8"


def test_a_launch_killed_by_another_signal_says_which(tmp_path):
    kind, data = result(
        spec(tmp_path), ExitStatus(exit_code=None, signal=signal.SIGKILL), wall_s=3.0, at_limit=False
    )
    assert kind == "profile_error" and data["error"] == f"the workload died of signal {int(signal.SIGKILL)}"
