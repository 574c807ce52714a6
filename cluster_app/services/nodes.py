"""Servers, their GPUs and agent credentials, and node states: registration, liveness, drains."""

import logging
import secrets
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.db import transaction
from django.db.models.deletion import ProtectedError
from django.utils import timezone

from cluster_app.conf import node_conf
from cluster_app.models import AgentCredential, Gpu, NodeState, Server, ServerHeartbeat
from cluster_app.tokens import agent_token_digest

logger = logging.getLogger(__name__)

AGENT_TOKEN_BYTES = 32
# Every issued token starts with this: a leading "-" from token_urlsafe made `--token TOKEN` read as a
# missing argument (one token in 64), and a fixed prefix lets secret scanners recognise a leaked token.
AGENT_TOKEN_PREFIX = "att_"
# Credentials are looked up on every agent call; their last use is written at most this often.
CREDENTIAL_TOUCH_EVERY = timedelta(seconds=60)
# States the liveness sweep watches. DRAINED servers are out of service on purpose (their agent may be
# stopped for maintenance), so their silence is not a failure.
WATCHED_STATES = (NodeState.IDLE, NodeState.MIXED, NodeState.ALLOCATED, NodeState.DRAINING)
OCCUPANCY_STATES = (NodeState.IDLE, NodeState.MIXED, NodeState.ALLOCATED)
UNRESPONSIVE_STATES = (NodeState.NOT_RESPONDING, NodeState.DOWN)


class GpuConflictError(Exception):
    """An agent reported GPU UUIDs that another server already holds."""

    def __init__(self, uuids: Sequence[str]) -> None:
        self.uuids = sorted(uuids)
        super().__init__(f"GPU UUIDs held by another server: {', '.join(self.uuids)}")


class ServerStateError(Exception):
    """A state change that the server's current state does not allow (e.g. resuming a DOWN server)."""


class ServerNotRegisteredError(Exception):
    """An agent synced for a server whose inventory no agent has registered (placeholder GPUs)."""

    def __init__(self, name: str) -> None:
        self.name = name
        super().__init__(
            f"server {name} has not registered: its agent must POST /api/v1/agent/register (an agent "
            "does at start) before it syncs; the server takes no work until then"
        )


# What an unregistered server says while it waits (node_token, the admin, a resume before registration).
WAITING_FOR_REGISTRATION = "waiting for its agent to register"


@dataclass(frozen=True)
class GpuSpec:
    """What an agent (or an admin) says about one GPU."""

    index: int
    uuid: str
    model: str = ""
    memory_mb: int = 0


@dataclass(frozen=True)
class NodeInventory:
    """What an agent registers: the server's allocatable CPU cores, memory (GB) and its GPUs."""

    num_cpus: int
    mem_gb: float
    gpus: Sequence[GpuSpec]
    hostname: str = ""
    agent_version: str = ""
    storage_mbps: float = 0.0
    address: str = ""  # where the node's peers reach it (a multi-node job's MASTER_ADDR)
    time_scale: float = 1.0  # a fake node's --time-scale; forecasts turn profile time into wall time
    features: frozenset[str] = frozenset()  # "resize": it resizes running leases in place


@dataclass
class LivenessSweep:
    """Names of the servers the sweep moved to NOT_RESPONDING and to DOWN."""

    not_responding: list[str] = field(default_factory=list)
    down: list[str] = field(default_factory=list)


