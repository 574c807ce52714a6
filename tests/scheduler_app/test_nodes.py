"""Node failure as the work sees it: NOT_RESPONDING keeps jobs, DOWN requeues them with their progress."""

from datetime import timedelta

import pytest
from django.db import transaction
from django.utils import timezone

from cluster_app.models import NodeState
from scheduler_app.models import Allocation, Job, JobEvent, JobState
from scheduler_app.selectors import server_busy_gpu_count, server_busy_gpus
from scheduler_app.services.job_control import allocations_end
from scheduler_app.services.nodes import node_drain, node_liveness_sweep_run, node_resume
from scheduler_app.services.rounds import scheduling_round_run
from tests.api.helpers import active, lease_of, make_server, submit
from tests.factories import heartbeat_at

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def knobs(settings):
    settings.ATTUNE_SCHEDULER = {
        **settings.ATTUNE_SCHEDULER,
        "policy": "fifo",
        "allocator": "tune",
        "inline_rounds": False,
    }
    settings.ATTUNE_NODE_NOT_RESPONDING_AFTER_S = 30
    settings.ATTUNE_NODE_DOWN_AFTER_S = 120


def running_on_gpu01(user):
    """Now, gpu01 (4 GPUs) heard from now, and a 2-GPU job placed there by a round, with its lease."""
    now = timezone.now()
    server = make_server("gpu01", gpus=4)
    heartbeat_at(server, now)
    job = submit(user, gpus=2, iters=1000)
    scheduling_round_run()
    return now, server, job, lease_of(job)


def test_a_silent_server_goes_not_responding_then_down_and_its_jobs_are_requeued(user):
    now, server, job, lease = running_on_gpu01(user)
    Job.objects.filter(pk=job.pk).update(done_iters=640, attained_service_gpu_s=1200.0)

    sweep = node_liveness_sweep_run(now=now + timedelta(seconds=45))
    assert sweep.not_responding == ["gpu01"]
    job.refresh_from_db()
    assert job.state == JobState.RUNNING and lease_of(job) == lease  # maybe only slow: keeps its job

    sweep = node_liveness_sweep_run(now=now + timedelta(seconds=200))
    assert sweep.down == ["gpu01"]
    server.refresh_from_db()
    job.refresh_from_db()
    lease.refresh_from_db()
    assert server.state == NodeState.DOWN
    assert job.state == JobState.PENDING and job.done_iters == 640 and job.attained_service_gpu_s == 1200.0
    assert lease.end_reason == "node_fail" and lease.ended_at is not None
    assert not lease.gpu_holds.filter(released_at__isnull=True).exists()
    history = list(JobEvent.objects.filter(job=job).values_list("kind", "from_state", "to_state"))
    assert history[-2:] == [("node_fail", "RUNNING", "NODE_FAIL"), ("requeued", "NODE_FAIL", "PENDING")]
    # Sweeping again changes nothing.
    node_liveness_sweep_run(now=now + timedelta(seconds=300))
    assert JobEvent.objects.filter(job=job, kind="node_fail").count() == 1


def test_a_down_server_keeps_its_jobs_until_their_fence_expired_whatever_the_down_threshold(user, settings):
    """Fencing: the node stops a lease its agent could not renew 60 s after its last sync and kills it 30 s
    later; the service ends it (and may start the job elsewhere) only once that, plus a 10 s margin, has
    passed since the node's last sync, even with a DOWN threshold set below it (a system check refuses
    that setting; the sweep holds anyway)."""
    settings.ATTUNE_NODE_DOWN_AFTER_S = 40
    now, _server, job, lease = running_on_gpu01(user)

    node_liveness_sweep_run(now=now + timedelta(seconds=35))  # NOT_RESPONDING first, as a sweep moves it
    sweep = node_liveness_sweep_run(now=now + timedelta(seconds=99))
    assert sweep.down == ["gpu01"]
    job.refresh_from_db()
    assert job.state == JobState.RUNNING and lease_of(job) == lease  # may still run there

    node_liveness_sweep_run(now=now + timedelta(seconds=101))
    job.refresh_from_db()
    lease.refresh_from_db()
    assert job.state == JobState.PENDING and lease.end_reason == "node_fail"


def test_a_requeued_job_runs_elsewhere_with_its_progress(user):
    now = timezone.now()
    dying = make_server("a-dying", gpus=2)
    healthy = make_server("b-healthy", gpus=2)
    heartbeat_at(healthy, now + timedelta(seconds=400))
    heartbeat_at(dying, now)
    job = submit(user, gpus=2)
    scheduling_round_run()
    assert lease_of(job).server == dying
    Job.objects.filter(pk=job.pk).update(done_iters=300)
    node_liveness_sweep_run(now=now + timedelta(seconds=60))
    node_liveness_sweep_run(now=now + timedelta(seconds=200))

    scheduling_round_run()

    job.refresh_from_db()
    assert job.state == JobState.RUNNING and job.done_iters == 300
    assert lease_of(job).server == healthy
    assert Allocation.objects.filter(job=job).count() == 2


def test_a_job_spanning_servers_restarts_whole_when_one_dies(user):
    now = timezone.now()
    a = make_server("a", gpus=2)
    b = make_server("b", gpus=2)
    heartbeat_at(b, now + timedelta(seconds=400))
    heartbeat_at(a, now)
    job = submit(user, gpus=4)
    scheduling_round_run()
    assert len(active(job)) == 2
    node_liveness_sweep_run(now=now + timedelta(seconds=60))
    node_liveness_sweep_run(now=now + timedelta(seconds=200))
    job.refresh_from_db()
    assert job.state == JobState.PENDING and active(job) == []


def test_drain_through_the_service_counts_leases_under_lock(user):
    server = make_server("gpu01", gpus=2)
    submit(user, gpus=1)
    scheduling_round_run()
    assert node_drain(server=server, reason="maintenance").state == NodeState.DRAINING
    assert node_resume(server=server).state == NodeState.MIXED


def test_a_servers_busy_gpus_are_counted_alone_and_as_the_cluster_count_says(user):
    one, two, idle = make_server("gpu01", gpus=4), make_server("gpu02", gpus=4), make_server("gpu03", gpus=4)
    for gpus in (4, 2, 1):
        submit(user, gpus=gpus)
    scheduling_round_run()
    cluster = server_busy_gpus()
    assert sum(cluster.values()) == 7
    assert [server_busy_gpu_count(server_id=s.pk) for s in (one, two, idle)] == [
        cluster.get(s.pk, 0) for s in (one, two, idle)
    ]
    ended = Allocation.objects.filter(ended_at__isnull=True).order_by("id").first()
    with transaction.atomic():
        allocations_end(allocation_ids=[ended.pk], reason="test", now=timezone.now())
    assert server_busy_gpu_count(server_id=ended.server_id) == server_busy_gpus().get(ended.server_id, 0)
    assert sum(server_busy_gpus().values()) == 7 - ended.num_gpus
