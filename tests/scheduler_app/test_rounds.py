"""The live round service: leases continue, moves preempt, nothing is double-booked, single-flight."""

import random
import threading
from collections import defaultdict
from datetime import timedelta

import pytest
from django.db import connection
from django.db.models import Count, Sum
from django.utils import timezone

from cluster_app.models import NodeState
from scheduler_app.models import (
    Allocation,
    AllocationGpu,
    Job,
    JobEvent,
    JobState,
    PendingReason,
    RoundDecision,
    SchedulingRound,
)
from scheduler_app.services import rounds
from scheduler_app.services.job_control import job_finish
from scheduler_app.services.rounds import scheduling_round_run
from tests.api.helpers import active, lease_of, make_server, submit
from tests.factories import AllocationFactory, JobFactory, hold_gpus

pytestmark = pytest.mark.django_db


def kinds(job: Job) -> list[tuple[str, str, str]]:
    return list(
        JobEvent.objects.filter(job=job).order_by("at", "id").values_list("kind", "from_state", "to_state")
    )


def test_a_round_places_pending_jobs_and_records_everything(user, fifo_tune):
    server = make_server("n1")
    jobs = [submit(user, gpus=g, name=f"j{g}") for g in (1, 2, 4)]
    sround = scheduling_round_run(trigger="test")
    assert sround.num_runnable == 3 and sround.num_placed == 3 and sround.trigger == "test"
    assert RoundDecision.objects.filter(round=sround).count() == 3
    for job in jobs:
        job.refresh_from_db()
        assert job.state == JobState.RUNNING and job.pending_reason == PendingReason.NONE
        assert job.started_at is not None
        allocation = lease_of(job)
        assert allocation.server == server and allocation.round == sround
        assert allocation.gpu_holds.filter(released_at__isnull=True).count() == job.num_gpus
        assert allocation.num_gpus == job.num_gpus  # the count accounting reads
        assert kinds(job)[-1] == ("scheduled", "PENDING", "RUNNING")
    server.refresh_from_db()
    assert server.state == NodeState.MIXED


def test_an_unchanged_placement_keeps_its_lease(user, fifo_tune):
    make_server("n1")
    job = submit(user, gpus=2)
    scheduling_round_run()
    first = lease_of(job)
    for _ in range(3):
        assert scheduling_round_run().num_preempted == 0
    assert lease_of(job).lease_id == first.lease_id
    assert Allocation.objects.filter(job=job).count() == 1
    assert [k for k, _, _ in kinds(job)] == ["submitted", "scheduled"]


def test_a_moved_job_is_preempted_and_reallocated(user, fifo_tune, settings):
    # Restart costs off: the subject is a move's bookkeeping (the guard would keep a lease this young,
    # and would keep its GPU 5 even when moving it: GPUs of a server are interchangeable).
    settings.ATTUNE_SCHEDULER = {**settings.ATTUNE_SCHEDULER, "restart_costs": False}
    server = make_server("n1")
    job = submit(user, gpus=1)
    # Running on GPU 5 with a share the allocator would never choose: the round moves it.
    stale = AllocationFactory(job=job, server=server, num_cpus=1, mem_gb=10.0)
    hold_gpus(stale, server.gpus.get(index=5))
    Job.objects.filter(pk=job.pk).update(state=JobState.RUNNING)

    sround = scheduling_round_run()

    assert sround.num_preempted == 1 and sround.num_placed == 1
    stale.refresh_from_db()
    assert stale.ended_at is not None and stale.end_reason == "preempted"
    assert not stale.gpu_holds.filter(released_at__isnull=True).exists()
    fresh = lease_of(job)
    assert fresh.lease_id != stale.lease_id and fresh.num_cpus > 1
    job.refresh_from_db()
    assert job.state == JobState.RUNNING
    assert kinds(job)[-2:] == [("preempted", "RUNNING", "PREEMPTED"), ("rescheduled", "PREEMPTED", "RUNNING")]


def test_a_running_job_outranked_goes_back_to_the_queue_with_its_progress(
    user, staff_user, settings, fifo_tune
):
    # Restart costs off: a job that started this instant would otherwise keep its GPUs (min run time).
    settings.ATTUNE_SCHEDULER = {**settings.ATTUNE_SCHEDULER, "restart_costs": False}
    make_server("n1", gpus=2, cpus=6, mem_gb=100)
    low = submit(user, gpus=2, name="low")
    scheduling_round_run()
    Job.objects.filter(pk=low.pk).update(done_iters=300)
    high = submit(staff_user, gpus=2, name="high", priority=10)

    sround = scheduling_round_run()

    low.refresh_from_db()
    high.refresh_from_db()
    assert sround.num_preempted == 1
    assert high.state == JobState.RUNNING
    assert low.state == JobState.PENDING and low.pending_reason == PendingReason.RESOURCES
    assert low.done_iters == 300 and not active(low)
    assert kinds(low)[-2:] == [("preempted", "RUNNING", "PREEMPTED"), ("requeued", "PREEMPTED", "PENDING")]
    assert Allocation.objects.get(job=low).end_reason == "preempted"


