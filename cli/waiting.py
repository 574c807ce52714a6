"""`wait` and `submit --wait`: each job's state changes and progress until it ends (sbatch --wait)."""

from __future__ import annotations

import time
from datetime import datetime
from typing import Any, TextIO

from cli.api import Api

FINAL_STATES = frozenset({"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "OUT_OF_MEMORY", "NODE_FAIL"})


def _percent_done(job: dict[str, Any]) -> int | None:
    """Whole percent of the job's iterations done, rounded down (99.6% is not yet 100%); None when
    it has no total (an own command sized by its time limit)."""
    total = job.get("total_iters")
    if not total:
        return None
    return min(100, 100 * (job.get("done_iters") or 0) // total)


def _change_key(job: dict[str, Any]) -> tuple[Any, ...]:
    """What, when it changes, is worth a line: the state, a pending job's reason, the whole percent."""
    reason = job.get("pending_reason") if job["state"] == "PENDING" else None
    return job["state"], reason, _percent_done(job)


def _change_line(job: dict[str, Any], at: datetime) -> str:
    """ "14:02:31  job 42: RUNNING 37%", "job 42: PENDING (Resources)", "job 42: FAILED 37% (exit code 3)"."""
    text = f"{at:%H:%M:%S}  job {job['id']}: {job['state']}"
    percent = _percent_done(job)
    if percent is not None and (percent or job["state"] != "PENDING"):  # not a fresh job's 0%
        text += f" {percent}%"
    elif job.get("done_iters"):
        text += f" {job['done_iters']} iterations"
    if job["state"] == "PENDING" and job.get("pending_reason"):
        text += f" ({job['pending_reason']})"
    if job.get("exit_code"):
        text += f" (exit code {job['exit_code']})"
    return text


def end_reason(job: dict[str, Any]) -> str:
    """Why an ended job ended: the reason (and message) of its last change into its final state."""
    if job["state"] not in FINAL_STATES:
        return ""
    for event in reversed(job.get("events") or []):
        if event.get("to_state") == job["state"]:
            message = event.get("message") or ""
            return ": ".join(part for part in (event.get("reason") or "", message) if part)
    return ""


def wait(api: Api, job_ids: list[int], *, poll_s: float, out: TextIO) -> int:
    """Poll until every job has ended (sbatch --wait), printing a line whenever a job's state, reason
    or whole percent done changes, and why a job that did not complete ended. Exit 0 when all
    COMPLETED, else the first failed job's exit code (1 when it has none, e.g. cancelled)."""
    left = list(job_ids)
    seen: dict[int, tuple[Any, ...]] = {}
    status = 0
    while left:
        states = {job["id"]: job for job in api.jobs_by_id(left)}
        now = datetime.now()
        for job_id in list(left):
            job = states.get(job_id) or api.job(job_id)  # not listed: the detail call says why
            if seen.get(job_id) != _change_key(job):
                seen[job_id] = _change_key(job)
                out.write(_change_line(job, now) + "\n")
            if job["state"] not in FINAL_STATES:
                continue
            left.remove(job_id)
            code = job.get("exit_code")
            if job["state"] == "COMPLETED":
                continue
            if status == 0:
                status = code if isinstance(code, int) and 0 < code < 256 else 1
            # Why it ended, as `show` says it (a start that failed names the file or directory):
            # the list gives no events, so the job's own page is asked once, as it ends.
            why = end_reason(job if "events" in job else api.job(job_id))
            if why:
                out.write(f"  reason: {why}\n")
        out.flush()  # a pipe (tee, a log file) sees each change as it happens, not at the end
        if left:
            time.sleep(poll_s)
    return status