def occupancy_state(*, num_gpus: int, busy_gpus: int) -> str:
    """IDLE / MIXED / ALLOCATED from how many of the server's GPUs are held by active leases."""
    if busy_gpus <= 0:
        return NodeState.IDLE
    if busy_gpus >= num_gpus:
        return NodeState.ALLOCATED
    return NodeState.MIXED


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
    state: str = NodeState.IDLE,
    state_reason: str = "",
    registered: bool = True,
) -> Server:
    """Create a server with its GPUs in one transaction (constraints reject bad inventories).

    `registered`: the inventory is real (seed data, benchmarks, tests) and the server may take work in
    its state; False: placeholders (node_token), and the server takes no work until its agent registers.
    """
    server = Server.objects.create(
        name=name,
        hostname=hostname,
        gpu_model=gpu_model,
        num_gpus=len(gpus),
        num_cpus=num_cpus,
        mem_gb=mem_gb,
        storage_mbps=storage_mbps,
        nic_gbps=nic_gbps,
        state=state,
        state_reason=state_reason,
        registered_at=timezone.now() if registered else None,
    )
    Gpu.objects.bulk_create(
        Gpu(server=server, index=g.index, uuid=g.uuid, model=g.model or gpu_model, memory_mb=g.memory_mb)
        for g in gpus
    )
    return server


def agent_credential_issue(*, server: Server) -> str:
    """Issue a new agent token for `server` and return it; only its digest is stored."""
    token = AGENT_TOKEN_PREFIX + secrets.token_urlsafe(AGENT_TOKEN_BYTES)
    # The prefix shown to admins keeps 8 random characters after the fixed part.
    AgentCredential.objects.create(
        server=server,
        token_digest=agent_token_digest(token),
        token_prefix=token[: len(AGENT_TOKEN_PREFIX) + 8],
    )
    return token


def agent_credential_revoke(*, credential: AgentCredential) -> None:
    AgentCredential.objects.filter(pk=credential.pk, revoked_at__isnull=True).update(
        revoked_at=timezone.now()
    )


def agent_credential_touch(*, credential: AgentCredential, now: datetime | None = None) -> None:
    """Record that the credential was used; throttled so that frequent polls cost no write each."""
    now = now or timezone.now()
    if credential.last_used_at is None or now - credential.last_used_at >= CREDENTIAL_TOUCH_EVERY:
        AgentCredential.objects.filter(pk=credential.pk).update(last_used_at=now)
        credential.last_used_at = now


def server_revive(server: Server, *, busy_gpus: int) -> None:
    """A server heard from again leaves NOT_RESPONDING / DOWN for its occupancy state, once registered."""
    if server.state in UNRESPONSIVE_STATES and server.registered_at is not None:
        logger.info("server %s is back (was %s)", server.name, server.state)
        server.state = occupancy_state(num_gpus=server.num_gpus, busy_gpus=busy_gpus)
        server.state_reason = ""