def test_pending_reasons_resources_priority_and_infeasible(user, fifo_tune):
    make_server("n1", gpus=2, cpus=6, mem_gb=100)
    first = submit(user, gpus=2, name="first")
    blocked = submit(user, gpus=2, name="blocked")
    behind = submit(user, gpus=1, name="behind")
    Job.objects.filter(pk=behind.pk).update(submitted_at=timezone.now() + timezone.timedelta(seconds=1))
    huge = JobFactory(owner=user, num_gpus=64, name="huge")  # bypasses submit's validation

    scheduling_round_run()

    states = {j.name: (j.state, j.pending_reason) for j in Job.objects.all()}
    assert states["first"] == (JobState.RUNNING, PendingReason.NONE)
    assert states["blocked"] == (JobState.PENDING, PendingReason.RESOURCES)
    assert states["behind"] == (JobState.PENDING, PendingReason.PRIORITY)
    assert states["huge"] == (JobState.PENDING, PendingReason.INFEASIBLE)
    outcomes = dict(RoundDecision.objects.values_list("job__name", "outcome"))
    assert outcomes == {"first": "placed", "blocked": "pending", "behind": "pending", "huge": "infeasible"}
    assert first and blocked and huge


def test_own_command_jobs_get_the_proportional_share(user, fifo_tune):
    make_server("n1", gpus=4, cpus=16, mem_gb=200)
    job = submit(user, gpus=2, command="python train.py")
    scheduling_round_run()
    allocation = lease_of(job)
    assert (allocation.num_cpus, allocation.mem_gb) == (8, 100.0)


def test_draining_and_dead_servers_get_nothing_and_keep_their_leases(user, fifo_tune):
    draining = make_server("a-draining", gpus=1, cpus=3, mem_gb=60)
    make_server("b-down", gpus=1, cpus=3, mem_gb=60, state=NodeState.DOWN)
    job = submit(user, gpus=1)
    scheduling_round_run()
    assert lease_of(job).server == draining
    draining.state = NodeState.DRAINING
    draining.save()
    newcomer = submit(user, gpus=1, name="newcomer")

    sround = scheduling_round_run()

    assert lease_of(job).server == draining  # untouched, outside the round
    newcomer.refresh_from_db()
    assert newcomer.state == JobState.PENDING and sround.num_runnable == 1
    job_finish(job=Job.objects.get(pk=job.pk), state=JobState.COMPLETED)
    scheduling_round_run()
    draining.refresh_from_db()
    assert draining.state == NodeState.DRAINED


def test_no_gpu_is_ever_double_booked_across_many_rounds(user, staff_user, settings):
    settings.ATTUNE_SCHEDULER = {
        **settings.ATTUNE_SCHEDULER,
        "policy": "las",
        "allocator": "tune",
        "inline_rounds": False,
        "restart_costs": False,  # every round may preempt: the bookkeeping under churn is the subject
    }
    servers = [make_server(f"n{i}", gpus=4, cpus=12, mem_gb=250) for i in range(3)]
    rng = random.Random(7)
    for k in range(12):
        submit(user, gpus=rng.choice([1, 1, 2, 4]), name=f"seed{k}")
    for step in range(25):
        running = list(Job.objects.filter(state=JobState.RUNNING))
        for job in running:
            # Attained service grows unevenly, so LAS reorders (and preempts) from round to round.
            Job.objects.filter(pk=job.pk).update(
                attained_service_gpu_s=job.attained_service_gpu_s + rng.uniform(10, 500)
            )
        for job in rng.sample(running, k=min(len(running), rng.randint(0, 2))):
            job_finish(job=job, state=JobState.COMPLETED)
        for k in range(rng.randint(0, 3)):
            submit(user, gpus=rng.choice([1, 2, 3, 4, 8]), name=f"s{step}-{k}")
        scheduling_round_run()

        holds = AllocationGpu.objects.filter(released_at__isnull=True)
        gpu_ids = list(holds.values_list("gpu_id", flat=True))
        assert len(gpu_ids) == len(set(gpu_ids))
        per_job = defaultdict(int)
        for job_id in holds.values_list("allocation__job_id", flat=True):
            per_job[job_id] += 1
        for job in Job.objects.all():
            if job.state == JobState.RUNNING:
                assert per_job[job.pk] == job.num_gpus, job
            else:
                assert per_job[job.pk] == 0, job
        for allocation in Allocation.objects.annotate(held=Count("gpu_holds")):
            assert allocation.num_gpus == allocation.held, allocation
        for server in servers:
            used = Allocation.objects.filter(server=server, ended_at__isnull=True).aggregate(
                cpus=Sum("num_cpus"), mem=Sum("mem_gb")
            )
            assert (used["cpus"] or 0) <= server.num_cpus and (used["mem"] or 0) <= server.mem_gb + 1e-6
    assert SchedulingRound.objects.count() == 25
    assert JobEvent.objects.filter(kind="preempted").exists()


