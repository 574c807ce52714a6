"""Every state change of the hardware: servers, GPUs, agent credentials, node state and usage samples."""

import hashlib
import logging
import secrets
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from django.db import connection, transaction
from django.db.models import Avg, F, Max, Min, Model
from django.db.models.deletion import ProtectedError
from django.db.models.functions import Trunc
from django.utils import timezone

from cluster_app.conf import node_conf
from cluster_app.models import (
    AgentCredential,
    ClusterUsageMinute,
    Gpu,
    GpuUsageSample,
    NodeState,
    Server,
    UsageSample,
)
from cluster_app.usage_minutes import (
    MinuteSums,
    insert_new,
    minute_add,
    minute_of,
    minute_sums_from_samples,
    minutes_lock_for_rebuild,
)

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
# The per-minute usage sums are rebuilt this much history at a time.
REBUILD_CHUNK = timedelta(days=7)


class GpuConflictError(Exception):
    """An agent reported GPU UUIDs that another server already holds."""

    def __init__(self, uuids: Sequence[str]) -> None:
        self.uuids = sorted(uuids)
        super().__init__(f"GPU UUIDs held by another server: {', '.join(self.uuids)}")


class ServerStateError(Exception):
    """A state change that the server's current state does not allow (e.g. resuming a DOWN server)."""


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


@dataclass(frozen=True)
class GpuUsage:
    uuid: str
    util_pct: float
    mem_used_mb: float


@dataclass(frozen=True)
class UsageReport:
    """One heartbeat's usage reading; `sampled_at` is the agent's clock and the idempotency key."""

    sampled_at: datetime
    cpu_util_pct: float
    mem_used_gb: float
    gpus: Sequence[GpuUsage] = ()


@dataclass
class LivenessSweep:
    """Names of the servers the sweep moved to NOT_RESPONDING and to DOWN."""

    not_responding: list[str] = field(default_factory=list)
    down: list[str] = field(default_factory=list)


def agent_token_digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


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
        state=state,
        state_reason=state_reason,
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


def _revive(server: Server, *, busy_gpus: int) -> None:
    """A server heard from again leaves NOT_RESPONDING / DOWN for its occupancy state."""
    if server.state in UNRESPONSIVE_STATES:
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
    server.gpu_model = next((g.model for g in inventory.gpus if g.model), server.gpu_model)
    server.last_heartbeat_at = now
    _revive(server, busy_gpus=busy_gpus)
    server.save()
    logger.info(
        "server %s registered: %d GPUs, %d cores, %.1f GB",
        server.name,
        len(reported),
        inventory.num_cpus,
        inventory.mem_gb,
    )
    return server


@transaction.atomic(savepoint=False)  # no SAVEPOINT inside an agent's sync: two statements fewer
def node_heartbeat(
    *, server: Server, usage: UsageReport, busy_gpus: int = 0, now: datetime | None = None
) -> Server:
    """Mark the server alive and store its usage; a repeated `sampled_at` is stored once.

    Built for a thousand agents: it never waits for a scheduling round (see `_touch`), and on
    PostgreSQL its commit does not wait for the WAL flush (a crash may lose the last fraction of a
    second of samples and liveness, which the next sync restores; reports, whose acks promise
    storage, keep synchronous commits).
    """
    now = now or timezone.now()
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("SET LOCAL synchronous_commit TO OFF")
    # Insert-or-ignore on the (server, sampled_at) unique constraints makes a retried beat a no-op;
    # what did go in is added to the minute's cluster-wide sums (last, below).
    added = MinuteSums()
    stored = insert_new(
        UsageSample,
        ("server", "sampled_at"),
        [
            {
                "server_id": server.pk,
                "sampled_at": usage.sampled_at,
                "cpu_util_pct": usage.cpu_util_pct,
                "mem_used_gb": usage.mem_used_gb,
            }
        ],
        ("cpu_util_pct", "mem_used_gb"),
    )
    for cpu_util_pct, mem_used_gb in stored:
        added.servers_sampled += 1
        added.cpu_util_pct_cores_sum += cpu_util_pct * server.num_cpus
        added.cpu_cores_sum += server.num_cpus
        added.mem_used_gb_sum += mem_used_gb
        added.mem_capacity_gb_sum += server.mem_gb
    stored_gpus = _gpu_samples_insert_new(server, usage)
    added.gpu_samples = len(stored_gpus)
    added.gpu_util_pct_sum = sum(util_pct for (util_pct,) in stored_gpus)
    if server.state in UNRESPONSIVE_STATES:
        # Re-read under lock: the liveness sweep may be moving this very server to DOWN right now.
        server = Server.objects.select_for_update().get(pk=server.pk)
        _revive(server, busy_gpus=busy_gpus)
        Server.objects.filter(pk=server.pk).update(
            last_heartbeat_at=now, state=server.state, state_reason=server.state_reason
        )
        server.last_heartbeat_at = now
    elif _touch(server, now):
        server.last_heartbeat_at = now
    # Last: every heartbeat of this minute, from every server, waits on this row's lock until its
    # transaction commits, so it is taken after the other writes to keep that wait short.
    minute_add(minute=minute_of(usage.sampled_at), sums=added)
    return server


