"""Hardware services: node_token, liveness sweep, server states, drain/resume, usage roll-up."""

from datetime import timedelta

import pytest
from django.core.management import call_command
from django.utils import timezone

from cluster_app.models import AgentCredential, GpuUsageSample, NodeState, Server, UsageSample
from cluster_app.selectors import agent_credential_find
from cluster_app.services import (
    GpuSpec,
    NodeInventory,
    ServerStateError,
    agent_credential_revoke,
    node_liveness_sweep,
    node_register,
    server_drain,
    server_resume,
    server_states_refresh,
    usage_samples_rollup,
)
from tests.factories import ServerFactory

pytestmark = pytest.mark.django_db


def test_node_token_creates_a_waiting_server_and_prints_a_working_token(capsys):
    call_command("node_token", "gpu07", "--gpus", "2", "--cpus", "16", "--mem-gb", "128")
    token = capsys.readouterr().out.strip()
    server = Server.objects.get(name="gpu07")
    assert (server.num_gpus, server.num_cpus, server.mem_gb) == (2, 16, 128.0)
    assert server.state == NodeState.NOT_RESPONDING  # nothing is placed before its agent registers
    assert agent_credential_find(token=token).server == server
    assert token not in AgentCredential.objects.get().token_digest
    # A second call keeps the server and issues another token.
    call_command("node_token", "gpu07")
    second = capsys.readouterr().out.strip()
    assert second != token and Server.objects.count() == 1
    assert agent_credential_find(token=second).server == server


def test_a_revoked_credential_is_not_found():
    call_command("node_token", "gpu07")
    credential = AgentCredential.objects.get()
    agent_credential_revoke(credential=credential)
    assert not AgentCredential.objects.filter(revoked_at__isnull=True).exists()


def test_register_moves_a_uuid_between_indices():
    server = ServerFactory(name="n1", num_gpus=2)
    swapped = [GpuSpec(index=0, uuid="GPU-n1-1"), GpuSpec(index=1, uuid="GPU-n1-0")]
    node_register(server=server, inventory=NodeInventory(num_cpus=8, mem_gb=64, gpus=swapped))
    assert list(server.gpus.order_by("index").values_list("uuid", flat=True)) == ["GPU-n1-1", "GPU-n1-0"]


def test_register_deletes_gpus_without_history_and_adds_new_ones():
    server = ServerFactory(name="n1", num_gpus=2)
    gpus = [GpuSpec(index=i, uuid=f"GPU-new-{i}") for i in (0, 2, 3)]
    node_register(server=server, inventory=NodeInventory(num_cpus=8, mem_gb=64, gpus=gpus))
    server.refresh_from_db()
    assert server.num_gpus == 3
    assert list(server.gpus.values_list("index", flat=True)) == [0, 2, 3]


def test_liveness_sweep_not_responding_then_down(settings):
    settings.ATTUNE_NODE_NOT_RESPONDING_AFTER_S = 30
    settings.ATTUNE_NODE_DOWN_AFTER_S = 120
    now = timezone.now()
    fresh = ServerFactory(name="fresh", last_heartbeat_at=now - timedelta(seconds=5))
    quiet = ServerFactory(name="quiet", last_heartbeat_at=now - timedelta(seconds=60))
    drained = ServerFactory(
        name="drained", last_heartbeat_at=now - timedelta(hours=1), state=NodeState.DRAINED
    )

    sweep = node_liveness_sweep(now=now)
    assert sweep.not_responding == ["quiet"] and sweep.down == []
    assert node_liveness_sweep(now=now + timedelta(seconds=30)).down == []
    assert node_liveness_sweep(now=now + timedelta(seconds=61)).down == ["quiet"]
    for server, state in (
        (fresh, NodeState.NOT_RESPONDING),
        (quiet, NodeState.DOWN),
        (drained, NodeState.DRAINED),
    ):
        server.refresh_from_db()
        assert server.state == state, server.name
    quiet.refresh_from_db()
    assert quiet.state_reason.startswith("no heartbeat since")


