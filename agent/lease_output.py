"""What a running lease tells the service: new lines of its output files and its progress, spooled as
`log` and `progress` reports (the syncer ships them)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from agent.accounts import job_file_size, read_job_file
from agent.launch_spec import LaunchSpec
from agent.lease_state import Lease
from agent.spool import Spool

MAX_LOG_BYTES_PER_READ = 256 * 1024
MAX_LOG_LINES_PER_REPORT = 500
MAX_LOG_LINE_CHARS = 2000


def output_offsets_at_launch(spec: LaunchSpec) -> dict[str, int]:
    """Where shipping starts in each of the job's own output files: their size before the lease's process
    starts. The shim appends to them, so a file that a moved, preempted or requeued job reopens already
    holds its earlier runs' output, which their leases shipped; read from 0, a new lease would ship it
    again and the job's log would repeat those lines. The shim's log is the lease's own (offset 0)."""
    return {str(path): job_file_size(path, spec.job_uid) or 0 for path in spec.job_output_files}


def logs_spool(lease: Lease, spool: Spool, *, final: bool) -> bool:
    """Spool new lines of the shim's log (start errors, and the job's output unless it names files) and
    of the job's own stdout/stderr files as `log` reports; True when an offset moved (save the lease's
    record then, after the reports: a crash in between re-ships lines, it never loses them)."""
    shipped = _file_spool(lease, spool, lease.spec.log_path, None, final=final)
    for path in lease.spec.job_output_files:
        shipped |= _file_spool(lease, spool, path, lease.spec.job_uid, final=final)
    return shipped


def _file_spool(lease: Lease, spool: Spool, path: Path, owner_uid: int | None, *, final: bool) -> bool:
    """Spool one `log` report of the file's new complete lines; True when the offset moved."""
    key = str(path)
    offset = lease.log_offsets.get(key, 0)
    size = job_file_size(path, owner_uid)
    if size is None:
        return False
    if size < offset:
        offset = 0  # truncated or replaced (the job's owner may do either): read it from the start
    skipped_bytes = 0
    if size - offset > 4 * MAX_LOG_BYTES_PER_READ or (final and size - offset > MAX_LOG_BYTES_PER_READ):
        # A job printing faster than we ship: keep the newest output (the service keeps a tail anyway).
        skipped_bytes = size - MAX_LOG_BYTES_PER_READ - offset
        offset = size - MAX_LOG_BYTES_PER_READ
    if size <= offset:
        return False
    try:
        chunk = read_job_file(path, owner_uid, offset=offset, max_bytes=MAX_LOG_BYTES_PER_READ)
    except OSError:
        return False
    if not final:
        end = chunk.rfind(b"\n")
        if end < 0 and len(chunk) < MAX_LOG_BYTES_PER_READ:
            return False  # wait for the rest of the line
        chunk = chunk[: end + 1] if end >= 0 else chunk
    lines = [line[:MAX_LOG_LINE_CHARS] for line in chunk.decode(errors="replace").splitlines()]
    if skipped_bytes:
        lines.insert(0, f"[attune-agent: {skipped_bytes} bytes of output skipped]")
    if len(lines) > MAX_LOG_LINES_PER_REPORT:
        dropped = len(lines) - MAX_LOG_LINES_PER_REPORT
        lines = [f"[attune-agent: {dropped} lines skipped]", *lines[-MAX_LOG_LINES_PER_REPORT:]]
    lease.log_offsets[key] = offset + len(chunk)
    if lines:
        spool.append(lease.lease_id, "log", {"lines": lines})
    return True


def progress_spool(lease: Lease, spool: Spool) -> bool:
    """Spool a `progress` report when the job's progress file says more than the last one; True if so."""
    try:
        # Written atomically by the workload; read like any file the job's account controls.
        data = json.loads(read_job_file(lease.spec.progress_path, lease.spec.job_uid, max_bytes=65536))
        done_iters = int(data["done_iters"])
        iters_per_s = float(data.get("iters_per_s") or 0.0)
    except (OSError, ValueError, KeyError, TypeError):
        return False
    if done_iters == lease.done_iters:
        return False
    lease.done_iters, lease.iters_per_s = done_iters, iters_per_s
    report: dict[str, Any] = {"done_iters": done_iters, "iters_per_s": iters_per_s}
    if lease.startup_pending and lease.launched_at is not None:
        # The first progress: the lease's start-up (process, CUDA/NCCL set-up, data loaders), once.
        lease.startup_s = max(0.0, time.time() - lease.launched_at)
        report["startup_s"] = round(lease.startup_s, 3)
    if lease.spec.time_scale != 1.0:
        # A fake node runs synthetic jobs faster: the service compares speeds in the job's own time.
        report["time_scale"] = lease.spec.time_scale
    spool.append(lease.lease_id, "progress", report)
    return True
