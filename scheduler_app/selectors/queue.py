"""The queue: each pending job's position in the policy's order and its current estimate."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime

from django.utils import timezone

from scheduler_app.models import Job, JobForecast, JobState


@dataclass(frozen=True)
class QueueEntry:
    """A pending job's 1-based place in the policy's order and its current estimate (None: unknown;
    a position is unknown for a job submitted since the last round)."""

    position: int | None
    estimated_start_at: datetime | None
    estimated_finish_at: datetime | None = None


def job_queue(*, job_ids: Iterable[int] | None = None) -> dict[int, QueueEntry]:
    """Queue position and current estimate of every PENDING job (or of those among `job_ids`).

    Both are what the last round stored (JobForecast, services/forecasts.py: the policy's order over
    the pending jobs and the one forecast every page, the API and the command line show), read in one
    query without building a model per job: a queue can hold tens of thousands.
    """
    rows = JobForecast.objects.filter(job__state=JobState.PENDING)
    if job_ids is not None:
        rows = rows.filter(job_id__in=list(job_ids))
    return {
        job_id: QueueEntry(position, start_at, finish_at)
        for job_id, position, start_at, finish_at in rows.values_list(
            "job_id", "position", "start_at", "finish_at"
        )
    }


def job_queue_of(job: Job) -> dict[int, QueueEntry]:
    """job_queue(job_ids=[job.pk]) from the job as read with its forecast (job_list's select_related):
    the same row's state and forecast, no query of its own."""
    if job.state != JobState.PENDING:
        return {}
    try:
        forecast = job.forecast
    except JobForecast.DoesNotExist:
        return {}
    return {job.pk: QueueEntry(forecast.position, forecast.start_at, forecast.finish_at)}


def job_forecast_row(job: Job) -> JobForecast | None:
    """The job's stored forecast row as read with it (select_related), or None (none stored)."""
    try:
        return job.forecast
    except JobForecast.DoesNotExist:
        return None


def job_estimate(job: Job) -> JobForecast:
    """The job's stored forecast, or an empty one (not forecast yet, or the job has ended), by id: an
    empty one built with `job=` would be cached as the job's `forecast`, read later as if stored."""
    row = job_forecast_row(job)
    if row is not None:
        return row
    return JobForecast(job_id=job.pk, start_at=None, finish_at=None, detail="", computed_at=timezone.now())