def _gpu_samples_insert_new(server: Server, usage: UsageReport) -> list[tuple[float]]:
    """Store the sample's GPU readings of `server`'s GPUs (by UUID; others ignored), each once per
    `sampled_at`; returns the utilisation of those stored.

    On PostgreSQL one statement resolves the UUIDs and inserts (INSERT ... SELECT over unnest'ed
    arrays, joined to the server's GPUs): every sync of every agent runs it. Elsewhere (the embedded
    SQLite) the GPU ids are read first.
    """
    if not usage.gpus:
        return []
    if connection.vendor == "postgresql":
        qn = connection.ops.quote_name
        samples, gpus = qn(GpuUsageSample._meta.db_table), qn(Gpu._meta.db_table)
        sql = (
            f"INSERT INTO {samples} (gpu_id, sampled_at, util_pct, mem_used_mb)"
            f" SELECT g.id, %s, v.util_pct, v.mem_used_mb"
            f" FROM unnest(%s::varchar[], %s::float8[], %s::float8[]) AS v(uuid, util_pct, mem_used_mb)"
            f" JOIN {gpus} g ON g.uuid = v.uuid AND g.server_id = %s"
            f" ON CONFLICT (gpu_id, sampled_at) DO NOTHING RETURNING util_pct"
        )
        params = [
            usage.sampled_at,
            [g.uuid for g in usage.gpus],
            [float(g.util_pct) for g in usage.gpus],
            [float(g.mem_used_mb) for g in usage.gpus],
            server.pk,
        ]
        with connection.cursor() as cursor:
            cursor.execute(sql, params)
            return cursor.fetchall()
    gpu_ids = dict(
        Gpu.objects.filter(server=server, uuid__in=[g.uuid for g in usage.gpus]).values_list("uuid", "id")
    )
    return insert_new(
        GpuUsageSample,
        ("gpu", "sampled_at"),
        [
            {
                "gpu_id": gpu_ids[g.uuid],
                "sampled_at": usage.sampled_at,
                "util_pct": g.util_pct,
                "mem_used_mb": g.mem_used_mb,
            }
            for g in usage.gpus
            if g.uuid in gpu_ids
        ],
        ("util_pct",),
    )


def _touch(server: Server, now: datetime) -> bool:
    """Set a live server's last_heartbeat_at unless a round holds its row; True when it was set.

    A round locks every server row for its whole transaction; with a thousand agents syncing, waiting
    for it would queue every sync behind every round. The liveness thresholds are several sync
    intervals long, so skipping one touch while a round runs costs nothing (Kubernetes moved node
    heartbeats off the Node object for the same contention). SQLite has no row locks: a plain UPDATE.
    """
    if connection.vendor != "postgresql":
        return Server.objects.filter(pk=server.pk).update(last_heartbeat_at=now) > 0
    table = connection.ops.quote_name(Server._meta.db_table)
    with connection.cursor() as cursor:
        cursor.execute(
            f"UPDATE {table} SET last_heartbeat_at = %s WHERE id = "
            f"(SELECT id FROM {table} WHERE id = %s FOR NO KEY UPDATE SKIP LOCKED)",
            [now, server.pk],
        )
        return cursor.rowcount > 0


def node_liveness_sweep(*, now: datetime | None = None) -> LivenessSweep:
    """Mark silent servers NOT_RESPONDING, and those silent for longer DOWN. Call inside a transaction.

    Silence counts from the last heartbeat (or from the server's creation if it never sent one).
    Every server row is locked first (see cluster_app.selectors.servers_lock_all for the lock order),
    so a heartbeat that arrives meanwhile waits and then revives the server.
    """
    conf = node_conf()
    now = now or timezone.now()
    result = LivenessSweep()
    nr_before = now - timedelta(seconds=conf.not_responding_after_s)
    down_before = now - timedelta(seconds=conf.down_after_s)
    for server in Server.objects.select_for_update(no_key=True).order_by("id"):
        seen = server.last_heartbeat_at or server.created_at
        if server.state in WATCHED_STATES and seen < nr_before:
            new_state, names = NodeState.NOT_RESPONDING, result.not_responding
        elif server.state == NodeState.NOT_RESPONDING and seen < down_before:
            new_state, names = NodeState.DOWN, result.down
        else:
            continue
        reason = f"no heartbeat since {seen:%Y-%m-%d %H:%M:%S %Z}"
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
    """Stop placing work on `server`: DRAINING while its leases run, DRAINED once it holds none."""
    server = Server.objects.select_for_update().get(pk=server.pk)
    if server.state in (NodeState.DRAINING, NodeState.DRAINED):
        return server
    if server.state not in OCCUPANCY_STATES:
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
    server.state = occupancy_state(num_gpus=server.num_gpus, busy_gpus=busy_gpus)
    server.state_reason = ""
    server.save(update_fields=["state", "state_reason"])
    logger.info("server %s resumed: %s", server.name, server.state)
    return server


