"""Only a server whose agent registered takes work (issue 34, item 2): a server made by `node_token` whose
agent never registered, or whose registration was refused, gets nothing from the real round, and its
syncs are refused; staff can drain it before its agent first appears."""

from __future__ import annotations

from datetime import timedelta
from io import StringIO

import pytest
from django.core.management import call_command
from django.utils import timezone
from rest_framework.test import APIClient

from cluster_app.models import GpuUsageSample, NodeState, Server, ServerHeartbeat, UsageSample
from scheduler_app.models import Allocation, JobState
from scheduler_app.services.nodes import node_liveness_sweep_run
from scheduler_app.services.rounds import scheduling_round_run
from tests.api.helpers import SYNC, lease_of, make_server, submit, sync, synced, usage_sample
from tests.factories import heartbeat_at

pytestmark = pytest.mark.django_db
REGISTER = "/api/v1/agent/register"


@pytest.fixture(autouse=True)
def rounds(fifo_tune):
    """FIFO + tune; the tests run the rounds themselves."""


def node_token(name: str, gpus: int = 4) -> APIClient:
    """`manage.py node_token NAME` as an operator runs it; a client holding the printed token."""
    out = StringIO()
    call_command("node_token", name, "--gpus", str(gpus), stdout=out, stderr=StringIO())
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {out.getvalue().strip()}")
    return client


def inventory(name: str, uuids: list[str]) -> dict:
    return {
        "hostname": name,
        "num_cpus": 12,
        "mem_gb": 250.0,
        "gpus": [{"index": i, "uuid": u, "model": "V100", "memory_mb": 32768} for i, u in enumerate(uuids)],
    }


def staff_client(staff_user) -> APIClient:
    client = APIClient()
    client.force_authenticate(staff_user)
    return client


def placed_on(server_name: str) -> int:
    return Allocation.objects.filter(server__name=server_name).count()


def test_ghost_servers_get_no_work_and_their_syncs_are_refused(user):
    real = make_server("gpu01", gpus=4, cpus=12, mem_gb=250)
    never = node_token("ghost1")  # synced without registering
    refused = node_token("ghost2")  # synced after a refused registration
    taken = [f"GPU-gpu01-{i}" for i in range(4)]  # the real server's
    conflict = refused.post(REGISTER, inventory("ghost2", taken), format="json")
    assert conflict.status_code == 409

    for client in (never, refused):
        response = sync(client, sample=usage_sample(cpu_util_pct=5.0))
        assert response.status_code == 409
        body = response.json()
        assert body["code"] == "not_registered" and "/api/v1/agent/register" in body["detail"]
    # Nothing stored, nothing revived: the ghosts wait for their agents.
    assert not UsageSample.objects.exists() and not GpuUsageSample.objects.exists()
    assert not ServerHeartbeat.objects.filter(server__name__startswith="ghost").exists()
    ghost1, ghost2 = Server.objects.get(name="ghost1"), Server.objects.get(name="ghost2")
    assert ghost1.state == ghost2.state == NodeState.NOT_RESPONDING
    assert ghost1.state_reason == "waiting for its agent to register"
    assert ghost2.state_reason.startswith("registration refused: GPU UUIDs held by another server")
    # Silent for long, they go DOWN as any server does, still saying what they wait for or why.
    later = timezone.now() + timedelta(days=1)
    heartbeat_at(real, later)  # the real server's agent is heard from all along
    node_liveness_sweep_run(now=later)
    assert dict(Server.objects.filter(name__startswith="ghost").values_list("name", "state")) == {
        "ghost1": NodeState.DOWN,
        "ghost2": NodeState.DOWN,
    }
    assert Server.objects.get(name="ghost1").state_reason == "waiting for its agent to register"
    assert Server.objects.get(name="ghost2").state_reason.startswith("registration refused: ")

    # Three 4-GPU jobs, one server's worth of real GPUs: the real round places one, on the real server.
    jobs = [submit(user, gpus=4, name=f"j{i}") for i in range(3)]
    scheduling_round_run()
    states = []
    for job in jobs:
        job.refresh_from_db()
        states.append(job.state)
    assert sorted(states) == [JobState.PENDING, JobState.PENDING, JobState.RUNNING]
    assert placed_on("gpu01") == 1 and placed_on("ghost1") == placed_on("ghost2") == 0

    # An older version let a ghost's sync make it IDLE: even so, a round places nothing on it.
    Server.objects.filter(name__startswith="ghost").update(state=NodeState.IDLE, state_reason="")
    scheduling_round_run()
    assert placed_on("ghost1") == placed_on("ghost2") == 0
    assert Allocation.objects.filter(gpu_holds__gpu__uuid__startswith="unregistered-").count() == 0

    # Once its agent registers its real GPUs, a ghost is a server like any other.
    Server.objects.filter(name__startswith="ghost").update(state=NodeState.NOT_RESPONDING)
    registered = never.post(REGISTER, inventory("ghost1", [f"GPU-g1-{i}" for i in range(4)]), format="json")
    assert registered.status_code == 200
    assert synced(never)["state"] == NodeState.IDLE
    scheduling_round_run()
    assert placed_on("ghost1") == 1 and placed_on("ghost2") == 0
    assert placed_on("gpu01") == 1 and real.state == NodeState.IDLE


