"""An agent's heartbeat: its server marked alive, its usage stored once and added to the minute's sums."""

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from functools import cache

from django.db import connection, transaction
from django.utils import timezone

from cluster_app.models import ClusterUsageMinute, Gpu, GpuUsageSample, Server, ServerHeartbeat, UsageSample
from cluster_app.services.nodes import (
    UNRESPONSIVE_STATES,
    ServerNotRegisteredError,
    server_heartbeat_record,
    server_revive,
)
from cluster_app.usage_minutes import SUM_FIELDS, MinuteSums, minute_add, minute_of
from infra.bulk_sql import insert_new
from infra.vendor import is_postgresql


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


def node_heartbeat(
    *, server: Server, usage: UsageReport, busy_gpus: int = 0, now: datetime | None = None
) -> Server:
    """Mark the server alive and store its usage; a repeated `sampled_at` is stored once.

    Built for a thousand agents: it never waits for a scheduling round (the time is written to
    ServerHeartbeat, a row no round locks; the server row is written only to revive it), and on
    PostgreSQL its commit does not wait for the WAL flush (a crash may lose the last fraction of a
    second of samples and liveness, which the next sync restores; reports, whose acks promise
    storage, keep synchronous commits). On PostgreSQL a live server's heartbeat is one statement
    (`_heartbeat_statement`); a server coming back, and the embedded SQLite, take the steps one by one.

    Raises ServerNotRegisteredError, storing nothing, for a server that no agent registered: its GPUs
    are placeholders, and a heartbeat must not bring it into service.
    """
    if server.registered_at is None:
        raise ServerNotRegisteredError(server.name)
    now = now or timezone.now()
    if is_postgresql() and server.state not in UNRESPONSIVE_STATES:
        _heartbeat_statement(server, usage, now)
        server.heartbeat = ServerHeartbeat(server=server, at=now)
        return server
    return _heartbeat_steps(server=server, usage=usage, busy_gpus=busy_gpus, now=now)


@transaction.atomic(savepoint=False)  # no SAVEPOINT inside an agent's sync: two statements fewer
def _heartbeat_steps(*, server: Server, usage: UsageReport, busy_gpus: int, now: datetime) -> Server:
    """What `node_heartbeat` does, statement by statement, in one transaction (any database)."""
    if is_postgresql():
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
        server_revive(server, busy_gpus=busy_gpus)
        Server.objects.filter(pk=server.pk).update(state=server.state, state_reason=server.state_reason)
    server_heartbeat_record(server=server, now=now)
    # Last: every heartbeat of this minute, from every server, waits on this row's lock until its
    # transaction commits, so it is taken after the other writes to keep that wait short.
    minute_add(minute=minute_of(usage.sampled_at), sums=added)
    return server


def _gpu_samples_insert_new(server: Server, usage: UsageReport) -> list[tuple[float]]:
    """Store the sample's GPU readings of `server`'s GPUs (by UUID; others ignored), each once per
    `sampled_at`; returns the utilisation of those stored."""
    if not usage.gpus:
        return []
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


