"""A job's moves, preemptions, requeues and GPU time lost to restarts (selectors/restarts.py), and the
cluster's GPU-hours lost per day."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from django.db import connection
from django.db.models import Q
from django.test.utils import CaptureQueriesContext

from scheduler_app.models import Job, JobState
from scheduler_app.selectors.restarts import (
    JobRestarts,
    job_restarts,
    jobs_with_restarts,
    restart_loss_by_day,
)
from scheduler_app.services.job_lifecycle import (
    job_event,
    job_events_record,
    job_interruption_events,
    transition_event,
)
from tests.factories import AllocationFactory, JobFactory, ServerFactory

pytestmark = pytest.mark.django_db

T0 = datetime(2026, 3, 2, 10, 0, tzinfo=UTC)


def lease(job: Job, at: datetime, *, gpus: int, startup_s: float | None, lost_work_s: float | None, **kw):
    return AllocationFactory(
        job=job, num_gpus=gpus, started_at=at, startup_s=startup_s, lost_work_s=lost_work_s, **kw
    )


def interrupt(job: Job, *, via: str, reason: str, to_state: str, at: datetime) -> None:
    job.state = JobState.RUNNING
    job_events_record(
        job_interruption_events(job, via=via, to_state=to_state, reason=reason, next_reason="", at=at)
    )


def moved_twice_and_preempted(t0: datetime = T0) -> Job:
    """The demo's 8-GPU job: started, moved (4 + 4 on two servers), moved again, preempted, restarted."""
    job = JobFactory(num_gpus=8, state=JobState.RUNNING)
    h = timedelta(hours=1)
    lease(job, t0, gpus=8, startup_s=40.0, lost_work_s=35.0, ended_at=t0 + h)  # first start: no start-up
    lease(job, t0 + h, gpus=4, startup_s=50.0, lost_work_s=15.0, ended_at=t0 + 2 * h)
    lease(job, t0 + h, gpus=4, startup_s=60.0, lost_work_s=15.0, ended_at=t0 + 2 * h)
    lease(job, t0 + 2 * h, gpus=8, startup_s=None, lost_work_s=100.0, ended_at=t0 + 3 * h)  # not measured
    lease(job, t0 + 26 * h, gpus=8, startup_s=30.0, lost_work_s=None)  # running, the next day
    interrupt(job, via=JobState.PREEMPTED, reason="moved", to_state=JobState.RUNNING, at=t0 + h)
    interrupt(job, via=JobState.PREEMPTED, reason="moved", to_state=JobState.RUNNING, at=t0 + 2 * h)
    interrupt(job, via=JobState.PREEMPTED, reason="priority", to_state=JobState.PENDING, at=t0 + 3 * h)
    return job


# 8 x 35 + 4 x 15 + 4 x 15 + 8 x 100 of work again; 4 x 50 + 4 x 60 + 8 x 30 of restarts' start-ups.
LOST_WORK_GPU_S = 8 * 35 + 4 * 15 + 4 * 15 + 8 * 100
STARTUP_GPU_S = 4 * 50 + 4 * 60 + 8 * 30


def test_a_jobs_moves_preemptions_and_gpu_time_lost():
    job = moved_twice_and_preempted()
    restarts = job_restarts(job)
    assert restarts == JobRestarts(
        moves=2, preemptions=1, requeues=0, resizes=0, gpu_s_lost=LOST_WORK_GPU_S + STARTUP_GPU_S
    )
    assert restarts.restarts == 3
    assert restarts.gpu_hours_lost == pytest.approx((LOST_WORK_GPU_S + STARTUP_GPU_S) / 3600)


