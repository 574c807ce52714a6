"""A submission queued behind the forecast's window: answered at once, without the forecasts worker.

A job with at least `forecast_window_jobs` pending jobs ahead of it gets nothing from a forecast but
"behind the window" and the window's last stored start; admission.py asks `behind_window` before
handing a submission to the worker. Ahead is counted here under a static order (FIFO), and for SWAF's
jobs without a QoS target in admission_tail.py.
"""

from __future__ import annotations

import time
from datetime import datetime
from functools import cache

from django.db import connection
from django.db.models import Max, Q
from django.utils import timezone

from infra.vendor import is_postgresql
from scheduler_app.conf import SchedulerConf
from scheduler_app.core.policies.swaf import SwafPolicy
from scheduler_app.models import TERMINAL_JOB_STATES, Job, JobForecast, JobState, PendingReason
from scheduler_app.services.admission_tail import swaf_ahead_at_least
from scheduler_app.services.forecasts import BEYOND_WINDOW


def behind_window(jobs: list[Job], conf: SchedulerConf) -> str | None:
    """What the forecasts worker would tell these just-submitted jobs (one, or an array's tasks) when
    they are queued behind the forecast's window, without reading the queue: BEYOND_WINDOW with the
    window's last stored start, as `live_forecast` says when every target is behind it; None when they
    may be inside it (the worker then forecasts them). Behind the window means, under a static order
    (FIFO: priority, then arrival), not held and not waiting for a dependency, at least
    `forecast_window_jobs` pending jobs ahead among those the forecast orders: one read that stops at
    the window's last job, whatever the queue's length."""
    window = conf.forecast_window_jobs
    if window <= 0 or any(job.held or job.pending_reason == PendingReason.DEPENDENCY for job in jobs):
        return None
    policy = conf.policy_obj()
    # The first of an array's tasks: the others come right after it (the same arrival, later ids).
    first = min(jobs, key=lambda job: (job.submitted_at, job.pk))
    if policy.static_order:
        ahead = pending_ahead_at_least(first, window)
    elif isinstance(policy, SwafPolicy) and is_postgresql():
        # SWAF's tail of jobs without a QoS target (admission_tail.py): a lower bound of those ahead.
        ahead = swaf_ahead_at_least(first, window, policy, submitted=jobs)
    else:
        return None
    if not ahead:
        return None
    return behind_window_detail(window, window_last_start())


def pending_ahead_at_least(job: Job, count: int) -> bool:
    """Whether at least `count` pending jobs come before `job` in FIFO's order (higher priority, or
    the same and submitted before it) among those a forecast orders: not held, and none waiting for
    a dependency that ended without completing (selectors.dependency_pending_reason). One statement
    that stops at the count-th; on PostgreSQL written out, since the ORM's building of it cost more
    CPU than the database's reading of a thousand rows."""
    never = [state for state in TERMINAL_JOB_STATES if state != JobState.COMPLETED]
    if not is_postgresql():
        same = Q(priority=job.priority)
        ahead = (
            Job.objects.filter(state=JobState.PENDING, held=False)
            .filter(
                Q(priority__gt=job.priority)
                | same & Q(submitted_at__lt=job.submitted_at)
                | same & Q(submitted_at=job.submitted_at, pk__lt=job.pk)
            )
            .exclude(depends_on__state__in=never)
            .order_by()
        )
        return bool(ahead.values_list("pk", flat=True)[count - 1 : count])
    with connection.cursor() as cursor:
        cursor.execute(
            _ahead_sql(),
            {
                "priority": job.priority,
                "at": job.submitted_at,
                "id": job.pk,
                "never": never,
                "offset": count - 1,
                "limit": count,
            },
        )
        return cursor.fetchone() is not None


@cache
def _ahead_sql() -> str:
    """FIFO's jobs ahead in two disjoint ranges of migration 0026's partial indexes on the pending jobs:
    a higher priority, then the same priority submitted before, read in arrival order (at most `count`:
    an index scan that stops there); their predicates written out, not parameters, so that a prepared
    statement's generic plan uses them too. The finished jobs are never read."""
    jobs, after = Job._meta.db_table, Job.depends_on.through._meta.db_table
    pending = (
        f"j.state = '{JobState.PENDING}' AND NOT j.held "
        f"AND NOT EXISTS (SELECT 1 FROM {after} x JOIN {jobs} d ON d.id = x.to_job_id "
        "WHERE x.from_job_id = j.id AND d.state = ANY(%(never)s))"
    )
    return (
        f"SELECT 1 FROM (SELECT j.id FROM {jobs} j WHERE {pending} AND j.priority > %(priority)s "
        f"UNION ALL (SELECT j.id FROM {jobs} j WHERE {pending} AND j.priority = %(priority)s "
        "AND (j.submitted_at, j.id) < (%(at)s, %(id)s) ORDER BY j.submitted_at, j.id LIMIT %(limit)s)) a "
        "OFFSET %(offset)s LIMIT 1"
    )


def behind_window_detail(window: int, last_start: datetime | None) -> str:
    """The detail of a job queued behind the forecast's window (services/forecasts.py's words)."""
    after = f"at {timezone.localtime(last_start):%Y-%m-%d %H:%M}" if last_start else "beyond the forecast"
    return BEYOND_WINDOW.format(window=window, after=after)


# The window's last stored start, per process: (monotonic time it was read, the start). A submission
# behind the window reads it at most every WINDOW_START_REUSE_S (the refresh that changes it runs at
# most every 10 s); the aggregate reads every pending job's forecast.
WINDOW_START_REUSE_S = 2.0
_window_start: tuple[float, datetime | None] | None = None


def window_last_start() -> datetime | None:
    """The latest start the stored forecast gives a pending job (the last of its window's), read at
    most every WINDOW_START_REUSE_S seconds by a process."""
    global _window_start
    now = time.monotonic()
    if _window_start is None or not 0 <= now - _window_start[0] < WINDOW_START_REUSE_S:
        rows = JobForecast.objects.filter(job__state=JobState.PENDING, start_at__isnull=False)
        _window_start = (now, rows.aggregate(latest=Max("start_at"))["latest"])
    return _window_start[1]


def window_last_start_forget() -> None:
    """Read the window's last start again at the next submission behind it (tests, a new forecast)."""
    global _window_start
    _window_start = None
