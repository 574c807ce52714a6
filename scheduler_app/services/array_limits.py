"""Round hook: an array's tasks past its limit on tasks running at once (--array 0-99%4) wait out of
the round, with the pending reason JobArrayTaskLimit, as Slurm's ArrayTaskThrottle makes them wait."""

from __future__ import annotations

from collections.abc import Collection, Sequence

from scheduler_app.core.array_limits import tasks_past_limit
from scheduler_app.models import JobState, PendingReason
from scheduler_app.selectors import JobLike, live_array_limits
from scheduler_app.services.pending_reasons import pending_reasons_mark


def array_limits_hold(*, jobs: Sequence[JobLike], held_otherwise: Collection[int]) -> set[int]:
    """The ids of the PENDING tasks among `jobs` to leave out of this round: per array with a limit,
    its running tasks fill the limit first, then its other pending tasks here, lowest index first
    (those in `held_otherwise`, waiting for a dependency, take no place). Each gets the pending
    reason JobArrayTaskLimit; a task the limit lets in gets the round's own reason."""
    limits = live_array_limits()
    if not limits:
        return set()
    running = {job.pk for job in jobs if job.state == JobState.RUNNING}
    candidates = [job.pk for job in jobs if job.state == JobState.PENDING and job.pk not in held_otherwise]
    past = tasks_past_limit(limits, candidates, running)
    pending_reasons_mark((job for job in jobs if job.pk in past), PendingReason.ARRAY_TASK_LIMIT)
    return past