def test_staff_drain_a_server_before_its_agent_first_appears(staff_user, user):
    agent = node_token("gpu07")
    staff = staff_client(staff_user)
    response = staff.post("/api/v1/servers/gpu07/drain/", {"reason": "burn-in first"}, format="json")
    assert response.status_code == 200
    assert response.json() == {"name": "gpu07", "state": "DRAINED", "state_reason": "burn-in first"}

    # Its agent registers: real GPUs, alive, but still out of service until staff resume it.
    register = agent.post(REGISTER, inventory("gpu07", [f"GPU-7-{i}" for i in range(4)]), format="json")
    assert register.status_code == 200
    assert synced(agent)["state"] == NodeState.DRAINED
    job = submit(user, gpus=2)
    scheduling_round_run()
    job.refresh_from_db()
    assert job.state == JobState.PENDING

    assert staff.post("/api/v1/servers/gpu07/resume/").json()["state"] == "IDLE"
    scheduling_round_run()
    assert lease_of(job).server.name == "gpu07"


def test_resuming_a_server_drained_before_registration_waits_for_its_agent(staff_user):
    node_token("gpu08")
    staff = staff_client(staff_user)
    assert staff.post("/api/v1/servers/gpu08/drain/").json()["state"] == "DRAINED"
    answer = staff.post("/api/v1/servers/gpu08/resume/").json()
    assert answer["state"] == "NOT_RESPONDING"
    assert answer["state_reason"] == "waiting for its agent to register"


def test_the_cluster_overview_counts_no_placeholder_gpu_as_schedulable(staff_user):
    make_server("gpu01", gpus=4)
    node_token("ghost1", gpus=8)
    Server.objects.filter(name="ghost1").update(state=NodeState.IDLE)  # as an older version left it
    totals = staff_client(staff_user).get("/api/v1/cluster/").json()["totals"]
    assert totals["gpus"] == 12 and totals["schedulable_gpus"] == 4


def test_the_sync_path_is_documented_with_its_409():
    schema = APIClient().get("/api/schema/", {"format": "json"}).json()
    assert "409" in schema["paths"][SYNC]["post"]["responses"]


def test_the_admin_shows_when_a_server_registered_and_does_not_let_staff_set_it(client, staff_user):
    node_token("gpu09")
    server = Server.objects.get(name="gpu09")
    client.force_login(staff_user)
    assert client.get("/admin/cluster_app/server/").status_code == 200
    page = client.get(f"/admin/cluster_app/server/{server.pk}/change/")
    assert page.status_code == 200
    assert "registered_at" not in page.context["adminform"].form.fields  # read-only: shown, not a field
