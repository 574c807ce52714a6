"""What the live service knows of restarts: leases' measured start-ups (and the workloads' running mean),
the work a restart loses stored as it ends a lease, and the round's job views filled from both."""

from __future__ import annotations

import time
from datetime import timedelta

import pytest
from django.utils import timezone

from profiles_app.models import Workload
from scheduler_app.models import Allocation, Job, JobState
from scheduler_app.selectors import round_inputs, round_jobs_read
from scheduler_app.services.nodes import node_liveness_sweep_run
from scheduler_app.services.report_apply import LeaseReport
from scheduler_app.services.report_ingest import agent_reports_ingest
from scheduler_app.services.rounds import scheduling_round_run
from tests.api.helpers import lease_of, make_server, submit
from tests.factories import heartbeat_at

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def knobs(settings):
    # Restart costs off: these tests make rounds preempt at once, whatever the jobs' run times.
    settings.ATTUNE_SCHEDULER = {
        **settings.ATTUNE_SCHEDULER,
        "policy": "fifo",
        "allocator": "tune",
        "inline_rounds": True,
        "restart_costs": False,
    }
    settings.ATTUNE_NODE_NOT_RESPONDING_AFTER_S = 30
    settings.ATTUNE_NODE_DOWN_AFTER_S = 120


def node_dies() -> None:
    """Every server silent long enough to be DOWN (NOT_RESPONDING first) and its leases fenced."""
    now = timezone.now()
    node_liveness_sweep_run(now=now + timedelta(seconds=45))
    node_liveness_sweep_run(now=now + timedelta(seconds=400))


def report(lease: Allocation, seq: int, kind: str, **data) -> LeaseReport:
    return LeaseReport(lease.lease_id, seq, kind, timezone.now(), data)


def running(user, *, server_name: str = "gpu01", gpus: int = 2, ran_s: float = 0.0, **kwargs) -> Allocation:
    """A job placed by a round on a fresh server, its agent's `started` dated `ran_s` ago."""
    server = make_server(server_name, gpus=gpus)
    heartbeat_at(server, timezone.now())
    job = submit(user, gpus=gpus, **kwargs)
    scheduling_round_run()
    lease = lease_of(job)
    agent_start = timezone.now() - timedelta(seconds=ran_s)
    Allocation.objects.filter(pk=lease.pk).update(started_at=agent_start, agent_started_at=agent_start)
    lease.refresh_from_db()
    return lease


# -- measured start-ups ----------------------------------------------------------------------------


def test_a_leases_first_measured_startup_is_stored_and_teaches_its_workload(user):
    lease = running(user)
    workload = Workload.objects.get(pk=lease.job.workload_id)
    assert (workload.startup_s, workload.startup_leases) == (30.0, 0)  # the profile default
    agent_reports_ingest(
        server=lease.server, reports=[report(lease, 1, "progress", done_iters=5, startup_s=12.0)]
    )
    lease.refresh_from_db()
    workload.refresh_from_db()
    assert lease.startup_s == 12.0
    assert (workload.startup_s, workload.startup_leases) == (12.0, 1)  # the first replaces the default
    # Measured once per lease: a later report saying otherwise changes neither.
    agent_reports_ingest(
        server=lease.server, reports=[report(lease, 2, "progress", done_iters=9, startup_s=99.0)]
    )
    lease.refresh_from_db()
    workload.refresh_from_db()
    assert lease.startup_s == 12.0 and workload.startup_leases == 1

    # Another lease of the workload: the running mean over both.
    other = running(user, server_name="gpu02")
    agent_reports_ingest(
        server=other.server, reports=[report(other, 1, "progress", done_iters=1, startup_s=20.0)]
    )
    workload.refresh_from_db()
    assert workload.startup_s == pytest.approx(16.0) and workload.startup_leases == 2


def test_a_fake_nodes_startup_is_counted_in_the_jobs_own_time(user):
    lease = running(user)
    data = {"done_iters": 5, "startup_s": 0.5, "time_scale": 0.05}
    agent_reports_ingest(server=lease.server, reports=[report(lease, 1, "progress", **data)])
    lease.refresh_from_db()
    assert lease.startup_s == pytest.approx(10.0)


def test_an_agent_that_does_not_measure_startups_still_reports_progress(user):
    lease = running(user)
    agent_reports_ingest(server=lease.server, reports=[report(lease, 1, "progress", done_iters=40)])
    lease.refresh_from_db()
    assert lease.startup_s is None and Job.objects.get(pk=lease.job_id).done_iters == 40
    assert Workload.objects.get(pk=lease.job.workload_id).startup_leases == 0


