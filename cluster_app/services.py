"""Every state change of the hardware: servers, GPUs and agent credentials."""

import hashlib
import secrets
from collections.abc import Sequence
from dataclasses import dataclass

from django.db import transaction

from cluster_app.models import AgentCredential, Gpu, Server

AGENT_TOKEN_BYTES = 32


@dataclass(frozen=True)
class GpuSpec:
    """What an agent (or an admin) says about one GPU."""

    index: int
    uuid: str
    model: str = ""
    memory_mb: int = 0


def agent_token_digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


@transaction.atomic
def server_create(
    *,
    name: str,
    num_cpus: int,
    mem_gb: float,
    gpus: Sequence[GpuSpec],
    hostname: str = "",
    gpu_model: str = "",
    storage_mbps: float = 0.0,
    nic_gbps: float = 0.0,
) -> Server:
    """Create a server with its GPUs in one transaction (constraints reject bad inventories)."""
    server = Server.objects.create(
        name=name,
        hostname=hostname,
        gpu_model=gpu_model,
        num_gpus=len(gpus),
        num_cpus=num_cpus,
        mem_gb=mem_gb,
        storage_mbps=storage_mbps,
        nic_gbps=nic_gbps,
    )
    Gpu.objects.bulk_create(
        Gpu(server=server, index=g.index, uuid=g.uuid, model=g.model or gpu_model, memory_mb=g.memory_mb)
        for g in gpus
    )
    return server


def agent_credential_issue(*, server: Server) -> str:
    """Issue a new agent token for `server` and return it; only its digest is stored."""
    token = secrets.token_urlsafe(AGENT_TOKEN_BYTES)
    AgentCredential.objects.create(
        server=server, token_digest=agent_token_digest(token), token_prefix=token[:8]
    )
    return token
