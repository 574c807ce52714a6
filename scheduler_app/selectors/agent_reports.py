"""The reads of applying an agent's lease reports, hand-written: every sync with reports runs them.

The ORM builds each of these statements for 1 to 4 ms of CPU (the job and workload rows have many
columns, the lease's rank two correlated subqueries), several times what PostgreSQL takes to run it;
at a thousand agents that was most of the web tier's CPU. Plain SQL over the models' own table and
column names, portable between PostgreSQL and the embedded SQLite; rows come back as model instances
through `model_rows` (infra/raw_rows.py: raw()'s conversions, its per-query set-up done once).
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from typing import NamedTuple
from uuid import UUID

from django.db import connection

from cluster_app.models import NodeState, Server
from infra.raw_rows import model_rows
from infra.vendor import is_postgresql
from profiles_app.models import Workload
from scheduler_app.models import AgentReport, AgentReportPending, Allocation, Job, JobEndPending


def quoted_table(model) -> str:
    """The model's table name, quoted for this database."""
    return connection.ops.quote_name(model._meta.db_table)


def lease_params(lease_ids: Iterable[UUID]) -> tuple[str, list]:
    """`%s, %s, ...` and the lease ids as the database stores them (SQLite: 32 hex digits)."""
    field = Allocation._meta.get_field("lease_id")
    values = [field.get_db_prep_value(v, connection) for v in sorted(set(lease_ids), key=str)]
    return ", ".join(["%s"] * len(values)), values


class LeaseOfServer(NamedTuple):
    """What storing a lease's reports needs of it: its allocation's id, its job, its start."""

    pk: int
    lease_id: UUID
    job_id: int
    started_at: datetime


def leases_of_server(*, server_id: int, lease_ids: Iterable[UUID]) -> dict[UUID, LeaseOfServer]:
    """lease id -> its lease on `server_id`, any state.

    Every sync with reports asks it: on PostgreSQL the rows are read as they come (psycopg2 hands back
    UUIDs and aware datetimes), not built into Allocation instances (model_rows: 0.1 ms of the web
    tier's CPU for a sync's four leases, bench.sync_cost). Elsewhere through the fields' conversions.
    """
    marks, params = lease_params(lease_ids)
    if not params:
        return {}
    sql = (
        f"SELECT id, lease_id, job_id, started_at FROM {quoted_table(Allocation)}"
        f" WHERE server_id = %s AND lease_id IN ({marks})"
    )
    if is_postgresql():
        with connection.cursor() as cursor:
            cursor.execute(sql, [server_id, *params])
            return {row[1]: LeaseOfServer(*row) for row in cursor.fetchall()}
    return {
        a.lease_id: LeaseOfServer(a.pk, a.lease_id, a.job_id, a.started_at)
        for a in model_rows(Allocation, sql, [server_id, *params])
    }


def jobs_lock(*, job_ids: Iterable[int], skip_locked: bool = False) -> dict[int, Job]:
    """job id -> the job, locked FOR NO KEY UPDATE in id order (PostgreSQL), its workload attached;
    with `skip_locked`, the jobs another transaction holds are left out.

    NO KEY: reports never change a job's key, and the rows that point at a job (a round's decisions,
    events and leases) take FOR KEY SHARE on it for their foreign key checks, which FOR UPDATE would
    make wait for the reports (and the reports for them).
    """
    lock = ""
    if connection.features.has_select_for_update:
        lock = " FOR NO KEY UPDATE SKIP LOCKED" if skip_locked else " FOR NO KEY UPDATE"
    return jobs_with_workloads(job_ids=job_ids, lock=lock)


def jobs_with_workloads(*, job_ids: Iterable[int], lock: str = "") -> dict[int, Job]:
    """job id -> the job (every column), its workload attached; `lock`: a locking clause for the jobs."""
    ids = sorted(set(job_ids))
    if not ids:
        return {}
    sql = f"SELECT * FROM {quoted_table(Job)} WHERE id IN ({', '.join(['%s'] * len(ids))}) ORDER BY id{lock}"
    jobs = {j.pk: j for j in model_rows(Job, sql, ids)}
    workload_ids = sorted({j.workload_id for j in jobs.values() if j.workload_id is not None})
    workloads = {}
    if workload_ids:
        marks = ", ".join(["%s"] * len(workload_ids))
        sql = f"SELECT * FROM {quoted_table(Workload)} WHERE id IN ({marks})"
        workloads = {w.pk: w for w in model_rows(Workload, sql, workload_ids)}
    for job in jobs.values():
        job.workload = workloads.get(job.workload_id)
    return jobs


