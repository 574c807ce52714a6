"""What a restart costs a job as the service knows it: its checkpoint interval, its start-up and the work
a lease ended by a restart loses (core/restarts.py's rule, applied to rows)."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime

from django.db.models import OuterRef, Subquery

from scheduler_app.core.restarts import run_lost_s
from scheduler_app.models import Allocation


def checkpoint_every_s_of(
    *, job_checkpoint_every_s: float | None, workload_checkpoint_every_s: float | None
) -> float | None:
    """How often a job checkpoints: what it declared (--checkpoint-every), else its catalog workload's
    profile; None (an own command that declared nothing): never, a restart redoes its whole lease."""
    return job_checkpoint_every_s or workload_checkpoint_every_s or None


def lease_run_started_at(*, started_at: datetime, agent_started_at: datetime | None) -> datetime:
    """When a lease's run began: its agent's `started` report, else when the round created it."""
    return agent_started_at or started_at


def own_seconds(wall_s: float, time_scale: float | None) -> float:
    """`wall_s` seconds of a lease's run in its job's own time, the clock of its profile and start-up:
    a fake node (--time-scale 0.05) runs 20 of them each wall second; a real node, one."""
    return wall_s / (time_scale or 1.0)


def lease_lost_work_s(
    *,
    started_at: datetime,
    agent_started_at: datetime | None,
    ended_at: datetime,
    checkpoint_every_s: float | None,
    time_scale: float | None = 1.0,
) -> float:
    """Seconds of a lease's run that its job does again after a restart ended it at `ended_at`:
    core.restarts.run_lost_s (the run since the last checkpoint, or all of it without checkpoints).
    In the job's own time, like its start-up and profile: a fake node's wall seconds over its scale."""
    start = lease_run_started_at(started_at=started_at, agent_started_at=agent_started_at)
    run_s = own_seconds(max(0.0, (max(ended_at, started_at) - start).total_seconds()), time_scale)
    return run_lost_s(run_s, checkpoint_every_s)


def leases_lost_work_s(*, job_ids: Iterable[int], ended_at: datetime) -> dict[int, float]:
    """Active lease id -> the work it loses if a restart ends it at `ended_at`, for every active lease of
    `job_ids`: one query (the lease's start, its job's and its workload's checkpoint intervals)."""
    rows = Allocation.objects.filter(job_id__in=list(job_ids), ended_at__isnull=True).values_list(
        "id",
        "started_at",
        "agent_started_at",
        "job__checkpoint_every_s",
        "job__workload__checkpoint_every_s",
        "server__time_scale",
    )
    return {
        lease_id: lease_lost_work_s(
            started_at=started_at,
            agent_started_at=agent_started_at,
            ended_at=ended_at,
            checkpoint_every_s=checkpoint_every_s_of(
                job_checkpoint_every_s=job_every, workload_checkpoint_every_s=workload_every
            ),
            time_scale=time_scale,
        )
        for lease_id, started_at, agent_started_at, job_every, workload_every, time_scale in rows
    }


def last_lease_startup_s() -> Subquery:
    """For a Job queryset's annotate: the measured start-up of the job's latest lease that measured one
    (None: none did). Reads the job's leases through their job_id index."""
    measured = Allocation.objects.filter(job_id=OuterRef("pk"), startup_s__isnull=False).order_by(
        "-started_at"
    )
    return Subquery(measured.values("startup_s")[:1])
