"""What restarts cost a job and the cluster: its moves, preemptions and requeues (from its history), its
resizes in place, and the GPU time lost to restarts (from its leases' start-ups and lost work)."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from datetime import date, datetime
from typing import Any

from django.db.models import (
    Case,
    Count,
    Exists,
    F,
    FloatField,
    IntegerField,
    OuterRef,
    Q,
    QuerySet,
    Subquery,
    Sum,
    Value,
    When,
)
from django.db.models.functions import Coalesce, TruncDate
from django.utils import timezone

from scheduler_app.models import Allocation, Job, JobEvent, JobState

# The reason a round writes on the `preempted` event of a job it places elsewhere at once (round_apply).
MOVED_REASON = "moved"
# A change of a running job's cores or memory made without a restart (its own event kind).
RESIZED_KIND = "resized"

# The annotations jobs_with_restarts adds, each an event count, and the GPU-seconds lost.
_COUNTS: dict[str, Q] = {
    # A round took its resources and placed it elsewhere in the same round.
    "restart_moves": Q(kind="preempted", reason=MOVED_REASON),
    # A round took its resources and left it waiting.
    "restart_preemptions": Q(kind="preempted") & ~Q(reason=MOVED_REASON),
    # Stopped by no fault of its own and back to the queue: a server lost, or its agent shut down.
    "restart_requeues": Q(kind="node_fail") | Q(kind="requeued", from_state=JobState.RUNNING),
    "restart_resizes": Q(kind=RESIZED_KIND),
}


@dataclass(frozen=True)
class JobRestarts:
    """A job's restarts: moves, preemptions, requeues (node failure, agent shutdown), resizes in place
    (no restart), and the GPU-seconds they lost (start-ups after the first, plus work done again)."""

    moves: int
    preemptions: int
    requeues: int
    resizes: int
    gpu_s_lost: float

    @property
    def restarts(self) -> int:
        """Times the job was stopped to run again (a resize in place is not one)."""
        return self.moves + self.preemptions + self.requeues

    @property
    def gpu_hours_lost(self) -> float:
        return self.gpu_s_lost / 3600


@dataclass(frozen=True)
class RestartLossDay:
    """The cluster's GPU-hours lost to restarts on one day (the service's time zone)."""

    day: date
    gpu_hours: float


def _restart_lease() -> Exists:
    """Whether the lease being read was not its job's first start (an earlier lease exists): a job
    spread over servers starts all its parts of a round at the same instant, so they are all first."""
    return Exists(Allocation.objects.filter(job=OuterRef("job"), started_at__lt=OuterRef("started_at")))


def _wall_gpu_s(own_s: Any) -> Any:
    """A lease's seconds in its job's own time (start-up, lost work: docs/restarts.md) as GPU-seconds
    of the cluster's, beside its usage: times its server's time scale (1 on a real node; a fake node
    runs a job 20 times faster at 0.05, so an hour of the job's is 3 minutes of the node's)."""
    return F("num_gpus") * Coalesce(own_s, Value(0.0)) * F("server__time_scale")


def _restart_startup_gpu_s() -> Case:
    """A lease's GPU-seconds of start-up, counted only when it restarted the job."""
    return Case(
        When(_restart_lease(), then=_wall_gpu_s(F("startup_s"))),
        default=Value(0.0),
        output_field=FloatField(),
    )


def _lost_work_gpu_s() -> Any:
    """A lease's GPU-seconds of work to do again, once a restart ended it."""
    return _wall_gpu_s(F("lost_work_s"))


def jobs_with_restarts(jobs: QuerySet[Job]) -> QuerySet[Job]:
    """`jobs` annotated with their restart counts and GPU-seconds lost (job_restarts reads them): one
    correlated subquery each, in the list's own query, so a page of any length costs one query."""
    annotations: dict[str, Any] = {}
    for name, condition in _COUNTS.items():
        rows = (
            JobEvent.objects.filter(condition, job=OuterRef("pk"))
            .order_by()
            .values("job")
            .annotate(n=Count("id"))
            .values("n")
        )
        annotations[name] = Coalesce(Subquery(rows, output_field=IntegerField()), Value(0))
    lost = (
        Allocation.objects.filter(job=OuterRef("pk"))
        .order_by()
        .values("job")
        .annotate(s=Sum(_lost_work_gpu_s() + _restart_startup_gpu_s(), output_field=FloatField()))
        .values("s")
    )
    annotations["restart_gpu_s_lost"] = Coalesce(Subquery(lost, output_field=FloatField()), Value(0.0))
    return jobs.annotate(**annotations)


def job_restarts_none(job: Job) -> None:
    """Give `job` jobs_with_restarts' annotations, all none, without their query: for a job its caller
    knows has never had a lease nor a restart event (each count is of such events, the loss of leases)."""
    for name in _COUNTS:
        setattr(job, name, 0)
    job.restart_gpu_s_lost = 0.0


def job_restarts(job: Job) -> JobRestarts:
    """The job's restarts, from jobs_with_restarts' annotations (read for this job alone when its row
    came without them)."""
    if not hasattr(job, "restart_gpu_s_lost"):
        job = jobs_with_restarts(Job.objects.filter(pk=job.pk)).get()
    return JobRestarts(
        moves=job.restart_moves,
        preemptions=job.restart_preemptions,
        requeues=job.restart_requeues,
        resizes=job.restart_resizes,
        gpu_s_lost=float(job.restart_gpu_s_lost),
    )


def restart_loss_by_day(*, start: datetime, end: datetime, jobs: Q | None = None) -> list[RestartLossDay]:
    """The GPU-hours lost to restarts on each day of [start, end) that lost any, oldest first: a lease's
    work done again on the day the restart ended it, a restart's start-up on the day it started.
    `jobs` scopes the leases (a condition on their job, prefix `job__`). One statement (a UNION ALL of
    two grouped queries)."""
    scope = jobs or Q()
    tz = timezone.get_current_timezone()
    ended = (
        Allocation.objects.filter(scope, ended_at__gte=start, ended_at__lt=end, lost_work_s__gt=0)
        .annotate(day=TruncDate("ended_at", tzinfo=tz))
        .values("day")
        .annotate(gpu_s=Sum(_lost_work_gpu_s(), output_field=FloatField()))
        .order_by()
    )
    restarted = (
        Allocation.objects.filter(scope, started_at__gte=start, started_at__lt=end, startup_s__gt=0)
        .filter(_restart_lease())
        .annotate(day=TruncDate("started_at", tzinfo=tz))
        .values("day")
        .annotate(gpu_s=Sum(_wall_gpu_s(F("startup_s")), output_field=FloatField()))
        .order_by()
    )
    by_day: dict[date, float] = defaultdict(float)
    for row in ended.union(restarted, all=True):
        by_day[row["day"]] += row["gpu_s"] or 0.0
    return [RestartLossDay(day=day, gpu_hours=gpu_s / 3600) for day, gpu_s in sorted(by_day.items())]
