"""A lease's resources file (`ATTUNE_RESOURCES_FILE`): what the job holds now, rewritten when it is resized.

JSON: {"cpus": cores granted, "core_ids": the real cores they run on, "mem_gb": memory granted,
"changed_at": ISO time}. Written by the agent in the lease directory (the agent's, 0711), mode 0644,
atomically (a temporary file renamed over it), so the job may read it at any moment.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path

RESOURCES_FILE_NAME = "resources.json"
RESOURCES_FILE_MODE = 0o644  # read by the job's account, through the lease directory's 0711


def resources_write(path: Path, *, cpus: int, real_cpus: Sequence[int], mem_gb: float) -> None:
    """Write the resources file at `path` (never through a symlink, never half-written)."""
    data = {
        "cpus": int(cpus),
        "core_ids": [int(c) for c in real_cpus],
        "mem_gb": float(mem_gb),
        "changed_at": datetime.now(UTC).isoformat(),
    }
    tmp = path.with_name(path.name + ".tmp")
    tmp.unlink(missing_ok=True)
    fd = os.open(
        tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, RESOURCES_FILE_MODE
    )
    with os.fdopen(fd, "w") as fh:
        os.fchmod(fd, RESOURCES_FILE_MODE)  # whatever the umask
        json.dump(data, fh)
    os.replace(tmp, path)
