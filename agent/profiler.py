"""Profiling runs on the agent: measure a workload's seconds per iteration at the core counts asked for.

A `profile` command (docs/profiling.md) names a run (its lease id), the workload's argv and env, the GPUs,
cores and memory the run holds, and the core counts to measure next. The service runs the CPU search
(profiles_app/optimistic.py) and updates the list from the points reported, so the agent only measures:
each point is one launch of the workload through the same launcher as a job (pinned to that many cores,
memory capped), timed by the workload itself after its warm-up iterations (`iters_per_s` in its progress
file, ATTUNE_WARMUP_ITERS set), and reported as `profile_point` through the spool. The first launch of a
run is a warm-up (caches, generated data) and is not timed. The LeaseManager drives these tasks from its
supervision tick, so a point never blocks the poll or report threads.

A GENIE run (`"method": "genie"`, docs/genie.md) names configurations instead of core counts: each is one
launch of its own argv (per-GPU batch) on its number of the run's GPUs and cores, stopped with SIGTERM
after `max_s` (the bound on GPU time per configuration: the workload checkpoints, and its progress file
still holds the speed it measured after its warm-up), and reported as `profile_point` with its `config`
and `node_rank`. A configuration across servers has one part on each server's agent.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agent.accounts import TRAVERSE_ONLY_MODE, Account, make_private_dir, read_job_file
from agent.exit_status import ExitStatus
from agent.launch_spec import LaunchSpec
from agent.lease_process import LeaseProcess

POINT_TIMEOUT_S = 900.0  # a point is ~50 iterations: this bounds a hung one
GENIE_METHOD = "genie"
# After a GENIE point's SIGTERM at max_s, it has this long to write its progress and exit.
GENIE_TERM_GRACE_S = 10.0


@dataclass(frozen=True)
class PointPlan:
    """One launch to measure: its key (a core count, or a GENIE configuration), cores, GPUs and argv.

    `ident` goes into its report (`{"cpus": 12}`, or `{"config": "n1k1b32", "node_rank": 0}`); `max_s`,
    when set, ends the launch with SIGTERM once it has run that long (GENIE's bound per configuration).
    """

    key: Any
    cpus: int
    gpu_uuids: tuple[str, ...]
    argv: tuple[str, ...]
    env: dict[str, str]
    ident: dict[str, Any]
    max_s: float | None = None

    @property
    def name(self) -> str:
        """Its directory's name (safe: built from validated numbers and a sanitised key)."""
        if "cpus" in self.ident:
            return f"c{self.cpus}"
        return "g-" + "".join(ch if ch.isalnum() or ch in "-_" else "_" for ch in str(self.key))[:64]


@dataclass
class ProfileTask:
    """One profiling run as this agent runs it. `measured` holds the core counts already reported."""

    run_id: str
    command: dict[str, Any]
    measured: set[int] = field(default_factory=set)
    warmup_pending: bool = False
    process: LeaseProcess | None = None
    spec: LaunchSpec | None = None
    current: PointPlan | None = None
    current_is_warmup: bool = False
    started_s: float = 0.0  # wall clock, for wall_s and the point timeout
    stop_kind: str | None = None
    stop_deadline_s: float | None = None
    killed: bool = False
    term_sent: bool = False  # a GENIE point was told to stop at its max_s
    failed: bool = False

    @property
    def gpu_uuids(self) -> tuple[str, ...]:
        return tuple(self.command.get("gpu_uuids") or ())

    @property
    def current_cpus(self) -> int:
        return self.current.cpus if self.current is not None else 0

    @property
    def current_key(self) -> str:
        """The point being measured, for logs: "12 cores" or a GENIE configuration's key."""
        if self.current is None:
            return "-"
        return f"{self.current.cpus} cores" if "cpus" in self.current.ident else str(self.current.key)

    @property
    def is_genie(self) -> bool:
        return self.command.get("method") == GENIE_METHOD

    @property
    def cpus_held(self) -> tuple[int, ...]:
        return self.spec.cpus if self.spec is not None and self.process is not None else ()

    def next_cpus(self) -> int | None:
        """The next core count to measure (the service's order), or None while there is none."""
        for cpus in self.command.get("cpu_counts") or ():
            if isinstance(cpus, int) and cpus >= 1 and cpus not in self.measured:
                return cpus
        return None

    def next_point(self) -> PointPlan | None:
        """The next launch to measure (the service's order), or None while there is none."""
        if not self.is_genie:
            cpus = self.next_cpus()
            if cpus is None:
                return None
            argv = tuple(str(a) for a in self.command["argv"])
            return PointPlan(cpus, cpus, self.gpu_uuids, argv, {}, {"cpus": cpus})
        for config in self.command.get("configs") or ():
            plan = genie_point(config, self.gpu_uuids, self.command)
            if plan is not None and plan.key not in self.measured:
                return plan
        return None


def genie_point(config: Any, gpu_uuids: tuple[str, ...], command: dict[str, Any]) -> PointPlan | None:
    """The launch of one GENIE configuration, or None when it is malformed (skipped, never measured)."""
    if not isinstance(config, dict) or not isinstance(config.get("key"), str) or not config.get("argv"):
        return None
    gpus, cpus = config.get("gpus"), config.get("num_cpus")
    if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 1 for v in (gpus, cpus)):
        return None
    if gpus > len(gpu_uuids):
        return None
    max_s = config.get("max_s", command.get("max_s_per_config"))
    return PointPlan(
        key=config["key"],
        cpus=cpus,
        gpu_uuids=gpu_uuids[:gpus],
        argv=tuple(str(a) for a in config["argv"]),
        env={str(k): str(v) for k, v in (config.get("env") or {}).items()},
        ident={"config": config["key"], "node_rank": int(config.get("node_rank") or 0)},
        max_s=float(max_s) if isinstance(max_s, int | float) and max_s > 0 else None,
    )


