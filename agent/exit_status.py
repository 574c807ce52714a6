"""How a lease's process ended: the status its shim writes, and whether the job died of memory exhaustion."""

from __future__ import annotations

import json
import signal
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

# Exit code 137 (128 + SIGKILL) is what shells and container runtimes report for an OOM-killed process;
# a job the agent did not stop that exits with it is classified OOM (agent.workload uses it on MemoryError).
OOM_EXIT_CODE = 137
# A job killed by SIGKILL that the agent did not send counts as OOM when its peak RSS reached this
# fraction of its memory cap (the kernel's OOM killer picks the biggest process).
OOM_NEAR_CAP_FRACTION = 0.9


@dataclass(frozen=True, slots=True)
class ExitStatus:
    """How a lease's process ended: an exit code or a signal number; `error` when it never ran or was lost."""

    exit_code: int | None
    signal: int | None
    peak_rss_kb: int | None = None
    error: str | None = None
    fenced: bool = False  # the shim stopped the job: its lease went unrenewed past the fence


def classify_oom(
    status: ExitStatus,
    *,
    stop_requested: bool,
    mem_cap_bytes: int,
    log_tail: Sequence[str] = (),
    cgroup_oom_kills: int = 0,
) -> bool:
    """Did the job die of memory exhaustion? Pure, so that each rule is tested on its own.

    - the cgroup recorded an OOM kill (systemd-run mode);
    - it failed with a Python MemoryError in its last log lines (RLIMIT_AS makes allocations fail);
    - it exited with OOM_EXIT_CODE, or died of a SIGKILL that the agent did not send while its peak RSS
      was near its cap. When the agent itself stopped the job, SIGKILL/137 are the agent's doing.
    """
    if cgroup_oom_kills > 0:
        return True
    if status.exit_code not in (None, 0) and any("MemoryError" in line for line in log_tail[-20:]):
        return True
    if stop_requested:
        return False
    if status.exit_code == OOM_EXIT_CODE:
        return True
    if status.signal == signal.SIGKILL and status.peak_rss_kb and mem_cap_bytes > 0:
        return status.peak_rss_kb * 1024 >= OOM_NEAR_CAP_FRACTION * mem_cap_bytes
    return False


def read_exit_status(path: Path) -> ExitStatus | None:
    """The status the shim wrote, or None when there is none (the shim was killed or never ran)."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return ExitStatus(
        data.get("exit_code"),
        data.get("signal"),
        data.get("peak_rss_kb"),
        data.get("error"),
        fenced=bool(data.get("fenced")),
    )
