"""The queue: each pending job's position in the policy's order and its current estimate."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from django.utils import timezone

from cluster_app.models import Server
from cluster_app.selectors import SCHEDULABLE_STATES
from scheduler_app.conf import scheduler_conf
from scheduler_app.core.policies import POLICIES
from scheduler_app.models import Job, JobForecast, JobState
from scheduler_app.selectors.rounds import round_inputs


@dataclass(frozen=True)
class QueueEntry:
    """A pending job's 1-based place in the policy's order and its current estimate (None: unknown)."""

    position: int
    estimated_start_at: datetime | None
    estimated_finish_at: datetime | None = None


def job_queue(*, now: datetime | None = None) -> dict[int, QueueEntry]:
    """Queue position and current estimate of every PENDING job.

    Position: the current policy's order (conf.policy, the core's own ordering) over the pending jobs.
    The estimate is the stored forecast (JobForecast, services/forecasts.py): the one every page, the
    API and the command line show, refreshed after each round.
    """
    conf = scheduler_conf()
    now = now or timezone.now()
    pending = list(Job.objects.filter(state=JobState.PENDING).select_related("forecast"))
    if not pending:
        return {}
    servers = list(Server.objects.filter(state__in=SCHEDULABLE_STATES))
    inputs = round_inputs(servers=servers, jobs=pending)
    policy = POLICIES.get(conf.policy)()
    ordered = [view.job_id for view in policy.order(inputs.views, inputs.snapshot, now.timestamp())]
    # Jobs the round cannot place (no schedulable server fits them) go last, in submission order.
    ordered += [
        job.pk for job in sorted(pending, key=lambda j: (j.submitted_at, j.pk)) if job.pk not in inputs.jobs
    ]
    by_id = {job.pk: job for job in pending}
    result: dict[int, QueueEntry] = {}
    for position, job_id in enumerate(ordered, start=1):
        estimate = job_estimate(by_id[job_id])
        result[job_id] = QueueEntry(position, estimate.start_at, estimate.finish_at)
    return result


def job_estimate(job: Job) -> JobForecast:
    """The job's stored forecast, or an empty one (not forecast yet, or the job has ended)."""
    try:
        return job.forecast
    except JobForecast.DoesNotExist:
        return JobForecast(job=job, start_at=None, finish_at=None, detail="", computed_at=timezone.now())