def test_node_failures_and_agent_requeues_count_resizes_are_not_restarts():
    job = JobFactory(state=JobState.RUNNING)
    interrupt(job, via=JobState.NODE_FAIL, reason="node_down", to_state=JobState.PENDING, at=T0)
    job_events_record(
        [
            job_event(job, "resized", reason="cores", at=T0),
            # Requeued straight from RUNNING: its agent shut down.
            transition_event(job, JobState.RUNNING, JobState.PENDING, reason="agent_exit", at=T0),
        ]
    )
    restarts = job_restarts(job)
    assert (restarts.moves, restarts.preemptions, restarts.requeues, restarts.resizes) == (0, 0, 2, 1)
    assert restarts.restarts == 2
    # The requeued after a preemption or node failure is its second step, not another restart.
    assert job.events.filter(kind="requeued").count() == 2


def test_a_job_that_never_restarted_lost_nothing_even_with_a_measured_start_up():
    job = JobFactory(num_gpus=2, state=JobState.RUNNING)
    lease(job, T0, gpus=2, startup_s=45.0, lost_work_s=None)
    assert job_restarts(job) == JobRestarts(moves=0, preemptions=0, requeues=0, resizes=0, gpu_s_lost=0.0)
    assert job_restarts(JobFactory()).gpu_s_lost == 0.0  # no lease at all


def test_a_list_of_jobs_reads_every_jobs_restarts_in_one_query():
    jobs = [moved_twice_and_preempted() for _ in range(3)] + [JobFactory() for _ in range(3)]
    with CaptureQueriesContext(connection) as queries:
        rows = list(jobs_with_restarts(Job.objects.filter(pk__in=[j.pk for j in jobs]).order_by("pk")))
        restarts = [job_restarts(row) for row in rows]
    assert len(queries.captured_queries) == 1
    assert [r.moves for r in restarts] == [2, 2, 2, 0, 0, 0]
    assert [r.gpu_s_lost for r in restarts] == [LOST_WORK_GPU_S + STARTUP_GPU_S] * 3 + [0.0] * 3


def test_the_clusters_gpu_hours_lost_per_day(settings):
    settings.TIME_ZONE = "UTC"
    moved_twice_and_preempted()
    days = restart_loss_by_day(start=T0 - timedelta(days=1), end=T0 + timedelta(days=3))
    # Day 1: every lease's lost work (they ended that day) and the two moves' start-ups; day 2: the
    # restart after the preemption.
    assert [(d.day.isoformat(), round(d.gpu_hours * 3600, 6)) for d in days] == [
        ("2026-03-02", LOST_WORK_GPU_S + 4 * 50 + 4 * 60),
        ("2026-03-03", 8 * 30),
    ]
    # Only what lies in the window, and only the jobs asked for.
    next_day = restart_loss_by_day(start=T0 + timedelta(days=1), end=T0 + timedelta(days=2))
    assert [d.day.isoformat() for d in next_day] == ["2026-03-03"]
    assert restart_loss_by_day(start=T0, end=T0 + timedelta(days=3), jobs=Q(job__pk__in=[])) == []


def test_gpu_time_lost_on_fake_nodes_is_the_nodes_beside_their_usage(settings):
    """A lease's start-up and lost work are in its job's own time (docs/restarts.md); what the cluster
    lost is its server's: on the demo's fake nodes (time scale 0.05: jobs 20 times faster) a twentieth,
    as its GPU usage is wall time there too."""
    settings.TIME_ZONE = "UTC"
    job = moved_twice_and_preempted()
    job.allocations.update(server=ServerFactory(name="fake01", time_scale=0.05))
    assert job_restarts(job).gpu_s_lost == pytest.approx((LOST_WORK_GPU_S + STARTUP_GPU_S) * 0.05)
    days = restart_loss_by_day(start=T0 - timedelta(days=1), end=T0 + timedelta(days=3))
    assert [(d.day.isoformat(), round(d.gpu_hours * 3600, 6)) for d in days] == [
        ("2026-03-02", round((LOST_WORK_GPU_S + 4 * 50 + 4 * 60) * 0.05, 6)),
        ("2026-03-03", round(8 * 30 * 0.05, 6)),
    ]