@pytest.mark.parametrize("bad", [-1.0, 1e9])
def test_an_implausible_startup_is_not_stored_and_its_progress_counts(user, bad):
    lease = running(user)
    agent_reports_ingest(
        server=lease.server, reports=[report(lease, 1, "progress", done_iters=7, startup_s=bad)]
    )
    lease.refresh_from_db()
    assert lease.startup_s is None and Job.objects.get(pk=lease.job_id).done_iters == 7


def test_an_own_commands_startup_is_stored_on_its_lease_alone(user):
    lease = running(user, command="python train.py", iters=100)
    agent_reports_ingest(
        server=lease.server, reports=[report(lease, 1, "progress", done_iters=1, startup_s=4.0)]
    )
    lease.refresh_from_db()
    assert lease.startup_s == 4.0
    assert not Workload.objects.filter(startup_leases__gt=0).exists()


# -- the work a restart loses ------------------------------------------------------------------------


def test_a_preempted_catalog_job_loses_the_run_since_its_profiles_last_checkpoint(user, staff_user):
    low = running(user, ran_s=1500.0, name="low")  # res18 checkpoints every 600 s (its profile)
    submit(staff_user, gpus=2, name="high", priority=10)
    before = timezone.now()
    sround = scheduling_round_run()
    assert sround.num_preempted == 1
    low.refresh_from_db()
    assert low.end_reason == "preempted"
    run_s = (low.ended_at - low.agent_started_at).total_seconds()
    assert run_s >= (before - low.agent_started_at).total_seconds()
    assert low.lost_work_s == pytest.approx(run_s % 600.0, abs=1.0)
    assert 299.0 < low.lost_work_s < 320.0


def test_a_moved_own_command_without_checkpoints_loses_its_whole_lease(user):
    lease = running(user, ran_s=200.0, command="python train.py", iters=100, gpus=1)
    # Held with a share the allocator would never choose: the round moves it.
    Allocation.objects.filter(pk=lease.pk).update(num_cpus=1, mem_gb=1.0)
    assert scheduling_round_run().num_preempted == 1
    lease.refresh_from_db()
    assert lease.end_reason == "preempted"
    assert lease.lost_work_s == pytest.approx((lease.ended_at - lease.agent_started_at).total_seconds())
    assert lease.lost_work_s >= 200.0
    fresh = lease_of(lease.job)
    assert fresh.lost_work_s is None  # the new lease has lost nothing


def test_a_node_failure_ends_each_lease_with_the_work_since_the_jobs_declared_checkpoint(user):
    lease = running(user, ran_s=250.0, command="python train.py", iters=100, gpus=1, checkpoint_every_s=60.0)
    node_dies()
    lease.refresh_from_db()
    assert lease.end_reason == "node_fail"
    assert lease.lost_work_s == pytest.approx(
        (lease.ended_at - lease.agent_started_at).total_seconds() % 60.0
    )
    assert Job.objects.get(pk=lease.job_id).state == JobState.PENDING


def test_the_start_is_the_rounds_when_the_agent_never_said_it_started(user):
    lease = running(user, command="python train.py", iters=100, gpus=1)
    Allocation.objects.filter(pk=lease.pk).update(
        agent_started_at=None, started_at=timezone.now() - timedelta(seconds=90)
    )
    node_dies()
    lease.refresh_from_db()
    assert lease.lost_work_s == pytest.approx((lease.ended_at - lease.started_at).total_seconds())


def test_a_lease_stopped_by_its_agent_shutting_down_loses_its_run_since_the_checkpoint(user):
    lease = running(user, ran_s=700.0)  # res18: 100 s since its last checkpoint (600 s)
    agent_reports_ingest(
        server=lease.server,
        reports=[report(lease, 1, "exited", exit_code=0, signal=None, done_iters=10, stop="agent_exit")],
    )
    lease.refresh_from_db()
    assert lease.end_reason == "agent_exit"
    assert lease.lost_work_s == pytest.approx(
        (lease.ended_at - lease.agent_started_at).total_seconds() % 600.0
    )
    assert 99.0 < lease.lost_work_s < 120.0
    assert Job.objects.get(pk=lease.job_id).state == JobState.PENDING


