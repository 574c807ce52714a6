"""Database constraints of the hardware tables, checked by the database itself."""

import pytest
from django.db import IntegrityError, transaction

from cluster_app.models import AgentCredential, Gpu, Server
from cluster_app.services import GpuSpec, agent_credential_issue, agent_token_digest, server_create
from tests.factories import GpuFactory, ServerFactory

pytestmark = pytest.mark.django_db


def test_server_gpu_count_must_be_positive():
    with pytest.raises(IntegrityError), transaction.atomic():
        Server.objects.create(name="zero", num_gpus=0, num_cpus=24, mem_gb=500)


@pytest.mark.parametrize(
    "field,value", [("num_cpus", 0), ("mem_gb", 0), ("mem_gb", -1), ("storage_mbps", -5)]
)
def test_server_capacities_must_be_positive(field, value):
    fields = {"name": "bad", "num_gpus": 8, "num_cpus": 24, "mem_gb": 500.0, field: value}
    with pytest.raises(IntegrityError), transaction.atomic():
        Server.objects.create(**fields)


def test_gpu_index_unique_per_server():
    server = ServerFactory(with_gpus=False)
    GpuFactory(server=server, index=0)
    with pytest.raises(IntegrityError), transaction.atomic():
        GpuFactory(server=server, index=0)


def test_same_gpu_index_allowed_on_different_servers():
    GpuFactory(server=ServerFactory(with_gpus=False), index=0)
    GpuFactory(server=ServerFactory(with_gpus=False), index=0)
    assert Gpu.objects.filter(index=0).count() == 2


def test_gpu_uuid_unique_across_cluster():
    GpuFactory(uuid="GPU-same")
    with pytest.raises(IntegrityError), transaction.atomic():
        GpuFactory(uuid="GPU-same")


def test_server_create_rejects_duplicate_uuids_atomically():
    gpus = [GpuSpec(index=0, uuid="GPU-dup"), GpuSpec(index=1, uuid="GPU-dup")]
    with pytest.raises(IntegrityError):
        server_create(name="s1", num_cpus=24, mem_gb=500, gpus=gpus)
    assert not Server.objects.filter(name="s1").exists()  # nothing half-written


def test_agent_credential_stores_only_a_digest():
    server = ServerFactory()
    token = agent_credential_issue(server=server)
    cred = AgentCredential.objects.get(server=server)
    assert token not in (cred.token_digest, cred.token_prefix)
    assert cred.token_digest == agent_token_digest(token)
    assert len(token) >= 40


def test_agent_token_never_reads_as_an_option_on_the_agents_command_line(monkeypatch):
    # token_urlsafe starts with "-" one time in 64; `--token -x…` then failed as a missing argument.
    from agent.cli import build_parser
    from cluster_app.services import nodes

    monkeypatch.setattr(nodes.secrets, "token_urlsafe", lambda n: "-" + "x" * 42)
    token = agent_credential_issue(server=ServerFactory())
    args = build_parser().parse_args(["--server", "http://attune:8000", "--token", token])
    assert args.token == token
    cred = AgentCredential.objects.get(token_digest=agent_token_digest(token))
    assert cred.token_prefix == token[:12] and cred.token_prefix.startswith("att_")
