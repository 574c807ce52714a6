"""A sync's new reports stored with their applier's work-list rows: one statement on PostgreSQL, which
on a sync's usual path also reads the reports' leases (`reports_insert_on_leases`); an exit's jobs
locked within a bounded wait, with their workloads, in one statement (`jobs_lock_within`)."""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from functools import cache
from typing import Any
from uuid import UUID

from django.db import connection, transaction

from infra.bulk_sql import insert_new
from infra.raw_rows import model_rows_joined
from infra.vendor import is_postgresql
from profiles_app.models import Workload
from scheduler_app.models import AgentReport, AgentReportPending, Allocation, Job
from scheduler_app.selectors.agent_reports import LeaseOfServer, quoted_table


@dataclass(frozen=True)
class NewReport:
    """A report to store, its lease's allocation and job known."""

    allocation_id: int
    job_id: int
    lease_id: UUID
    seq: int
    kind: str
    at: datetime
    data: dict[str, Any]


def reports_insert_new(
    reports: Sequence[NewReport], *, batch_id: UUID, received_at: datetime
) -> dict[tuple[UUID, int], int]:
    """Insert the reports not stored yet, each with its AgentReportPending row (the applier's work list),
    both or neither; returns (lease_id, seq) -> report id of those inserted now.

    Insert-or-ignore on the (lease_id, seq) unique constraint: a report stored before (a retried sync),
    or by a concurrent retry of the same batch (it waits on the unique index, then inserts nothing), is
    left out. Rows go in the order given: callers sort them, so that two overlapping batches take the
    index's locks in the same order and cannot deadlock.
    On PostgreSQL one statement whatever the batch's size: the columns as arrays (unnest), the work
    list in a second data-modifying CTE. It is the same text for every batch, so it is prepared once per
    connection (infra/prepared_sql.py), where a VALUES list per batch size was a new statement for
    each size, and both inserts are one round trip. Elsewhere (the embedded SQLite) two inserts.
    """
    if not reports:
        return {}
    if is_postgresql():
        with connection.cursor() as cursor:
            cursor.execute(
                _insert_sql(),
                {
                    "allocations": [r.allocation_id for r in reports],
                    "leases": [r.lease_id for r in reports],
                    "seqs": [r.seq for r in reports],
                    "kinds": [r.kind for r in reports],
                    "ats": [r.at for r in reports],
                    "datas": [json.dumps(r.data) for r in reports],
                    "batch": batch_id,
                    "received": received_at,
                },
            )
            return {(UUID(str(lease_id)), seq): report_id for report_id, lease_id, seq in cursor.fetchall()}
    with transaction.atomic():
        return _insert_new_by_rows(reports, batch_id=batch_id, received_at=received_at)


def _insert_new_by_rows(
    reports: Sequence[NewReport], *, batch_id: UUID, received_at: datetime
) -> dict[tuple[UUID, int], int]:
    """`reports_insert_new` as two inserts of VALUES rows, any database (in the caller's transaction)."""
    inserted = insert_new(
        AgentReport,
        ("lease_id", "seq"),
        [
            {
                "allocation_id": r.allocation_id,
                "lease_id": r.lease_id,
                "seq": r.seq,
                "kind": r.kind,
                "at": r.at,
                "data": r.data,
                "batch_id": batch_id,
                "received_at": received_at,
            }
            for r in reports
        ],
        ("id", "lease_id", "seq"),
    )
    fresh = {(UUID(str(lease_id)), seq): report_id for report_id, lease_id, seq in inserted}
    insert_new(
        AgentReportPending,
        ("report",),
        [
            {"report_id": fresh[r.lease_id, r.seq], "job_id": r.job_id}
            for r in reports
            if (r.lease_id, r.seq) in fresh
        ],
        ("report",),
    )
    return fresh


@cache
def _insert_sql() -> str:
    qn = connection.ops.quote_name
    reports, pending = qn(AgentReport._meta.db_table), qn(AgentReportPending._meta.db_table)
    allocations = qn(Allocation._meta.db_table)
    return (
        f"WITH new AS ("
        f" INSERT INTO {reports} (allocation_id, lease_id, seq, kind, at, data, batch_id, received_at)"
        f" SELECT v.allocation_id, v.lease_id, v.seq, v.kind, v.at, v.data::jsonb, %(batch)s, %(received)s"
        f" FROM unnest(%(allocations)s::bigint[], %(leases)s::uuid[], %(seqs)s::bigint[],"
        f" %(kinds)s::varchar[], %(ats)s::timestamptz[], %(datas)s::text[])"
        f" AS v(allocation_id, lease_id, seq, kind, at, data)"
        f" ON CONFLICT (lease_id, seq) DO NOTHING RETURNING id, lease_id, seq, allocation_id),"
        f" listed AS ("
        f" INSERT INTO {pending} (report_id, job_id)"
        f" SELECT new.id, a.job_id FROM new JOIN {allocations} a ON a.id = new.allocation_id)"
        f" SELECT id, lease_id, seq FROM new"
    )