def test_a_server_never_heard_from_counts_from_its_creation(settings):
    settings.ATTUNE_NODE_NOT_RESPONDING_AFTER_S = 30
    server = ServerFactory(name="silent")
    assert node_liveness_sweep(now=server.created_at + timedelta(seconds=10)).not_responding == []
    assert node_liveness_sweep(now=server.created_at + timedelta(seconds=31)).not_responding == ["silent"]


def test_server_states_follow_occupancy_and_drains_finish():
    idle = ServerFactory(name="a", num_gpus=4, state=NodeState.MIXED)
    mixed = ServerFactory(name="b", num_gpus=4)
    full = ServerFactory(name="c", num_gpus=4)
    draining = ServerFactory(name="d", num_gpus=4, state=NodeState.DRAINING)
    down = ServerFactory(name="e", num_gpus=4, state=NodeState.DOWN)
    assert server_states_refresh(busy_gpus={mixed.pk: 1, full.pk: 4, down.pk: 2}) == 4
    states = dict(Server.objects.values_list("name", "state"))
    assert states == {"a": "IDLE", "b": "MIXED", "c": "ALLOCATED", "d": "DRAINED", "e": "DOWN"}
    assert idle and draining


def test_drain_and_resume_rules():
    server = ServerFactory(name="a")
    assert server_drain(server=server, busy_gpus=2, reason="fans").state == NodeState.DRAINING
    assert server_drain(server=server, busy_gpus=2).state == NodeState.DRAINING  # idempotent
    assert server_resume(server=server, busy_gpus=2).state == NodeState.MIXED
    down = ServerFactory(name="b", state=NodeState.DOWN)
    with pytest.raises(ServerStateError):
        server_resume(server=down, busy_gpus=0)
    with pytest.raises(ServerStateError):
        server_drain(server=down, busy_gpus=0)


def test_usage_rollup_averages_old_raw_samples_per_minute(settings):
    settings.ATTUNE_USAGE_RAW_RETENTION_DAYS = 2
    server = ServerFactory(name="a", num_gpus=1)
    gpu = server.gpus.get()
    now = timezone.now().replace(second=30, microsecond=0)
    old_minute = (now - timedelta(days=3)).replace(second=0)
    for k, cpu in enumerate((10.0, 20.0, 30.0)):
        at = old_minute + timedelta(seconds=5 + 10 * k)
        UsageSample.objects.create(server=server, sampled_at=at, cpu_util_pct=cpu, mem_used_gb=cpu)
        GpuUsageSample.objects.create(gpu=gpu, sampled_at=at, util_pct=cpu * 2, mem_used_mb=100)
    recent = UsageSample.objects.create(
        server=server, sampled_at=now - timedelta(hours=1), cpu_util_pct=5, mem_used_gb=5
    )

    assert usage_samples_rollup(now=now) == 4  # 3 -> 1 for the server, 3 -> 1 for the GPU
    rolled = UsageSample.objects.exclude(pk=recent.pk).get()
    assert rolled.sampled_at == old_minute and rolled.cpu_util_pct == pytest.approx(20.0)
    assert GpuUsageSample.objects.get().util_pct == pytest.approx(40.0)
    assert UsageSample.objects.filter(pk=recent.pk).exists()
    assert usage_samples_rollup(now=now) == 0  # nothing raw is left in the old range


def test_admin_actions_drain_resume_and_issue_tokens(client, staff_user):
    server = ServerFactory(name="gpu09")
    client.force_login(staff_user)
    url = "/admin/cluster_app/server/"
    for action, state in (("drain", NodeState.DRAINED), ("resume", NodeState.IDLE)):
        response = client.post(url, {"action": action, "_selected_action": [server.pk]}, follow=True)
        assert response.status_code == 200
        server.refresh_from_db()
        assert server.state == state
    response = client.post(url, {"action": "issue_agent_token", "_selected_action": [server.pk]}, follow=True)
    (message,) = [str(m) for m in response.context["messages"]]
    token = message.rsplit(" ", 1)[-1]
    assert agent_credential_find(token=token).server == server
