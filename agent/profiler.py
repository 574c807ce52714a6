"""Profiling runs on the agent: measure a workload's seconds per iteration at the core counts asked for.

A `profile` command (docs/profiling.md) names a run (its lease id), the workload's argv and env, the GPUs,
cores and memory the run holds, and the core counts to measure next. The service runs the CPU search
(profiles_app/optimistic.py) and updates the list from the points reported, so the agent only measures:
each point is one launch of the workload through the same launcher as a job (pinned to that many cores,
memory capped), timed by the workload itself after its warm-up iterations (`iters_per_s` in its progress
file, ATTUNE_WARMUP_ITERS set), and reported as `profile_point` through the spool. The first launch of a
run is a warm-up (caches, generated data) and is not timed. The LeaseManager drives these tasks from its
supervision tick, so a point never blocks the poll or report threads.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agent.accounts import TRAVERSE_ONLY_MODE, Account, make_private_dir, read_job_file
from agent.launcher import ExitStatus, LaunchSpec, LeaseProcess

POINT_TIMEOUT_S = 900.0  # a point is ~50 iterations: this bounds a hung one


@dataclass
class ProfileTask:
    """One profiling run as this agent runs it. `measured` holds the core counts already reported."""

    run_id: str
    command: dict[str, Any]
    measured: set[int] = field(default_factory=set)
    warmup_pending: bool = False
    process: LeaseProcess | None = None
    spec: LaunchSpec | None = None
    current_cpus: int = 0
    current_is_warmup: bool = False
    started_s: float = 0.0  # wall clock, for wall_s and the point timeout
    stop_kind: str | None = None
    stop_deadline_s: float | None = None
    killed: bool = False
    failed: bool = False

    @property
    def gpu_uuids(self) -> tuple[str, ...]:
        return tuple(self.command.get("gpu_uuids") or ())

    @property
    def cpus_held(self) -> tuple[int, ...]:
        return self.spec.cpus if self.spec is not None and self.process is not None else ()

    def next_cpus(self) -> int | None:
        """The next core count to measure (the service's order), or None while there is none."""
        for cpus in self.command.get("cpu_counts") or ():
            if isinstance(cpus, int) and cpus >= 1 and cpus not in self.measured:
                return cpus
        return None


def point_dir(work_dir: Path, run_id: str, cpus: int, *, warmup: bool) -> Path:
    return work_dir / "profiles" / run_id / (f"c{cpus}-warmup" if warmup else f"c{cpus}")


def point_spec(
    task: ProfileTask,
    *,
    work_dir: Path,
    cpus: tuple[int, ...],
    time_scale: float,
    warmup: bool,
    account: Account | None = None,
) -> LaunchSpec:
    """The launch of one point: a fresh directory, so no checkpoint or progress of an earlier launch
    (a workload resumes from its checkpoint) leaks into the measurement. `account`: who runs it (None:
    the agent itself)."""
    count = len(cpus)
    lease_dir = point_dir(work_dir, task.run_id, count, warmup=warmup)
    shutil.rmtree(lease_dir, ignore_errors=True)
    run_dir = work_dir / "profiles" / task.run_id
    run_dir.mkdir(parents=True, exist_ok=True)
    os.chmod(run_dir, TRAVERSE_ONLY_MODE)  # the run's account reaches its points' directories below
    env = {str(k): str(v) for k, v in (task.command.get("env") or {}).items()}
    if "ATTUNE_DATA_DIR" not in env:
        # Data a workload generates or caches survives from point to point (the dataset stays cached),
        # in a directory the run's account owns.
        data_dir = run_dir / "data"
        if account is not None:
            make_private_dir(data_dir, account)
        env["ATTUNE_DATA_DIR"] = str(data_dir)
    return LaunchSpec(
        lease_id=f"{task.run_id}-c{count}" + ("-warmup" if warmup else ""),
        job_id=None,
        argv=tuple(str(a) for a in task.command["argv"]),
        env=env,
        gpu_uuids=task.gpu_uuids,
        cpus=cpus,
        mem_gb=float(task.command["mem_gb"]),
        resume_iters=0,
        lease_dir=lease_dir,
        checkpoint_path=lease_dir / "checkpoint" / "checkpoint.json",
        time_scale=time_scale,
        account=account,
    )


def point_result(
    spec: LaunchSpec, status: ExitStatus, *, cpus: int, wall_s: float, time_scale: float
) -> tuple[str, dict[str, Any]]:
    """("profile_point", data) from a finished launch, or ("profile_error", data) when it gives no time.

    `sec_per_iter` is in the workload's own time: a fake node's time scale is taken out.
    """
    peak_rss_mb = round(status.peak_rss_kb / 1024, 1) if status.peak_rss_kb else None
    progress: dict[str, Any] = {}
    with contextlib.suppress(OSError, ValueError):
        progress = json.loads(read_job_file(spec.progress_path, spec.job_uid, max_bytes=65536))
    ips = progress.get("iters_per_s")
    if status.exit_code == 0 and isinstance(ips, int | float) and ips > 0:
        return "profile_point", {
            "cpus": cpus,
            "sec_per_iter": 1.0 / float(ips) / (time_scale or 1.0),
            "iters": progress.get("done_iters"),
            "wall_s": round(wall_s, 3),
            "peak_rss_mb": peak_rss_mb,
            "time_scale": time_scale,
        }
    if status.error:
        error = status.error
    elif status.exit_code == 0:
        error = "the workload exited 0 without reporting iters_per_s in its progress file"
    elif status.signal is not None:
        error = f"the workload died of signal {status.signal}"
    else:
        error = f"the workload exited with {status.exit_code}"
    try:
        tail = spec.log_path.read_text(errors="replace").splitlines()[-20:]
    except OSError:
        tail = []
    return "profile_error", {
        "cpus": cpus,
        "error": error,
        "exit_code": status.exit_code,
        "signal": status.signal,
        "wall_s": round(wall_s, 3),
        "log_tail": [line[:500] for line in tail],
    }
