"""The node's memory and storage read bandwidths, the inputs of the MinIO memory model (docs/profiling.md)."""

from __future__ import annotations

import contextlib
import logging
import os
import time
from pathlib import Path

log = logging.getLogger(__name__)

MB = 1024 * 1024


def memory_read_gbps(*, size_mb: int = 256, repeats: int = 3) -> float:
    """GB/s of one thread copying a buffer (best of `repeats`): what a cache hit costs per GB.

    The reference measures it per CPU count with a C benchmark; one thread's copy rate is the
    conservative figure, and its term in the model (cached GB / bandwidth) is small anyway.
    """
    src = bytearray(size_mb * MB)
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        dst = bytes(src)  # one memcpy of the whole buffer
        best = min(best, time.perf_counter() - t0)
        del dst
    return round(size_mb / 1024 / best, 2) if best > 0 else 0.0


def disk_read_mbps(directory: Path, *, size_mb: int = 128) -> float:
    """MB/s reading a file just written to `directory`, after asking the kernel to drop it from the page
    cache. Without O_DIRECT this is an estimate (a filesystem that ignores the advice reads from memory),
    so a node's configured `--storage-mbps` wins over it."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / ".attune-disk-probe"
    block = os.urandom(MB)  # incompressible, so a compressing filesystem cannot cheat
    try:
        with open(path, "wb") as fh:
            for _ in range(size_mb):
                fh.write(block)
            fh.flush()
            os.fsync(fh.fileno())
        fd = os.open(path, os.O_RDONLY)
        try:
            if hasattr(os, "posix_fadvise"):
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            t0 = time.perf_counter()
            while os.read(fd, 4 * MB):
                pass
            elapsed = time.perf_counter() - t0
        finally:
            os.close(fd)
    finally:
        with contextlib.suppress(OSError):
            path.unlink()
    return round(size_mb / elapsed, 1) if elapsed > 0 else 0.0


class NodeBandwidths:
    """Measured once, on first use (a profile command), and kept for the agent's life."""

    def __init__(self, *, work_dir: Path, storage_mbps: float = 0.0) -> None:
        self.work_dir = work_dir
        self.storage_mbps = storage_mbps
        self._values: dict[str, float] | None = None

    def get(self) -> dict[str, float]:
        if self._values is None:
            mem = memory_read_gbps()
            disk = self.storage_mbps if self.storage_mbps > 0 else disk_read_mbps(self.work_dir)
            self._values = {"mem_gbps": mem, "disk_mbps": disk}
            log.info(
                "node bandwidths: memory %.1f GB/s (measured), storage %.0f MB/s (%s)",
                mem,
                disk,
                "configured" if self.storage_mbps > 0 else "measured",
            )
        return self._values