@pytest.mark.skipif(connection.vendor != "postgresql", reason="advisory locks are PostgreSQL's")
@pytest.mark.django_db(transaction=True)
def test_a_second_concurrent_round_returns_none(user, fifo_tune, monkeypatch):
    make_server("n1")
    submit(user, gpus=1)
    inside, release = threading.Event(), threading.Event()
    real = rounds.schedule_round

    def slow_schedule_round(*args, **kwargs):
        inside.set()
        assert release.wait(10)
        return real(*args, **kwargs)

    monkeypatch.setattr(rounds, "schedule_round", slow_schedule_round)
    results = []

    def first_round():
        try:
            results.append(scheduling_round_run(trigger="first"))
        finally:
            connection.close()  # this thread's own database connection

    worker = threading.Thread(target=first_round)
    worker.start()
    try:
        assert inside.wait(10)
        monkeypatch.setattr(rounds, "schedule_round", real)
        assert scheduling_round_run(trigger="second") is None  # the lock is taken: skipped, not queued
    finally:
        release.set()
        worker.join(10)
    assert results and results[0] is not None and results[0].trigger == "first"
    assert scheduling_round_run(trigger="third") is not None  # the lock went with the first's commit


def test_a_lease_never_ends_before_it_started(user, fifo_tune):
    from scheduler_app.services.job_control import job_allocations_end

    make_server("n1")
    job = submit(user)
    scheduling_round_run()
    lease = lease_of(job)
    # An agent report that began before the round created this lease, and waited for the job lock.
    job_allocations_end(
        job_ids=[job.pk], reason="completed", now=lease.started_at - timezone.timedelta(seconds=5)
    )
    lease.refresh_from_db()
    assert lease.ended_at == lease.started_at
    # Its GPU holds are released when it ended, not at the caller's earlier time: no hold of a GPU
    # may end before it began (the fault tests read GPU holds as time intervals).
    releases = set(AllocationGpu.objects.filter(allocation=lease).values_list("released_at", flat=True))
    assert releases == {lease.ended_at}


def test_decisions_of_old_rounds_are_pruned_and_the_rounds_kept(user, fifo_tune, settings):
    settings.ATTUNE_SCHEDULER = {**settings.ATTUNE_SCHEDULER, "round_decision_retention_days": 7}
    make_server("n1")
    submit(user, gpus=1, name="a")
    submit(user, gpus=2, name="b")
    old = scheduling_round_run(trigger="test")
    recent = scheduling_round_run(trigger="test")
    SchedulingRound.objects.filter(pk=old.pk).update(started_at=timezone.now() - timedelta(days=8))
    assert rounds.round_decisions_prune() == 2
    assert not RoundDecision.objects.filter(round=old).exists()
    assert RoundDecision.objects.filter(round=recent).count() == 2
    assert SchedulingRound.objects.filter(pk=old.pk).exists()
    assert rounds.round_decisions_prune() == 0


def test_the_live_round_runs_genie_with_deadlines_on_the_round_clock(user, settings):
    settings.ATTUNE_SCHEDULER = {
        **settings.ATTUNE_SCHEDULER,
        "policy": "swaf",
        "allocator": "genie",
        "inline_rounds": False,
    }
    make_server("n1", gpus=2, cpus=6, mem_gb=125)
    narrow = submit(user, gpus=1, iters=100, name="narrow", qos_max_latency_s=24 * 3600)
    late = submit(user, gpus=1, iters=10**9, name="late", qos_max_latency_s=60)  # far too much work
    # Two GPUs capped on a 6-core server: the slowest best case, so the least waiting allowance.
    wide = submit(user, gpus=2, iters=100, name="wide", qos_max_latency_s=24 * 3600)
    sround = scheduling_round_run(trigger="test")
    decisions = {d.job_id: d for d in RoundDecision.objects.filter(round=sround)}
    assert [decisions[j.pk].position for j in (wide, narrow, late)] == [0, 1, 2]
    assert decisions[wide.pk].outcome == "placed" and decisions[wide.pk].reason in ("qos_fit", "leftover")
    assert (decisions[narrow.pk].outcome, decisions[narrow.pk].reason) == ("pending", "insufficient_gpus")
    assert (decisions[late.pk].outcome, decisions[late.pk].reason) == ("pending", "qos_unattainable")
    late.refresh_from_db()
    assert late.state == JobState.PENDING and late.pending_reason == PendingReason.QOS_UNATTAINABLE


