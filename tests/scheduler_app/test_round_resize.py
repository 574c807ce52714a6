"""A round that gives a running job other cores or memory on the same GPUs resizes its lease in place
where its agent can (Server.live_resize: the registered `resize` feature), and restarts it (a move)
where it cannot; the agent learns the new size from its sync's `resize` command."""

import json

import pytest
from django.utils import timezone

from cluster_app.models import Server
from profiles_app.models import SpeedObservation
from profiles_app.services.speeds import SpeedMeasurement, speed_observations_record
from scheduler_app.core.types import Placement, ServerShare
from scheduler_app.models import Allocation, Job, JobEvent, JobState, PendingReason, RoundDecision
from scheduler_app.selectors import ActiveLease
from scheduler_app.services.round_apply import _resize_of
from scheduler_app.services.rounds import scheduling_round_run
from tests.api.helpers import SYNC, active, agent_client, lease_of, make_server, submit, synced, usage_sample
from tests.factories import AllocationFactory, hold_gpus

pytestmark = pytest.mark.django_db


def running_on(
    job: Job, server: Server, *, gpu_indices: tuple[int, ...], cpus: int, mem_gb: float
) -> Allocation:
    """`job` RUNNING with one lease on `server`'s GPUs `gpu_indices` with the given cores and memory: a
    share that FIFO + tune would not choose for a job alone (it gives a res18 GPU more cores)."""
    lease = AllocationFactory(job=job, server=server, num_cpus=cpus, mem_gb=mem_gb, speedup=0.5)
    hold_gpus(lease, *(server.gpus.get(index=i) for i in gpu_indices))
    Job.objects.filter(pk=job.pk).update(
        state=JobState.RUNNING, pending_reason=PendingReason.NONE, started_at=timezone.now()
    )
    return lease


def gpu_indices(lease: Allocation) -> list[int]:
    return sorted(lease.gpu_holds.values_list("gpu__index", flat=True))


def kinds(job: Job) -> list[str]:
    return list(JobEvent.objects.filter(job=job).order_by("id").values_list("kind", flat=True))


def test_a_round_resizes_a_running_lease_in_place_where_its_agent_can(user, fifo_tune):
    server = make_server("n1")
    Server.objects.filter(pk=server.pk).update(live_resize=True)
    job = submit(user, gpus=1)
    lease = running_on(job, server, gpu_indices=(0,), cpus=1, mem_gb=10.0)
    measured = SpeedMeasurement(job.workload_id, job.pk, lease.pk, 1.0, 10.0, 0.5, 0.4, timezone.now())
    assert speed_observations_record([measured]) == 1

    sround = scheduling_round_run()

    # Its observation paired the old size's prediction with its speed: gone, the next report starts anew.
    assert not SpeedObservation.objects.filter(allocation=lease).exists()
    (now,) = active(job)
    assert now.pk == lease.pk and now.lease_id == lease.lease_id  # the same lease: no restart
    assert gpu_indices(now) == [0]
    assert (now.num_cpus, now.mem_gb) != (1, 10.0) and now.num_cpus > 1
    assert now.speedup > 0.5  # the plan's speed-up at the new size
    assert (sround.num_resized, sround.num_preempted) == (1, 0)
    assert Job.objects.get(pk=job.pk).state == JobState.RUNNING
    assert kinds(job) == ["submitted", "resized"]
    event = JobEvent.objects.get(job=job, kind="resized")
    assert event.data["from"] == {"cpus": 1, "mem_gb": 10.0}
    assert event.data["to"] == {"cpus": now.num_cpus, "mem_gb": now.mem_gb}
    assert event.data["round"] == sround.pk and event.data["placement"][0]["gpus"] == [0]
    assert event.from_state == event.to_state == ""  # not a change of state

    # The next round keeps it as it is now.
    again = scheduling_round_run()
    assert (again.num_resized, again.num_preempted) == (0, 0) and lease_of(job).pk == lease.pk


def test_without_the_agents_resize_feature_a_resize_is_a_restart(user, fifo_tune, settings):
    # Restart costs off: the subject is how a round applies a resize its agent cannot make live (the
    # guard would keep a lease this young where it is, as the next test shows).
    settings.ATTUNE_SCHEDULER = {**settings.ATTUNE_SCHEDULER, "restart_costs": False}
    server = make_server("n1")  # live_resize False: an agent that registered no `resize` feature
    job = submit(user, gpus=1)
    lease = running_on(job, server, gpu_indices=(0,), cpus=1, mem_gb=10.0)

    sround = scheduling_round_run()

    assert (sround.num_resized, sround.num_preempted) == (0, 1)
    assert lease_of(job).pk != lease.pk
    lease.refresh_from_db()
    assert lease.ended_at is not None and (lease.num_cpus, lease.mem_gb) == (1, 10.0)
    assert kinds(job)[-2:] == ["preempted", "rescheduled"] and "resized" not in kinds(job)