def leases_with_rank(*, lease_ids: Iterable[UUID]) -> dict[UUID, Allocation]:
    """lease id -> its lease (every column), with `num_servers`, the parts of its job's placement (its
    sibling leases, created at once: same job, same start), and `rank`, how many of them were created
    before it (rank 0 reports the job's progress), and `server_time_scale`, its server's (a restart's
    lost work is counted in the job's own time)."""
    marks, params = lease_params(lease_ids)
    if not params:
        return {}
    table = quoted_table(Allocation)
    sql = (
        f"SELECT a.*,"
        f" (SELECT COUNT(*) FROM {table} s WHERE s.job_id = a.job_id AND s.started_at = a.started_at)"
        f" AS num_servers,"
        f" (SELECT COUNT(*) FROM {table} e WHERE e.job_id = a.job_id AND e.started_at = a.started_at"
        f" AND e.id < a.id) AS rank,"
        f" (SELECT v.time_scale FROM {quoted_table(Server)} v WHERE v.id = a.server_id) AS server_time_scale"
        f" FROM {table} a WHERE a.lease_id IN ({marks})"
    )
    return {a.lease_id: a for a in model_rows(Allocation, sql, params)}


def pending_reports(*, job_ids: Iterable[int]) -> list[AgentReport]:
    """Every stored report not applied yet about a lease of these jobs (id, lease_id, seq, kind, at and
    data loaded)."""
    ids = sorted(set(job_ids))
    if not ids:
        return []
    pending = (
        f"SELECT p.report_id FROM {quoted_table(AgentReportPending)} p"
        f" WHERE p.job_id IN ({', '.join(['%s'] * len(ids))})"
    )
    # The reports are found by their primary key, never by a join the planner may choose to hash: the
    # work list churns faster than autovacuum analyzes it, so PostgreSQL guesses it holds thousands of
    # rows and read the whole report history (days of reports) for a few hundred (23 ms against 1.3
    # ms at 42,000 stored reports, 2026-11-27). ARRAY(subquery) is PostgreSQL's; SQLite's IN is fine.
    found = f"= ANY(ARRAY({pending}))" if is_postgresql() else f"IN ({pending})"
    columns = "r.id, r.lease_id, r.seq, r.kind, r.at, r.data"
    sql = f"SELECT {columns} FROM {quoted_table(AgentReport)} r WHERE r.id {found}"
    return model_rows(AgentReport, sql, ids)


def pending_report_job_ids(*, after_job_id: int, limit: int) -> list[int]:
    """The first `limit` ids above `after_job_id` of jobs with a stored report not applied yet."""
    sql = (
        f"SELECT DISTINCT job_id FROM {quoted_table(AgentReportPending)} WHERE job_id > %s"
        f" ORDER BY job_id LIMIT %s"
    )
    with connection.cursor() as cursor:
        cursor.execute(sql, [after_job_id, limit])
        return [row[0] for row in cursor.fetchall()]


def reports_mark_applied(*, report_ids: Iterable[int]) -> None:
    """Take the reports off the applier's work list (one statement)."""
    ids = sorted(set(report_ids))
    if not ids:
        return
    marks = ", ".join(["%s"] * len(ids))
    sql = f"DELETE FROM {quoted_table(AgentReportPending)} WHERE report_id IN ({marks})"
    with connection.cursor() as cursor:
        cursor.execute(sql, ids)


def waiting_lease_servers(*, job_ids: Iterable[int], except_server_id: int | None) -> set[int]:
    """The servers of these jobs' active leases whose agent has not reported them started, but
    `except_server_id`'s: hand-written, as every exit a sync applies asks it (the ORM's query cost
    several times what PostgreSQL takes to run it)."""
    ids = sorted(set(job_ids))
    if not ids:
        return set()
    sql = (
        f"SELECT DISTINCT server_id FROM {quoted_table(Allocation)}"
        f" WHERE job_id IN ({', '.join(['%s'] * len(ids))}) AND ended_at IS NULL"
        f" AND agent_started_at IS NULL AND server_id <> %s"
    )
    with connection.cursor() as cursor:
        cursor.execute(sql, [*ids, -1 if except_server_id is None else except_server_id])
        return {row[0] for row in cursor.fetchall()}


def applier_backlog() -> tuple[int, int]:
    """(reports stored and not applied yet, ended jobs whose follow-ups have not run yet): the worker's
    applier's work list, in one statement (a /metrics scrape's query count stays flat)."""
    sql = (
        f"SELECT (SELECT COUNT(*) FROM {quoted_table(AgentReportPending)}),"
        f" (SELECT COUNT(*) FROM {quoted_table(JobEndPending)})"
    )
    with connection.cursor() as cursor:
        cursor.execute(sql)
        reports, job_ends = cursor.fetchone()
    return int(reports), int(job_ends)


def silent_sibling_servers(*, allocation: Allocation, heard_since: datetime) -> list[str]:
    """Names of the servers holding another live part of this lease's placement (same job, same
    start) that are silent: NOT_RESPONDING or DOWN, or without a heartbeat since `heard_since` (the
    liveness sweep may not have run yet). Read only when a part of a job on several servers fails."""
    siblings = (
        Allocation.objects.filter(job_id=allocation.job_id, started_at=allocation.started_at, ended_at=None)
        .exclude(pk=allocation.pk)
        .select_related("server", "server__heartbeat")
    )
    silent = []
    for sibling in siblings:
        server = sibling.server
        heard_at = server.last_heartbeat_at or server.created_at
        if server.state in (NodeState.NOT_RESPONDING, NodeState.DOWN) or heard_at < heard_since:
            silent.append(server.name)
    return sorted(silent)
