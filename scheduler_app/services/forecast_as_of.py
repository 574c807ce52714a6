"""As of when a stored estimate holds: the last finished refresh (one row), or its own row's change.

A worker's refresh cycle spans several round intervals on a deep queue (23 to 27 at 10,000 live
jobs: docs/performance.md), so an estimate shown can be some 25 minutes old. Slurm shows when the
scheduler last looked at a job (`scontrol show job`'s LastSchedEval); here every estimate shown says
as of when it holds. Rewriting every unchanged row's `computed_at` at each cycle's end would cost a
10,000-row write per cycle; instead the end of a cycle is one row (ForecastConfirmation), and a job's
estimate holds as of the later of that and its row's `computed_at` (the cycle's part or the admission
forecast that last changed it, stamped with that forecast's `now`).
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime

from django.db import connection, transaction

from infra.vendor import is_postgresql
from scheduler_app.models import Job, JobForecast, JobState
from scheduler_app.models.predictions import ForecastConfirmation
from scheduler_app.selectors.queue import job_forecast_row

ROW_ID = 1


def forecast_confirm(at: datetime) -> None:
    """Record that the whole stored forecast held at `at` (a finished refresh's `now`): never moved
    back (a slower refresh that started earlier and ended later confirms nothing newer). Call in the
    transaction that stores the refresh's last estimates, so that both commit or neither."""
    with transaction.atomic():
        ForecastConfirmation.objects.bulk_create(
            [ForecastConfirmation(id=ROW_ID, confirmed_at=at)], ignore_conflicts=True
        )
        ForecastConfirmation.objects.filter(id=ROW_ID, confirmed_at__lt=at).update(confirmed_at=at)


def forecast_confirmed_at() -> datetime | None:
    """When the last finished refresh's forecast was made (None: none has finished yet). Read by every
    job page and job API response: on PostgreSQL one statement without the ORM's queryset (80 to 90 us
    of the web process's CPU against 480 to 620 through values_list().first(), in-process at load 7)."""
    if not is_postgresql():
        return ForecastConfirmation.objects.filter(id=ROW_ID).values_list("confirmed_at", flat=True).first()
    table = connection.ops.quote_name(ForecastConfirmation._meta.db_table)
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT confirmed_at FROM {table} WHERE id = %s", [ROW_ID])
        row = cursor.fetchone()
    return row[0] if row else None


def estimate_as_of(row: JobForecast | None, confirmed_at: datetime | None) -> datetime | None:
    """As of when a stored estimate (`row`) holds: the later of when it last changed and the last
    finished refresh (`confirmed_at`); None without a stored row (no estimate yet)."""
    if row is None or row.computed_at is None:
        return None
    if confirmed_at is None:
        return row.computed_at
    return max(row.computed_at, confirmed_at)


def job_estimate_as_of(
    job: Job, confirmed_at: Callable[[], datetime | None] = forecast_confirmed_at
) -> datetime | None:
    """As of when a live job's shown estimate holds (None: it has ended, or has no estimate yet);
    `confirmed_at` is read only for a job with a stored estimate."""
    if job.state not in (JobState.PENDING, JobState.RUNNING):
        return None
    row = job_forecast_row(job)
    return estimate_as_of(row, confirmed_at()) if row is not None else None