@transaction.atomic
def node_register(
    *, server: Server, inventory: NodeInventory, busy_gpus: int = 0, now: datetime | None = None
) -> Server:
    """Replace the server's inventory with what its agent reports; marks the server alive.

    GPUs are matched by index: a reported index updates its row (UUID, model, memory), a new index
    adds a row, and an index no longer reported is deleted, or retired when allocation history still
    points at it. Raises GpuConflictError if another server holds one of the UUIDs.
    """
    now = now or timezone.now()
    uuids = [g.uuid for g in inventory.gpus]
    taken = list(
        Gpu.objects.filter(uuid__in=uuids).exclude(server_id=server.pk).values_list("uuid", flat=True)
    )
    if taken:
        raise GpuConflictError(taken)
    # The server row lock serialises registration with scheduling rounds and the liveness sweep, which
    # must not see the GPU rows half-replaced.
    server = Server.objects.select_for_update().get(pk=server.pk)
    existing = {g.index: g for g in Gpu.objects.filter(server=server)}
    reported = {g.index: g for g in inventory.gpus}
    # Park UUIDs that change first, so that no statement ever sees one UUID on two rows (a GPU can
    # move between indices, e.g. after a driver reorders devices).
    moving = [g for i, g in existing.items() if i not in reported or reported[i].uuid != g.uuid]
    for g in moving:
        g.uuid = f"retired-{g.pk}"
    Gpu.objects.bulk_update(moving, ["uuid"])
    updated, created = [], []
    for index, spec in sorted(reported.items()):
        row = existing.get(index)
        if row is None:
            created.append(
                Gpu(server=server, index=index, uuid=spec.uuid, model=spec.model, memory_mb=spec.memory_mb)
            )
        else:
            row.uuid, row.model, row.memory_mb, row.retired_at = spec.uuid, spec.model, spec.memory_mb, None
            updated.append(row)
    Gpu.objects.bulk_update(updated, ["uuid", "model", "memory_mb", "retired_at"])
    Gpu.objects.bulk_create(created)
    for index, row in existing.items():
        if index in reported:
            continue
        try:
            with transaction.atomic():
                row.delete()
        except ProtectedError:
            Gpu.objects.filter(pk=row.pk).update(retired_at=now)

    server.num_gpus = len(reported)
    server.num_cpus = inventory.num_cpus
    server.mem_gb = inventory.mem_gb
    server.storage_mbps = inventory.storage_mbps
    server.hostname = inventory.hostname or server.hostname
    server.address = inventory.address or server.address
    server.agent_version = inventory.agent_version
    server.time_scale = inventory.time_scale
    server.live_resize = "resize" in inventory.features
    server.gpu_model = next((g.model for g in inventory.gpus if g.model), server.gpu_model)
    server.registered_at = now  # from now on the server may take work (its state permitting)
    server_revive(server, busy_gpus=busy_gpus)
    server.save()
    server_heartbeat_record(server=server, now=now)
    logger.info(
        "server %s registered: %d GPUs, %d cores, %.1f GB",
        server.name,
        len(reported),
        inventory.num_cpus,
        inventory.mem_gb,
    )
    return server


# How a never-registered server's state_reason says that its agent's registration was refused.
REFUSED_PREFIX = "registration refused: "


def node_registration_refused(*, server: Server, reason: str) -> None:
    """Say on a never-registered server why its agent's registration was refused (shown beside its
    state); a registered server keeps its inventory and its reason."""
    Server.objects.filter(pk=server.pk, registered_at__isnull=True).update(
        state_reason=(REFUSED_PREFIX + reason)[: Server._meta.get_field("state_reason").max_length]
    )


def server_heartbeat_record(*, server: Server, now: datetime) -> None:
    """Record that `server`'s agent was heard from at `now` (an upsert, one statement); the live
    PostgreSQL heartbeat does the same inside its own statement (services/heartbeat.py)."""
    ServerHeartbeat.objects.bulk_create(
        [ServerHeartbeat(server=server, at=now)],
        update_conflicts=True,
        unique_fields=["server"],
        update_fields=["at"],
    )
    server.heartbeat = ServerHeartbeat(server=server, at=now)


def node_liveness_sweep(*, now: datetime | None = None) -> LivenessSweep:
    """Mark silent servers NOT_RESPONDING, and those silent for longer DOWN. Call inside a transaction.

    Silence counts from the last heartbeat (or from the server's creation if it never sent one).
    Every server row is locked first (see cluster_app.selectors.servers_lock_all for the lock order),
    then the heartbeats are read, so every one committed by then counts. A live server's heartbeat
    does not wait for these locks (it writes ServerHeartbeat only): one committed between that read
    and this commit leaves its server NOT_RESPONDING until its next heartbeat, which revives it under
    the server's lock. A server goes DOWN only from NOT_RESPONDING, whose heartbeats take that lock,
    so no server goes DOWN while its agent is heard from.
    """
    conf = node_conf()
    now = now or timezone.now()
    result = LivenessSweep()
    nr_before = now - timedelta(seconds=conf.not_responding_after_s)
    down_before = now - timedelta(seconds=conf.down_after_s)
    servers = list(Server.objects.select_for_update(no_key=True).order_by("id"))
    heard = dict(ServerHeartbeat.objects.values_list("server_id", "at"))
    for server in servers:
        seen = heard.get(server.pk) or server.created_at
        if server.state in WATCHED_STATES and seen < nr_before:
            new_state, names = NodeState.NOT_RESPONDING, result.not_responding
        elif server.state == NodeState.NOT_RESPONDING and seen < down_before:
            new_state, names = NodeState.DOWN, result.down
        else:
            continue
        reason = f"no heartbeat since {seen:%Y-%m-%d %H:%M:%S %Z}"
        if server.registered_at is None:  # it never had one: keep saying what it waits for, or why
            reason = server.state_reason or WAITING_FOR_REGISTRATION
        Server.objects.filter(pk=server.pk).update(state=new_state, state_reason=reason)
        names.append(server.name)
        logger.warning("server %s: %s -> %s (%s)", server.name, server.state, new_state, reason)
    return result


