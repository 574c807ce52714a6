"""A lease as the agent knows it, what its spool record holds, and the tail of its output."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from agent.accounts import Account, read_job_file
from agent.launch_spec import LaunchSpec
from agent.lease_process import LeaseProcess


class StartError(ValueError):
    """A start command that cannot be carried out (malformed, or names a GPU this node does not have)."""


@dataclass
class Lease:
    """A launched lease and what the agent knows about it. `stop_deadline_s` is wall-clock time."""

    spec: LaunchSpec
    process: LeaseProcess
    isolation: str
    log_offsets: dict[str, int] = field(default_factory=dict)  # per output file: bytes already shipped
    stop_kind: str | None = None
    stop_deadline_s: float | None = None
    killed: bool = False
    done_iters: int | None = None
    iters_per_s: float | None = None
    next_log_at_s: float = 0.0  # monotonic
    next_progress_at_s: float = 0.0  # monotonic
    gpu_wait_logged: bool = False
    renewed_boot_s: float = 0.0  # the last answered sync that counted it live (agent/fence.py's clock)
    # Its start-up: wall-clock time of its launch, and the seconds from there to its first progress
    # (measured once, reported with that progress; None for leases adopted from before the measure).
    launched_at: float | None = None
    startup_s: float | None = None

    @property
    def startup_pending(self) -> bool:
        """Launched by this agent (or one before it) and no progress seen yet: the supervisor then reads
        the progress file every tick, so that the start-up is measured to a tick, not a sync."""
        return self.launched_at is not None and self.startup_s is None

    @property
    def lease_id(self) -> str:
        return self.spec.lease_id

    def record(self) -> dict[str, Any]:
        """What the spool keeps so that a restarted agent can adopt the lease."""
        spec = asdict(self.spec)
        spec.update(lease_dir=str(self.spec.lease_dir), checkpoint_path=str(self.spec.checkpoint_path))
        return {
            "spec": spec,
            "pid": self.process.pid,
            "start_ticks": self.process.start_ticks,
            "isolation": self.isolation,
            "log_offsets": self.log_offsets,
            "stop_kind": self.stop_kind,
            "stop_deadline_s": self.stop_deadline_s,
            "killed": self.killed,
            "done_iters": self.done_iters,
            "launched_at": self.launched_at,
            "startup_s": self.startup_s,
        }


def spec_from_record(spec: dict[str, Any]) -> LaunchSpec:
    """The spec a spooled record describes; records written before a field existed get its old meaning."""
    account = spec.get("account")
    return LaunchSpec(
        lease_id=spec["lease_id"],
        job_id=spec["job_id"],
        argv=tuple(spec["argv"]),
        env=dict(spec["env"]),
        gpu_uuids=tuple(spec["gpu_uuids"]),
        cpus=tuple(spec["cpus"]),
        mem_gb=float(spec["mem_gb"]),
        resume_iters=int(spec["resume_iters"]),
        lease_dir=Path(spec["lease_dir"]),
        checkpoint_path=Path(spec["checkpoint_path"]),
        time_scale=float(spec["time_scale"]),
        account=Account.from_record(account) if account else None,
        workdir=str(spec.get("workdir") or ""),
        script=spec.get("script"),
        stdout_path=str(spec.get("stdout_path") or ""),
        stderr_path=str(spec.get("stderr_path") or ""),
        job_subdir=bool(spec.get("job_subdir", False)),
    )


def read_tail_lines(path: Path, max_bytes: int = 8192, *, owner_uid: int | None = None) -> list[str]:
    """The last lines of a file (for OOM detection: a MemoryError traceback ends the log). A file the job
    controls is read only if it is a regular file of `owner_uid` (see accounts.open_job_file)."""
    try:
        return read_job_file(path, owner_uid, offset=-max_bytes).decode(errors="replace").splitlines()
    except OSError:
        return []


def output_tail_lines(spec: LaunchSpec) -> list[str]:
    """The last lines of the lease's output: the shim's log, then the job's stdout and stderr files."""
    lines = read_tail_lines(spec.log_path)
    for path in spec.job_output_files:
        lines += read_tail_lines(path, owner_uid=spec.job_uid)
    return lines