def test_an_end_that_is_no_restart_stores_no_lost_work(user):
    lease = running(user, ran_s=100.0)
    agent_reports_ingest(
        server=lease.server,
        reports=[report(lease, 1, "exited", exit_code=0, signal=None, done_iters=1000)],
    )
    lease.refresh_from_db()
    assert lease.ended_at is not None and lease.end_reason == "completed" and lease.lost_work_s is None


# -- the round's job views ----------------------------------------------------------------------------


def views_by_job(servers) -> dict:
    inputs = round_inputs(servers=servers, jobs=round_jobs_read())
    return {view.job_id: view for view in inputs.views}


def test_the_rounds_views_carry_startups_checkpoints_and_lease_starts(user, settings):
    settings.ATTUNE_SCHEDULER = {**settings.ATTUNE_SCHEDULER, "own_command_startup_s": 45.0}
    catalog = running(user, ran_s=120.0)
    own = running(user, server_name="gpu02", command="python train.py", iters=100, gpus=1)
    declared = submit(user, command="python eval.py", iters=10, checkpoint_every_s=300.0, name="declared")
    Workload.objects.filter(pk=catalog.job.workload_id).update(startup_s=18.0, checkpoint_every_s=900.0)
    servers = [catalog.server, own.server]

    views = views_by_job(servers)
    assert views[catalog.job_id].startup_s == 18.0  # its workload's (learnt or default)
    assert views[catalog.job_id].checkpoint_every_s == 900.0  # its workload's profile
    assert views[catalog.job_id].lease_started_s == pytest.approx(
        catalog.agent_started_at.timestamp(), abs=0.01
    )
    assert views[own.job_id].startup_s == 45.0  # the own-command default (settings)
    assert views[own.job_id].checkpoint_every_s is None  # declared none: never checkpoints
    assert views[declared.pk].checkpoint_every_s == 300.0 and views[declared.pk].lease_started_s is None

    # A job's own measured start-up wins over its workload's; a declared interval over the profile's.
    Allocation.objects.filter(pk=catalog.pk).update(startup_s=7.5)
    Allocation.objects.filter(pk=own.pk).update(startup_s=3.0, agent_started_at=None)
    Job.objects.filter(pk=catalog.job_id).update(checkpoint_every_s=120.0)
    views = views_by_job(servers)
    assert views[catalog.job_id].startup_s == 7.5 and views[catalog.job_id].checkpoint_every_s == 120.0
    assert views[own.job_id].startup_s == 3.0
    assert views[own.job_id].lease_started_s == pytest.approx(
        own.started_at.timestamp(), abs=0.01
    )  # no agent


def test_a_fake_nodes_lease_age_is_counted_in_the_jobs_own_time(user):
    # One clock: profiles, start-ups and checkpoint intervals are the job's own seconds; a fake node
    # at time scale 0.05 runs 20 of them each wall second, so a lease 10 s old has run 200 s.
    wall_start = time.monotonic()
    lease = running(user, ran_s=10.0)
    type(lease.server).objects.filter(pk=lease.server_id).update(time_scale=0.05)
    lease.server.refresh_from_db()
    inputs = round_inputs(servers=[lease.server], jobs=round_jobs_read())
    # Each wall second the test itself takes counts 20 too (a loaded host: tens of milliseconds).
    took_s = time.monotonic() - wall_start
    (view,) = [v for v in inputs.views if v.job_id == lease.job_id]
    assert 200.0 - 1.0 <= inputs.now_s - view.lease_started_s <= 20 * (10.0 + took_s) + 1.0


def test_a_fake_nodes_failure_stores_the_lost_work_in_the_jobs_own_time(user):
    lease = running(user, ran_s=10.0, command="python train.py", iters=100, gpus=1)  # no checkpoints
    type(lease.server).objects.filter(pk=lease.server_id).update(time_scale=0.05)
    node_dies()
    lease.refresh_from_db()
    wall_s = (lease.ended_at - lease.agent_started_at).total_seconds()
    assert lease.end_reason == "node_fail" and lease.lost_work_s == pytest.approx(wall_s / 0.05)


def test_a_requeued_job_keeps_its_last_measured_startup(user):
    lease = running(user, command="python train.py", iters=100, gpus=1)
    Allocation.objects.filter(pk=lease.pk).update(startup_s=6.0)
    node_dies()
    (view,) = [v for v in round_inputs(servers=[], jobs=round_jobs_read()).views if v.job_id == lease.job_id]
    assert view.startup_s == 6.0 and view.lease_started_s is None