def reports_insert_on_leases(
    reports: Sequence[NewReport], *, server_id: int, latest: datetime, batch_id: UUID, received_at: datetime
) -> tuple[dict[UUID, LeaseOfServer], dict[tuple[UUID, int], int]]:
    """PostgreSQL: the reports' leases on `server_id` read, and the reports stored as `reports_insert_new`
    stores them, in one statement (one round trip fewer on every sync that carries reports): returns
    lease id -> its lease on this server (any state), and (lease_id, seq) -> report id of those inserted
    now. `allocation_id` and `job_id` of `reports` are not read (0 will do): the statement joins each
    report to its lease. Only reports of this server's leases dated within their lease's life (from its
    start to `latest`) go in; the caller clamps the others into it and stores them with
    `reports_insert_new` (a wrong clock: rare). Rows go in the order given, as there. Lease ids come
    back as psycopg2 reads them (UUIDs, Django registers the type)."""
    if not reports:
        return {}, {}
    with connection.cursor() as cursor:
        cursor.execute(
            _insert_on_leases_sql(),
            {
                "server": server_id,
                "leases": [r.lease_id for r in reports],
                "seqs": [r.seq for r in reports],
                "kinds": [r.kind for r in reports],
                "ats": [r.at for r in reports],
                "datas": [json.dumps(r.data) for r in reports],
                "latest": latest,
                "batch": batch_id,
                "received": received_at,
            },
        )
        rows = cursor.fetchall()
    leases, fresh = {}, {}
    for lease_id, seq, row_id, job_id, started_at in rows:
        if seq is None:
            leases[lease_id] = LeaseOfServer(row_id, lease_id, job_id, started_at)
        else:
            fresh[lease_id, seq] = row_id
    return leases, fresh


@cache
def _insert_on_leases_sql() -> str:
    qn = connection.ops.quote_name
    reports, pending = qn(AgentReport._meta.db_table), qn(AgentReportPending._meta.db_table)
    allocations = qn(Allocation._meta.db_table)
    # The leases' CTE is read once (referenced twice, PostgreSQL materialises it); the reports are
    # inserted in the order given (ORDER BY the array's ordinality), as reports_insert_new's.
    return (
        f"WITH v AS (SELECT * FROM unnest(%(leases)s::uuid[], %(seqs)s::bigint[], %(kinds)s::varchar[],"
        f" %(ats)s::timestamptz[], %(datas)s::text[])"
        f" WITH ORDINALITY AS v(lease_id, seq, kind, at, data, n)),"
        f" a AS (SELECT id, lease_id, job_id, started_at FROM {allocations}"
        f" WHERE server_id = %(server)s AND lease_id = ANY(%(leases)s::uuid[])),"
        f" new AS ("
        f" INSERT INTO {reports} (allocation_id, lease_id, seq, kind, at, data, batch_id, received_at)"
        f" SELECT a.id, v.lease_id, v.seq, v.kind, v.at, v.data::jsonb, %(batch)s, %(received)s"
        f" FROM v JOIN a ON a.lease_id = v.lease_id"
        f" WHERE v.at >= a.started_at AND v.at <= %(latest)s ORDER BY v.n"
        f" ON CONFLICT (lease_id, seq) DO NOTHING RETURNING id, lease_id, seq, allocation_id),"
        f" listed AS ("
        f" INSERT INTO {pending} (report_id, job_id)"
        f" SELECT new.id, a.job_id FROM new JOIN a ON a.id = new.allocation_id)"
        f" SELECT lease_id, NULL::bigint, id, job_id, started_at FROM a"
        f" UNION ALL SELECT lease_id, seq, id, NULL::bigint, NULL::timestamptz FROM new"
    )


def jobs_lock_within(*, job_ids: Iterable[int], lock_wait_ms: int) -> dict[int, Job]:
    """PostgreSQL: `jobs_lock` (selectors/agent_reports.py) within a wait of `lock_wait_ms` for the rows
    (the transaction's lock_timeout, as `SET LOCAL` sets it; the caller gets LockNotAvailable), in one
    statement where an exit's sync ran three: the SET LOCAL, the jobs' lock and their workloads' read.
    The timeout is set by an uncorrelated subquery in the WHERE clause: PostgreSQL runs it once, before
    the scan hands the lock its first row (tests/scheduler_app/test_report_applier.py holds a job and
    sees the wait end). The caller's transaction keeps it, as it kept SET LOCAL's."""
    ids = sorted(set(job_ids))
    if not ids:
        return {}
    marks = ", ".join(["%s"] * len(ids))
    sql = (
        f"SELECT j.*, {_workload_columns()} FROM {quoted_table(Job)} j"
        f" LEFT JOIN {quoted_table(Workload)} w ON w.id = j.workload_id"
        f" WHERE j.id IN ({marks}) AND (SELECT set_config('lock_timeout', %s, true)) IS NOT NULL"
        f" ORDER BY j.id FOR NO KEY UPDATE OF j"
    )
    jobs = model_rows_joined(Job, sql, [*ids, f"{int(lock_wait_ms)}ms"], joined={"workload": Workload})
    return {job.pk: job for job in jobs}


@cache
def _workload_columns() -> str:
    qn = connection.ops.quote_name
    return ", ".join(
        f"w.{qn(f.column)} AS {qn('workload__' + f.column)}" for f in Workload._meta.concrete_fields
    )
