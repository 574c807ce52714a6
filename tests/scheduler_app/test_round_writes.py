"""A round's bulk writes: exactly the planned rows change, unchanged jobs are not rewritten, and a
cancel that races a round waits for it and wins (the round reads its jobs as rows, locked)."""

import threading
import uuid

import pytest
from django.db import connection
from django.utils import timezone

from infra.bulk_sql import model_rows_insert
from scheduler_app.models import (
    Allocation,
    AllocationGpu,
    Job,
    JobEvent,
    JobState,
    PendingReason,
    RoundDecision,
)
from scheduler_app.services import rounds
from scheduler_app.services.job_control import job_cancel, job_finish
from scheduler_app.services.job_lifecycle import jobs_transition_bulk
from scheduler_app.services.rounds import scheduling_round_run
from tests.api.helpers import active, lease_of, make_server, submit
from tests.factories import AllocationFactory, hold_gpus

pytestmark = pytest.mark.django_db

postgresql_only = pytest.mark.skipif(
    connection.vendor != "postgresql", reason="row versions (xmin) and row locks are PostgreSQL's"
)


def row_versions(*jobs: Job) -> dict[int, int]:
    """Job id -> its row's xmin: a write of the row (even of the same values) makes a new version,
    a row lock does not."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT id, xmin::text::bigint FROM scheduler_app_job WHERE id = ANY(%s)", [[j.pk for j in jobs]]
        )
        return dict(cursor.fetchall())


def job_row(job: Job) -> tuple:
    return Job.objects.filter(pk=job.pk).values_list("state", "pending_reason", "started_at").get()


@postgresql_only
def test_a_round_writes_only_the_jobs_whose_state_or_reason_changes(user, fifo_tune):
    make_server("n1")
    running = submit(user, gpus=2, name="running")
    scheduling_round_run()
    placed = submit(user, gpus=1, name="placed")
    waiting = submit(user, gpus=8, name="waiting")  # 5 GPUs free at most: waits
    waiting_reason = job_row(waiting)[1]
    before = row_versions(running, placed, waiting)

    scheduling_round_run()

    after = row_versions(running, placed, waiting)
    assert after[running.pk] == before[running.pk]  # its lease continues: not written
    assert after[placed.pk] != before[placed.pk]
    assert job_row(placed)[:2] == (JobState.RUNNING, PendingReason.NONE)
    state, reason, _ = job_row(waiting)
    assert state == JobState.PENDING and reason == PendingReason.RESOURCES
    assert (after[waiting.pk] != before[waiting.pk]) == (reason != waiting_reason)

    sround = scheduling_round_run()  # nothing changed: no job row is written, every decision stored

    assert row_versions(running, placed, waiting) == after
    assert RoundDecision.objects.filter(round=sround).count() == 3


@postgresql_only
def test_a_moved_job_gets_its_new_lease_and_events_but_its_row_is_not_rewritten(user, fifo_tune, settings):
    # Restart costs off: the subject is the writes of a move (the guard would keep a lease this young).
    settings.ATTUNE_SCHEDULER = {**settings.ATTUNE_SCHEDULER, "restart_costs": False}
    server = make_server("n1")
    job = submit(user, gpus=1)
    # Running on GPU 5 with a share the allocator would never choose: the round moves it.
    stale = AllocationFactory(job=job, server=server, num_cpus=1, mem_gb=10.0)
    hold_gpus(stale, server.gpus.get(index=5))
    Job.objects.filter(pk=job.pk).update(
        state=JobState.RUNNING, pending_reason=PendingReason.NONE, started_at=timezone.now()
    )
    before = row_versions(job)

    sround = scheduling_round_run()

    assert sround.num_preempted == 1 and lease_of(job).pk != stale.pk
    assert row_versions(job) == before  # RUNNING before and after: nothing to write
    assert list(JobEvent.objects.filter(job=job).order_by("id").values_list("kind", flat=True))[-2:] == [
        "preempted",
        "rescheduled",
    ]


def test_jobs_transition_bulk_writes_exactly_the_given_changes(user):
    earlier = timezone.now() - timezone.timedelta(hours=1)
    now = timezone.now()
    starts = submit(user, name="starts")
    requeued = submit(user, name="requeued")
    Job.objects.filter(pk=requeued.pk).update(state=JobState.RUNNING, started_at=earlier)
    restarts = submit(user, name="restarts")
    Job.objects.filter(pk=restarts.pk).update(started_at=earlier)  # ran before: keeps its first start
    reason_only = submit(user, name="reason-only")
    untouched = submit(user, name="untouched")
    untouched_row = job_row(untouched)
    before = row_versions(untouched) if connection.vendor == "postgresql" else {}

    jobs_transition_bulk(
        {
            starts.pk: (JobState.PENDING, JobState.RUNNING, PendingReason.NONE),
            requeued.pk: (JobState.RUNNING, JobState.PENDING, PendingReason.RESOURCES),
            restarts.pk: (JobState.PENDING, JobState.RUNNING, PendingReason.NONE),
            reason_only.pk: (JobState.PENDING, JobState.PENDING, PendingReason.PRIORITY),
        },
        now=now,
    )

    assert job_row(starts) == (JobState.RUNNING, PendingReason.NONE, now)
    assert job_row(requeued) == (JobState.PENDING, PendingReason.RESOURCES, earlier)
    assert job_row(restarts) == (JobState.RUNNING, PendingReason.NONE, earlier)
    assert job_row(reason_only)[:2] == (JobState.PENDING, PendingReason.PRIORITY)
    assert job_row(untouched) == untouched_row
    if before:
        assert row_versions(untouched) == before


def test_model_rows_insert_stores_each_row_with_its_id_and_the_fields_defaults(user):
    make_server("n1")
    jobs = [submit(user, name=f"j{i}") for i in range(3)]
    at = timezone.now()
    ids = model_rows_insert(
        JobEvent,
        [
            {
                "job_id": job.pk,
                "kind": f"kind-{i}",
                "at": at,
                "data": {"round": i, "placement": [{"gpus": [i]}]},
            }
            for i, job in enumerate(jobs)
        ],
    )
    assert len(ids) == 3
    for i, (event_id, job) in enumerate(zip(ids, jobs, strict=True)):
        event = JobEvent.objects.get(pk=event_id)
        assert (event.job_id, event.kind, event.at) == (job.pk, f"kind-{i}", at)
        assert event.data == {"round": i, "placement": [{"gpus": [i]}]}
        assert (event.message, event.reason, event.from_state) == ("", "", "")

    server_id = make_server("n2").pk
    rows = [
        {
            "job_id": job.pk,
            "server_id": server_id,
            "num_gpus": 1,
            "num_cpus": 2 + i,
            "mem_gb": 10.0,
            "started_at": at,
        }
        for i, job in enumerate(jobs)
    ]
    ids = model_rows_insert(Allocation, rows)
    leases = [Allocation.objects.get(pk=pk) for pk in ids]
    assert [(a.job_id, a.num_cpus) for a in leases] == [(job.pk, 2 + i) for i, job in enumerate(jobs)]
    assert len({a.lease_id for a in leases}) == 3 and all(isinstance(a.lease_id, uuid.UUID) for a in leases)
    assert all(a.ended_at is None and a.log_tail == "" and a.speedup == 1.0 for a in leases)


def _in_thread(results: dict, name: str, call, done: threading.Event | None = None) -> threading.Thread:
    def run():
        try:
            results[name] = call()
        finally:
            if done is not None:
                done.set()
            connection.close()  # this thread's own database connection

    thread = threading.Thread(target=run)
    thread.start()
    return thread


@postgresql_only
@pytest.mark.django_db(transaction=True)
def test_a_cancel_while_a_round_computes_goes_through_and_the_round_skips_the_job(
    user, fifo_tune, monkeypatch
):
    """The round reads the queue without locking it: a cancel while it computes does not wait for it,
    and the round, reading the rows it writes again under their locks, leaves the cancelled job alone."""
    make_server("n1")
    job = submit(user, gpus=1)
    inside, release, cancelled = threading.Event(), threading.Event(), threading.Event()
    real = rounds.schedule_round

    def paused_schedule_round(*args, **kwargs):
        inside.set()
        assert release.wait(10)
        return real(*args, **kwargs)

    monkeypatch.setattr(rounds, "schedule_round", paused_schedule_round)
    results = {}
    round_thread = _in_thread(results, "round", lambda: scheduling_round_run(trigger="racing"))
    try:
        assert inside.wait(10)
        _in_thread(results, "cancel", lambda: job_cancel(job=job), cancelled).join(10)
        assert cancelled.is_set() and not release.is_set()  # it did not wait for the round
    finally:
        release.set()
        round_thread.join(10)

    assert results["round"].num_placed == 0  # the plan placed it; the round skipped it
    job.refresh_from_db()
    assert job.state == JobState.CANCELLED
    assert not Allocation.objects.filter(job=job).exists()
    assert not RoundDecision.objects.filter(round=results["round"], job=job).exists()
    assert list(JobEvent.objects.filter(job=job).order_by("at", "id").values_list("kind", flat=True)) == [
        "submitted",
        "cancelled",
    ]


@postgresql_only
@pytest.mark.django_db(transaction=True)
def test_a_cancel_while_a_round_writes_the_job_waits_for_it_and_wins(user, fifo_tune, monkeypatch):
    make_server("n1")
    job = submit(user, gpus=1)
    inside, release, cancelled = threading.Event(), threading.Event(), threading.Event()
    real = rounds.round_plan_apply

    def paused_apply(*args, **kwargs):
        inside.set()  # round_plan_recheck has locked the rows the plan writes, to the round's commit
        assert release.wait(10)
        return real(*args, **kwargs)

    monkeypatch.setattr(rounds, "round_plan_apply", paused_apply)
    results = {}
    round_thread = _in_thread(results, "round", lambda: scheduling_round_run(trigger="racing"))
    try:
        assert inside.wait(10)
        cancel_thread = _in_thread(results, "cancel", lambda: job_cancel(job=job), cancelled)
        assert not cancelled.wait(0.5)  # it waits for the round's lock on the job row
    finally:
        release.set()
        round_thread.join(10)
    cancel_thread.join(10)

    assert results["round"].num_placed == 1  # the round placed it and committed first ...
    job.refresh_from_db()
    assert job.state == JobState.CANCELLED  # ... then the cancel ran on what the round wrote
    assert not active(job)
    assert list(JobEvent.objects.filter(job=job).order_by("at", "id").values_list("kind", flat=True))[
        -2:
    ] == [
        "scheduled",
        "cancelled",
    ]
    assert Allocation.objects.get(job=job).end_reason


@postgresql_only
@pytest.mark.django_db(transaction=True)
def test_a_job_that_finishes_while_a_round_reads_is_skipped_and_its_gpu_starts_after_the_release(
    user, fifo_tune, monkeypatch
):
    """A job finishes (its exit report commits) between the round's read of the jobs and its read of
    the leases: the round sees a RUNNING job without a lease and a free GPU. The job's decision is
    skipped (its row changed), and the GPU it freed goes to the next job with a lease that starts after
    the release, not at the time the round began."""
    make_server("n1", gpus=1, cpus=3, mem_gb=62.5)
    first = submit(user, gpus=1, name="first")
    scheduling_round_run(trigger="test")
    second = submit(user, gpus=1, name="second")
    real = rounds.round_inputs
    results = {}

    def finish_then_read(*args, **kwargs):
        finish = lambda: job_finish(job=Job.objects.get(pk=first.pk), state=JobState.COMPLETED, exit_code=0)  # noqa: E731
        _in_thread(results, "finish", finish).join(10)
        return real(*args, **kwargs)

    monkeypatch.setattr(rounds, "round_inputs", finish_then_read)
    round_began = timezone.now()
    sround = scheduling_round_run(trigger="racing")

    # FIFO gave the free GPU to the older job, which had ended: that decision is skipped, and no
    # other job was given the GPU in this round's plan.
    assert "finish" in results and sround.num_placed == 0
    first.refresh_from_db()
    assert first.state == JobState.COMPLETED  # not requeued or placed again by the round that read it
    assert (
        JobEvent.objects.filter(job=first).order_by("-at", "-id").values_list("kind", flat=True)[0]
        == "completed"
    )
    assert Allocation.objects.filter(job=first).count() == 1
    monkeypatch.setattr(rounds, "round_inputs", real)
    assert scheduling_round_run(trigger="skipped").num_placed == 1  # the early round it asked for
    released_at = AllocationGpu.objects.get(allocation__job=first).released_at
    assert released_at > round_began  # the finish came while the round ran
    assert lease_of(second).started_at >= released_at