def _rollup(
    model: type[Model], key: str, fields: Sequence[str], before: datetime
) -> tuple[int, datetime | None]:
    """Replace the raw samples of `model` older than `before` by one averaged row per (key, minute).

    Rows already rolled up sit exactly on a minute, so each run starts at the first minute that still
    holds a raw sample and never rewrites older history. Returns how many rows were removed net, and
    that first minute (None when there was nothing to do).
    """
    before = before.replace(second=0, microsecond=0)
    old = model.objects.filter(sampled_at__lt=before).annotate(
        minute=Trunc("sampled_at", "minute", tzinfo=UTC)
    )
    since = old.exclude(sampled_at=F("minute")).aggregate(first=Min("minute"))["first"]
    if since is None:
        return 0, None
    if timezone.is_naive(since):  # an aggregate over the annotation comes back without its zone (UTC)
        since = since.replace(tzinfo=UTC)
    window = old.filter(sampled_at__gte=since)
    averages = list(
        window.values(key, "minute").annotate(**{f: Avg(f) for f in fields}).order_by(key, "minute")
    )
    deleted, _ = model.objects.filter(sampled_at__gte=since, sampled_at__lt=before).delete()
    model.objects.bulk_create(
        [
            model(**{key: row[key], "sampled_at": row["minute"], **{f: row[f] for f in fields}})
            for row in averages
        ],
        batch_size=2000,
    )
    return deleted - len(averages), since


@transaction.atomic
def usage_samples_rollup(*, now: datetime | None = None) -> int:
    """Roll raw usage samples older than the retention period up into per-minute averages.

    The agents send a sample every few seconds; dashboards need that detail for recent hours only.
    Older samples are averaged per server (and per GPU) and minute, which keeps long histories at one
    row per minute. Returns the number of rows removed.
    """
    now = now or timezone.now()
    before = now - timedelta(days=node_conf().usage_raw_retention_days)
    removed, since_servers = _rollup(UsageSample, "server_id", ("cpu_util_pct", "mem_used_gb"), before)
    removed_gpus, since_gpus = _rollup(GpuUsageSample, "gpu_id", ("util_pct", "mem_used_mb"), before)
    removed += removed_gpus
    starts = [t for t in (since_servers, since_gpus) if t is not None]
    if starts:
        # A folded minute now holds one averaged sample per server / GPU instead of many: its
        # cluster-wide sums change, so they are recomputed from the rows that replaced the raw ones.
        cluster_usage_minutes_rebuild(start=min(starts), end=before.replace(second=0, microsecond=0))
    if removed:
        logger.info("usage roll-up: %d raw samples folded into per-minute averages", removed)
    return removed


@transaction.atomic
def cluster_usage_minutes_rebuild(*, start: datetime | None = None, end: datetime | None = None) -> int:
    """Recompute the ClusterUsageMinute rows of [start, end) from the usage samples; idempotent.

    For an installation that had samples before the aggregate existed, after a manual change to the
    sample tables, and for the minutes the roll-up folds. Bounds are widened to whole minutes;
    missing ones mean from the first sample or stored minute / to after the last. Returns the number
    of minute rows written.

    Safe beside live heartbeats: additions to the table wait while it runs (minutes_lock_for_rebuild).
    """
    if start is None or end is None:
        # Stored minutes count too: one left by samples deleted since (a removed server) is rebuilt away.
        bounds = [
            UsageSample.objects.aggregate(first=Min("sampled_at"), last=Max("sampled_at")),
            GpuUsageSample.objects.aggregate(first=Min("sampled_at"), last=Max("sampled_at")),
            ClusterUsageMinute.objects.aggregate(first=Min("minute"), last=Max("minute")),
        ]
        firsts = [b["first"] for b in bounds if b["first"] is not None]
        lasts = [b["last"] for b in bounds if b["last"] is not None]
        if start is None:
            start = min(firsts) if firsts else timezone.now()
        if end is None:
            end = max(lasts) + timedelta(minutes=1) if lasts else start
    start = minute_of(start)
    end_minute = minute_of(end)
    end = end_minute if end_minute == end else end_minute + timedelta(minutes=1)
    minutes_lock_for_rebuild()
    ClusterUsageMinute.objects.filter(minute__gte=start, minute__lt=end).delete()
    written = 0
    # A week at a time: memory stays at about 10,000 minutes whatever the range (a year is 527,040).
    lo = start
    while lo < end:
        hi = min(lo + REBUILD_CHUNK, end)
        sums = minute_sums_from_samples(start=lo, end=hi)
        ClusterUsageMinute.objects.bulk_create(
            [ClusterUsageMinute(minute=minute, **vars(row)) for minute, row in sorted(sums.items())],
            batch_size=2000,
        )
        written += len(sums)
        lo = hi
    return written
