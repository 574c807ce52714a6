"""The reads of a sync's `start` commands, hand-written: every sync of an agent with a lease to start
runs them (the woken syncs after each round).

The ORM built the leases' query, with its job and workload joined in (a hundred columns) and the
earlier-lease check, for several times what PostgreSQL takes to run it: under the fleet bench
(1,000 agents), 9.6 % of the web tier's samples (py-spy --gil, 2026-11-27). Plain SQL over the
models' own tables, portable between PostgreSQL and the embedded SQLite, as in
selectors/agent_reports.py.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from datetime import datetime
from uuid import UUID

from django.db import connection

from cluster_app.models import Gpu, Server, ServerHeartbeat
from infra.raw_rows import model_rows
from scheduler_app.models import Allocation, AllocationGpu
from scheduler_app.selectors.agent_reports import jobs_with_workloads, lease_params, quoted_table


def leases_to_start(*, lease_ids: Iterable[UUID], fenced_before: datetime) -> list[Allocation]:
    """The active leases among `lease_ids` whose job has no earlier lease that may still run, in start
    order, with their jobs (and workloads) attached.

    An earlier lease may still run (docs/faults.md, "Fencing") while its exit is not reported, a sync
    answer carried its start (or its agent reported it started), and both its end and its server's last
    sync are after `fenced_before` (now less the fence's expiry): its agent renews a lease only in a sync
    answered while the service counts it live, so the node has stopped it within the fence's expiry of
    the earlier of the two. A moved job's next lease waits for it: the old process may still be writing
    its checkpoint, or, on a silent node, training beside the new one. A start that was sent but never
    launched (withdrawn while it waited for its GPUs) also holds the next lease back until then: the
    service cannot tell it from one launched just before its agent fell silent."""
    marks, params = lease_params(lease_ids)
    if not params:
        return []
    table, beats = quoted_table(Allocation), quoted_table(ServerHeartbeat)
    sql = (
        f"SELECT a.* FROM {table} a WHERE a.lease_id IN ({marks}) AND a.ended_at IS NULL"
        f" AND NOT EXISTS (SELECT 1 FROM {table} e LEFT JOIN {beats} h ON h.server_id = e.server_id"
        f" WHERE e.job_id = a.job_id AND e.ended_at >= %s AND e.exited_at IS NULL"
        f" AND (e.start_sent_at IS NOT NULL OR e.agent_started_at IS NOT NULL)"
        f" AND (h.at IS NULL OR h.at >= %s))"
        f" ORDER BY a.started_at, a.id"
    )
    since = Allocation._meta.get_field("ended_at").get_db_prep_value(fenced_before, connection)
    leases = model_rows(Allocation, sql, [*params, since, since])
    jobs = jobs_with_workloads(job_ids={a.job_id for a in leases})
    for lease in leases:
        lease.job = jobs[lease.job_id]
    return leases


def held_gpu_uuids(*, allocation_ids: Iterable[int]) -> dict[int, list[str]]:
    """allocation id -> the UUIDs of the GPUs it holds, in the GPUs' index order."""
    ids = sorted(set(allocation_ids))
    if not ids:
        return {}
    sql = (
        f"SELECT h.allocation_id, g.uuid FROM {quoted_table(AllocationGpu)} h JOIN {quoted_table(Gpu)} g"
        f" ON g.id = h.gpu_id WHERE h.allocation_id IN ({', '.join(['%s'] * len(ids))})"
        f" AND h.released_at IS NULL ORDER BY h.allocation_id, g.{connection.ops.quote_name('index')}"
    )
    uuids: dict[int, list[str]] = defaultdict(list)
    with connection.cursor() as cursor:
        cursor.execute(sql, ids)
        for allocation_id, uuid in cursor.fetchall():
            uuids[allocation_id].append(uuid)
    return uuids


def job_part_rows(*, job_ids: Iterable[int]) -> list[tuple]:
    """(job id, allocation id, server name, address, hostname, GPUs, rendezvous port) of every active
    lease of these jobs, by job and then in creation order (rank order)."""
    ids = sorted(set(job_ids))
    if not ids:
        return []
    sql = (
        f"SELECT a.job_id, a.id, s.name, s.address, s.hostname, a.num_gpus, a.rendezvous_port"
        f" FROM {quoted_table(Allocation)} a JOIN {quoted_table(Server)} s ON s.id = a.server_id"
        f" WHERE a.job_id IN ({', '.join(['%s'] * len(ids))}) AND a.ended_at IS NULL"
        f" ORDER BY a.job_id, a.id"
    )
    with connection.cursor() as cursor:
        cursor.execute(sql, ids)
        return cursor.fetchall()