def point_dir(work_dir: Path, run_id: str, name: str, *, warmup: bool) -> Path:
    return work_dir / "profiles" / run_id / (f"{name}-warmup" if warmup else name)


def point_spec(
    task: ProfileTask,
    plan: PointPlan,
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
    lease_dir = point_dir(work_dir, task.run_id, plan.name, warmup=warmup)
    shutil.rmtree(lease_dir, ignore_errors=True)
    run_dir = work_dir / "profiles" / task.run_id
    run_dir.mkdir(parents=True, exist_ok=True)
    os.chmod(run_dir, TRAVERSE_ONLY_MODE)  # the run's account reaches its points' directories below
    env = {str(k): str(v) for k, v in (task.command.get("env") or {}).items()}
    env.update(plan.env)
    if "ATTUNE_DATA_DIR" not in env:
        # Data a workload generates or caches survives from point to point (the dataset stays cached),
        # in a directory the run's account owns.
        data_dir = run_dir / "data"
        if account is not None:
            make_private_dir(data_dir, account)
        env["ATTUNE_DATA_DIR"] = str(data_dir)
    return LaunchSpec(
        lease_id=f"{task.run_id}-{plan.name}" + ("-warmup" if warmup else ""),
        job_id=None,
        argv=plan.argv,
        env=env,
        gpu_uuids=plan.gpu_uuids,
        cpus=cpus,
        mem_gb=float(task.command["mem_gb"]),
        resume_iters=0,
        lease_dir=lease_dir,
        checkpoint_path=lease_dir / "checkpoint" / "checkpoint.json",
        time_scale=time_scale,
        account=account,
    )


def point_result(
    spec: LaunchSpec,
    status: ExitStatus,
    *,
    ident: dict[str, Any],
    wall_s: float,
    time_scale: float,
    stopped_at_limit: bool = False,
) -> tuple[str, dict[str, Any]]:
    """("profile_point", data) from a finished launch, or ("profile_error", data) when it gives no time.

    `ident` says which point it is (`cpus`, or GENIE's `config` and `node_rank`). `sec_per_iter` is in
    the workload's own time: a fake node's time scale is taken out. A GENIE launch also reports
    `param_bytes` and `startup_s` when its workload wrote them (`startup_s` in its own time), and
    `stopped_at_limit` when it was stopped at its configuration's max_s.
    """
    peak_rss_mb = round(status.peak_rss_kb / 1024, 1) if status.peak_rss_kb else None
    progress: dict[str, Any] = {}
    with contextlib.suppress(OSError, ValueError):
        progress = json.loads(read_job_file(spec.progress_path, spec.job_uid, max_bytes=65536))
    ips = progress.get("iters_per_s")
    if status.exit_code == 0 and isinstance(ips, int | float) and ips > 0:
        data = {
            **ident,
            "sec_per_iter": 1.0 / float(ips) / (time_scale or 1.0),
            "iters": progress.get("done_iters"),
            "wall_s": round(wall_s, 3),
            "peak_rss_mb": peak_rss_mb,
            "time_scale": time_scale,
        }
        if "config" in ident:
            for key in ("param_bytes", "startup_s"):
                value = progress.get(key)
                if isinstance(value, int | float) and not isinstance(value, bool) and value >= 0:
                    data[key] = value
            data["stopped_at_limit"] = stopped_at_limit
        return "profile_point", data
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
    if stopped_at_limit and (status.exit_code == 0 or status.signal == signal.SIGTERM):
        # Killed by the bound's own SIGTERM: a workload still importing or loading has no handler yet.
        error = (
            f"no speed measured within the configuration's max_s ({wall_s:.0f} s): the workload was still"
            " starting or warming up; give it more time per configuration (--max-s-per-config)"
        )
    return "profile_error", {
        **ident,
        "error": error,
        "exit_code": status.exit_code,
        "signal": status.signal,
        "wall_s": round(wall_s, 3),
        "log_tail": [line[:500] for line in tail],
    }