def test_weighing_restarts_a_young_job_is_not_restarted_for_a_resize_its_agent_cannot_make_live(
    user, fifo_tune
):
    # Restart costs on (the default): on a server without live resizes the resize is a restart, and a
    # job within its minimum run time is kept as it is, neither resized nor restarted.
    server = make_server("n1")
    job = submit(user, gpus=1)
    lease = running_on(job, server, gpu_indices=(0,), cpus=1, mem_gb=10.0)

    sround = scheduling_round_run()

    assert (sround.num_resized, sround.num_preempted) == (0, 0)
    assert lease_of(job).pk == lease.pk
    assert (lease_of(job).num_cpus, lease_of(job).mem_gb) == (1, 10.0)
    assert RoundDecision.objects.get(round=sround, job=job).reason == "min_run_time"


def _lease(allocation_id: int, server_id: int, indices: tuple[int, ...]) -> ActiveLease:
    return ActiveLease(allocation_id, 1, server_id, 4, 40.0, 1.0, tuple(indices), tuple(indices))


def _placement(*shares: tuple[int, tuple[int, ...], int]) -> Placement:
    return Placement(1, tuple(ServerShare(s, idx, cpus, 80.0) for s, idx, cpus in shares), 1.2)


def test_a_job_on_several_servers_is_resized_on_each_part_and_moved_if_any_part_changes_gpus():
    leases = [_lease(11, 100, (0, 1)), _lease(12, 200, (2, 3))]
    # Each part on its same GPUs, other cores: a resize on each part.
    assert _resize_of(leases, _placement((100, (1, 0), 8), (200, (2, 3), 6)), {100, 200}) == leases
    # One part on other GPUs, another server or one part fewer: a move.
    assert _resize_of(leases, _placement((100, (0, 1), 8), (200, (2, 4), 6)), {100, 200}) is None
    assert _resize_of(leases, _placement((100, (0, 1), 8), (300, (2, 3), 6)), {100, 200, 300}) is None
    assert _resize_of(leases, _placement((100, (0, 1, 2, 3), 8)), {100, 200}) is None
    # One server whose agent cannot resize live: the job restarts whole.
    assert _resize_of(leases, _placement((100, (0, 1), 8), (200, (2, 3), 6)), {100}) is None


def test_the_agent_learns_a_new_size_from_its_sync_until_it_applies_it(user, fifo_tune):
    server = make_server("n1")
    Server.objects.filter(pk=server.pk).update(live_resize=True)
    job = submit(user, gpus=1)
    lease = running_on(job, server, gpu_indices=(0,), cpus=1, mem_gb=10.0)
    client = agent_client(server)

    def sync_with(sizes: dict | None) -> list[dict]:
        body = {"sample": usage_sample(), "running": [str(lease.lease_id)], "reports": []}
        if sizes is not None:
            body["sizes"] = sizes
        response = client.post(SYNC, data=json.dumps(body), content_type="application/json")
        assert response.status_code == 200, response.content[:2000]
        return response.json()["commands"]

    assert sync_with({str(lease.lease_id): [1, 10.0]}) == []  # the size it applies is the service's
    scheduling_round_run()
    lease.refresh_from_db()
    resize = {
        "kind": "resize",
        "lease_id": str(lease.lease_id),
        "num_cpus": lease.num_cpus,
        "mem_gb": lease.mem_gb,
    }
    assert sync_with({str(lease.lease_id): [1, 10.0]}) == [resize]
    assert sync_with({str(lease.lease_id): [1, 10.0]}) == [resize]  # repeated until applied
    assert sync_with({str(lease.lease_id): [lease.num_cpus, lease.mem_gb]}) == []
    assert sync_with(None) == []  # an agent without the feature sends no sizes: never a resize
    assert synced(client, running=[lease.lease_id])["commands"] == []
    bad = client.post(
        SYNC,
        data=json.dumps({"sample": usage_sample(), "running": [], "sizes": {"not-a-lease": [1, 2]}}),
        content_type="application/json",
    )
    assert bad.status_code == 400


def test_registration_records_whether_the_agent_resizes_live():
    server = make_server("gpu01", gpus=1)
    client = agent_client(server)
    inventory = {
        "num_cpus": 12,
        "mem_gb": 250.0,
        "gpus": [{"index": 0, "uuid": "GPU-resize-0"}],
        "features": ["resize"],
    }
    assert client.post("/api/v1/agent/register", inventory, format="json").status_code == 200
    server.refresh_from_db()
    assert server.live_resize is True
    inventory.pop("features")  # an older agent
    assert client.post("/api/v1/agent/register", inventory, format="json").status_code == 200
    server.refresh_from_db()
    assert server.live_resize is False