def test_a_team_at_its_gpu_quota_waits_with_reason_quota(user, fifo_tune):
    from tests.factories import TeamFactory

    make_server("n1", gpus=8)
    vision = TeamFactory(name="vision-q", gpu_quota=3)
    vision.members.add(user)
    first = submit(user, gpus=2, name="v1", team=vision)
    second = submit(user, gpus=2, name="v2", team=vision)
    other = submit(user, gpus=4, name="free")
    scheduling_round_run(trigger="test")
    for job in (first, second, other):
        job.refresh_from_db()
    assert first.state == JobState.RUNNING and other.state == JobState.RUNNING
    assert second.state == JobState.PENDING and second.pending_reason == PendingReason.QUOTA
    vision.gpu_quota = 4
    vision.save()
    scheduling_round_run(trigger="test")
    second.refresh_from_db()
    assert second.state == JobState.RUNNING


def test_a_borrowing_team_uses_idle_gpus_and_gives_them_back_when_another_team_needs_them(user, fifo_tune):
    from tests.factories import TeamFactory

    make_server("n1", gpus=8)
    vision = TeamFactory(name="vision-b", gpu_quota=2, may_borrow=True)
    nlp = TeamFactory(name="nlp-b", gpu_quota=6)
    vision.members.add(user)
    nlp.members.add(user)
    mine = [submit(user, gpus=2, name=f"v{i}", team=vision) for i in range(3)]
    scheduling_round_run(trigger="test")
    assert [state_and_reason(j) for j in mine] == [(JobState.RUNNING, PendingReason.NONE)] * 3
    decisions = RoundDecision.objects.filter(job__in=mine[1:]).values_list("reason", flat=True)
    assert set(decisions) == {"borrowed"}
    # nlp's job comes last in FIFO order, but within its quota it goes before vision's borrowers.
    theirs = submit(user, gpus=6, name="n1", team=nlp)
    scheduling_round_run(trigger="test")
    assert state_and_reason(theirs)[0] == JobState.RUNNING
    assert state_and_reason(mine[0])[0] == JobState.RUNNING  # within vision's quota: untouched
    assert [state_and_reason(j) for j in mine[1:]] == [(JobState.PENDING, PendingReason.QUOTA)] * 2
    assert JobEvent.objects.filter(job=mine[2], kind="preempted").exists()


def state_and_reason(job: Job) -> tuple[str, str]:
    job.refresh_from_db()
    return job.state, job.pending_reason


def test_fairshare_gives_another_user_the_gpus_before_one_users_burst_runs_on(user, settings):
    from tests.factories import UserFactory

    settings.ATTUNE_SCHEDULER = {**settings.ATTUNE_SCHEDULER, "policy": "fairshare", "inline_rounds": False}
    make_server("n1", gpus=8)
    burst = [submit(user, gpus=4, name=f"sweep{i}") for i in range(3)]
    other = submit(UserFactory(), gpus=4, name="late")  # submitted after the whole burst
    scheduling_round_run(trigger="test")
    assert [state_and_reason(j)[0] for j in burst] == [JobState.RUNNING, JobState.PENDING, JobState.PENDING]
    assert state_and_reason(other)[0] == JobState.RUNNING


def test_a_users_recent_usage_decays_with_the_half_life(user, settings):
    from scheduler_app.selectors import owner_usage_gpu_s

    settings.ATTUNE_SCHEDULER = {**settings.ATTUNE_SCHEDULER, "fairshare_half_life_h": 24}
    now = timezone.now()
    for age_h, gpu_s in ((None, 100.0), (0, 1000.0), (24, 4000.0), (48, 8000.0), (24 * 9, 1e9)):
        finished = None if age_h is None else now - timedelta(hours=age_h)
        JobFactory(owner=user, attained_service_gpu_s=gpu_s, finished_at=finished)
    # Running 100 + 1000 today + half of 4000 + a quarter of 8000; nine days back is not read.
    assert owner_usage_gpu_s(owner_ids=[user.pk], now=now) == {
        user.pk: pytest.approx(100 + 1000 + 2000 + 2000)
    }
