"""The round hooks' one way of giving the PENDING jobs they hold out of a round their pending reason."""

from __future__ import annotations

from collections.abc import Iterable

from scheduler_app.models import Job, JobState
from scheduler_app.selectors import JobLike


def pending_reasons_mark(jobs: Iterable[JobLike], reason: str) -> list[JobLike]:
    """Give `jobs`, PENDING and held out of this round, the pending reason `reason`. Those that had
    another change in memory and in one statement, and are returned: the events are the caller's."""
    changed = [job for job in jobs if job.pending_reason != reason]
    for job in changed:
        job.pending_reason = reason
    if changed:
        # The round has not locked these rows: a job cancelled or started meanwhile is left as it is.
        Job.objects.filter(pk__in=[job.pk for job in changed], state=JobState.PENDING).update(
            pending_reason=reason
        )
    return changed
