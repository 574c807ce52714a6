"""Lease fencing on the node: the renewal file the agent writes after each answered sync, which the
lease's shim (agent/shim.py) and the agent's supervisor both enforce (docs/faults.md, "Fencing")."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# The node's monotonic clock, counting suspend (CLOCK_BOOTTIME): shared by every process on the node (the
# shim reads the same one) and blind to wall-clock steps, so a wrong or corrected date never extends or
# cuts a lease. Defined in the shim, which may import nothing of the agent.
from agent.shim import boot_clock_s

__all__ = ["FenceTimes", "boot_clock_s", "renewal_read", "renewal_write"]

# Until the service says otherwise (its register and sync answers carry `fence`): its defaults.
DEFAULT_FENCE_S = 60.0
DEFAULT_FENCE_GRACE_S = 30.0


@dataclass(frozen=True)
class FenceTimes:
    """How long a lease may go unrenewed (`fence_s`), then how long between the fence's SIGTERM and its
    SIGKILL (`grace_s`)."""

    fence_s: float = DEFAULT_FENCE_S
    grace_s: float = DEFAULT_FENCE_GRACE_S

    @classmethod
    def from_answer(cls, fence: Any, current: FenceTimes) -> FenceTimes:
        """The `fence` of a register or sync answer; `current` when it is missing or malformed."""
        try:
            times = cls(float(fence["lease_fence_s"]), float(fence["grace_s"]))
        except (TypeError, KeyError, ValueError):
            return current
        return times if times.fence_s > 0 and times.grace_s >= 0 else current


def renewal_write(path: Path, *, renewed_boot_s: float, times: FenceTimes) -> None:
    """Replace the lease's renewal file atomically (the shim may read it at any moment). Not fsynced: it
    lives as long as the node's uptime, and a crash of the node ends the job anyway."""
    tmp = path.with_name(path.name + ".tmp")
    data = {"renewed_boot_s": renewed_boot_s, "fence_s": times.fence_s, "grace_s": times.grace_s}
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
    with os.fdopen(fd, "w") as fh:
        json.dump(data, fh)
    os.replace(tmp, path)


def renewal_read(path: Path) -> float | None:
    """When the lease was last renewed (boot clock), or None without a readable renewal file."""
    try:
        return float(json.loads(path.read_text())["renewed_boot_s"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