@cache
def _heartbeat_sql() -> str:
    """The whole heartbeat of a live server as one PostgreSQL statement (see `_heartbeat_statement`).

    The touch is an UPSERT of the server's ServerHeartbeat row, never of the server row, which a round
    holds locked for its whole transaction (see ServerHeartbeat for what touching it cost).
    """
    qn = connection.ops.quote_name
    samples, gpu_samples = qn(UsageSample._meta.db_table), qn(GpuUsageSample._meta.db_table)
    beats, gpus = qn(ServerHeartbeat._meta.db_table), qn(Gpu._meta.db_table)
    minutes = qn(ClusterUsageMinute._meta.db_table)
    columns = ", ".join(qn(ClusterUsageMinute._meta.get_field(f).column) for f in SUM_FIELDS)
    updates = ", ".join(f"{c} = {minutes}.{c} + EXCLUDED.{c}" for c in columns.split(", "))
    return (
        f"WITH sample AS ("
        f" INSERT INTO {samples} (server_id, sampled_at, cpu_util_pct, mem_used_gb)"
        f" VALUES (%(server)s, %(at)s, %(cpu_util_pct)s, %(mem_used_gb)s)"
        f" ON CONFLICT (server_id, sampled_at) DO NOTHING RETURNING cpu_util_pct, mem_used_gb),"
        f" gpu AS ("
        f" INSERT INTO {gpu_samples} (gpu_id, sampled_at, util_pct, mem_used_mb)"
        f" SELECT g.id, %(at)s, v.util_pct, v.mem_used_mb"
        f" FROM unnest(%(uuids)s::varchar[], %(utils)s::float8[], %(mems)s::float8[])"
        f" AS v(uuid, util_pct, mem_used_mb)"
        f" JOIN {gpus} g ON g.uuid = v.uuid AND g.server_id = %(server)s"
        f" ON CONFLICT (gpu_id, sampled_at) DO NOTHING RETURNING util_pct),"
        f" touched AS ("
        f" INSERT INTO {beats} AS b (server_id, at) VALUES (%(server)s, %(now)s)"
        f" ON CONFLICT (server_id) DO UPDATE SET at = GREATEST(b.at, EXCLUDED.at) RETURNING 1),"
        f" added AS (SELECT"
        f" (SELECT count(*) FROM sample) AS servers_sampled,"
        f" (SELECT coalesce(sum(cpu_util_pct), 0) FROM sample) * %(cpus)s AS cpu_util_pct_cores_sum,"
        f" (SELECT count(*) FROM sample) * %(cpus)s AS cpu_cores_sum,"
        f" (SELECT coalesce(sum(mem_used_gb), 0) FROM sample) AS mem_used_gb_sum,"
        f" (SELECT count(*) FROM sample) * %(mem_gb)s::float8 AS mem_capacity_gb_sum,"
        f" (SELECT count(*) FROM gpu) AS gpu_samples,"
        f" (SELECT coalesce(sum(util_pct), 0) FROM gpu) AS gpu_util_pct_sum),"
        f" minute AS ("
        f" INSERT INTO {minutes} (minute, {columns}) SELECT %(minute)s, {columns} FROM added"
        f" WHERE servers_sampled > 0 OR gpu_samples > 0"
        f" ON CONFLICT (minute) DO UPDATE SET {updates})"
        f" SELECT (SELECT count(*) FROM touched),"
        f" CASE WHEN %(own_transaction)s THEN set_config('synchronous_commit', 'off', true) END"
    )


def _heartbeat_statement(server: Server, usage: UsageReport, now: datetime) -> None:
    """A live server's heartbeat on PostgreSQL in one statement, hence one round trip and, outside a
    transaction, one commit.

    The same writes as `_heartbeat_steps`, as data-modifying CTEs: the samples inserted or ignored, the
    touch, and the minute's UPSERT of what went in. The UPSERT is the one CTE the final SELECT does not
    read, so PostgreSQL runs it last, after the inserts it reads; its row lock, which every heartbeat of
    the minute takes, is held only until this statement commits. Issue 14's fleet: the heartbeat's
    transaction went from seven round trips (BEGIN, SET, four statements, COMMIT) to one.
    """
    params = {
        "server": server.pk,
        "at": usage.sampled_at,
        "cpu_util_pct": float(usage.cpu_util_pct),
        "mem_used_gb": float(usage.mem_used_gb),
        "uuids": [g.uuid for g in usage.gpus],
        "utils": [float(g.util_pct) for g in usage.gpus],
        "mems": [float(g.mem_used_mb) for g in usage.gpus],
        "now": now,
        "cpus": int(server.num_cpus),
        "mem_gb": float(server.mem_gb),
        "minute": minute_of(usage.sampled_at),
        # Inside a caller's transaction the setting would reach its other writes: left as it is there.
        "own_transaction": not connection.in_atomic_block,
    }
    with connection.cursor() as cursor:
        cursor.execute(_heartbeat_sql(), params)
        cursor.fetchone()