def server_states_refresh(*, busy_gpus: Mapping[int, int]) -> int:
    """Bring IDLE/MIXED/ALLOCATED up to date and finish drains; `busy_gpus`: server id -> GPUs held.

    Call inside a transaction that holds the server rows (the round and the sweep do); returns how
    many servers changed state.
    """
    changes: dict[str, list[int]] = defaultdict(list)
    for server_id, state, num_gpus in Server.objects.values_list("id", "state", "num_gpus"):
        busy = busy_gpus.get(server_id, 0)
        if state in OCCUPANCY_STATES:
            target = occupancy_state(num_gpus=num_gpus, busy_gpus=busy)
        elif state == NodeState.DRAINING and busy == 0:
            target = NodeState.DRAINED
        else:
            continue
        if target != state:
            changes[target].append(server_id)
    for target, ids in changes.items():
        Server.objects.filter(pk__in=ids).update(state=target)
    return sum(len(ids) for ids in changes.values())


@transaction.atomic
def server_drain(*, server: Server, busy_gpus: int, reason: str = "") -> Server:
    """Stop placing work on `server`: DRAINING while its leases run, DRAINED once it holds none.

    A live server drains; so does one whose agent never registered (it holds nothing: DRAINED), so that
    staff can keep a server out of service before its agent first appears; it stays DRAINED when the
    agent registers, until resumed. A registered server that is silent (NOT_RESPONDING, DOWN) cannot:
    the liveness sweep owns its state until its agent is back.
    """
    server = Server.objects.select_for_update().get(pk=server.pk)
    if server.state in (NodeState.DRAINING, NodeState.DRAINED):
        return server
    if server.state not in OCCUPANCY_STATES and server.registered_at is not None:
        raise ServerStateError(f"server {server.name} is {server.state}; only a live server can be drained")
    server.state = NodeState.DRAINED if busy_gpus == 0 else NodeState.DRAINING
    server.state_reason = reason or "drained by an administrator"
    server.save(update_fields=["state", "state_reason"])
    logger.info("server %s: %s (%s)", server.name, server.state, server.state_reason)
    return server


@transaction.atomic
def server_resume(*, server: Server, busy_gpus: int) -> Server:
    """Put a drained (or draining) server back into service."""
    server = Server.objects.select_for_update().get(pk=server.pk)
    if server.state in OCCUPANCY_STATES:
        return server
    if server.state not in (NodeState.DRAINING, NodeState.DRAINED):
        raise ServerStateError(
            f"server {server.name} is {server.state}; it comes back by itself when its agent reports"
        )
    if server.registered_at is None:
        # Back to waiting: it takes work once its agent registers (node_register revives it).
        server.state, server.state_reason = NodeState.NOT_RESPONDING, WAITING_FOR_REGISTRATION
    else:
        server.state = occupancy_state(num_gpus=server.num_gpus, busy_gpus=busy_gpus)
        server.state_reason = ""
    server.save(update_fields=["state", "state_reason"])
    logger.info("server %s resumed: %s", server.name, server.state)
    return server
