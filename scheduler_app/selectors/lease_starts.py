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

from cluster_app.models import Gpu, Server
from cluster_app.raw_rows import model_rows
from scheduler_app.models import Allocation, AllocationGpu
from scheduler_app.selectors.agent_reports import jobs_with_workloads, lease_params, quoted_table


def leases_to_start(
    *, lease_ids: Iterable[UUID], stopping_since: datetime, node_fail_reason: str
) -> list[Allocation]:
    """The active leases among `lease_ids` whose job has no earlier lease still stopping, in start order,
    with their jobs (and workloads) attached.

    A lease still stopping: ended at `stopping_since` or later (its grace period and the margin for
    its exit report), started by its agent, its exit not reported, and not ended by a node failure
    (no agent will report that one's exit). The next lease of a moved job waits for it."""
    marks, params = lease_params(lease_ids)
    if not params:
        return []
    table = quoted_table(Allocation)
    sql = (
        f"SELECT a.* FROM {table} a WHERE a.lease_id IN ({marks}) AND a.ended_at IS NULL"
        f" AND NOT EXISTS (SELECT 1 FROM {table} e WHERE e.job_id = a.job_id AND e.ended_at >= %s"
        f" AND e.agent_started_at IS NOT NULL AND e.exited_at IS NULL AND e.end_reason <> %s)"
        f" ORDER BY a.started_at, a.id"
    )
    stopping = Allocation._meta.get_field("ended_at").get_db_prep_value(stopping_since, connection)
    leases = model_rows(Allocation, sql, [*params, stopping, node_fail_reason])
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
