"""The stored forecast (JobForecast): each live job's estimate and queue position, written in one
statement that touches only the rows that changed."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime

from django.db import connection, transaction

from infra.vendor import is_postgresql
from scheduler_app.models import Job, JobForecast, JobState

LIVE_STATES = [JobState.PENDING, JobState.RUNNING]  # the jobs that have a stored forecast


@dataclass(frozen=True, slots=True)
class Estimate:
    """A job's predicted start and finish (None: unknown, `detail` says why) and whether the forecast
    ran out of its time budget before deciding it."""

    start_at: datetime | None
    finish_at: datetime | None
    detail: str = ""
    cut_short: bool = False


def job_positions_store(positions: dict[int, int]) -> int:
    """Store queue positions that differ from the stored ones (a submission moves the jobs behind it
    down one place; under FIFO that is none, under SWAF thousands). Returns how many rows changed. On
    PostgreSQL one statement that writes only the rows whose position changed (the ORM's bulk_update
    built a CASE of thousands of branches: seconds of CPU at 10,000 pending jobs)."""
    if not positions:
        return 0
    if is_postgresql():
        table = connection.ops.quote_name(JobForecast._meta.db_table)
        with connection.cursor() as cursor:
            cursor.execute(
                f"UPDATE {table} f SET position = u.position "
                "FROM unnest(%s::bigint[], %s::integer[]) AS u(job_id, position) "
                "WHERE f.job_id = u.job_id AND f.position IS DISTINCT FROM u.position",
                [list(positions), list(positions.values())],
            )
            return cursor.rowcount
    stored = dict(JobForecast.objects.filter(job_id__in=positions.keys()).values_list("job_id", "position"))
    changed = [
        JobForecast(job_id=job_id, position=position)
        for job_id, position in positions.items()
        if job_id in stored and stored[job_id] != position
    ]
    JobForecast.objects.bulk_update(changed, ["position"], batch_size=1000)
    return len(changed)


def _job_forecasts_store_portable(
    estimates: dict[int, Estimate],
    *,
    now: datetime,
    prune: bool,
    positions: Mapping[int, int] | None,
    new_positions: Mapping[int, int] | None,
    live_only: bool,
) -> int:
    """job_forecasts_store on a database without PostgreSQL's arrays (the embedded demo's SQLite): the
    same rows written, through the ORM (a read of the stored rows, then one upsert of those that
    changed)."""
    with transaction.atomic():
        if prune:
            JobForecast.objects.exclude(job__state__in=LIVE_STATES).delete()
        if live_only and estimates:
            live = set(
                Job.objects.filter(pk__in=list(estimates), state__in=LIVE_STATES).values_list("pk", flat=True)
            )
            estimates = {job_id: e for job_id, e in estimates.items() if job_id in live}
        if not estimates:
            return 0
        stored = {f.job_id: f for f in JobForecast.objects.filter(job_id__in=list(estimates))}
        changed = []
        for job_id, e in estimates.items():
            old = stored.get(job_id)
            if positions is not None:
                position = positions.get(job_id)
            elif old is None:
                position = (new_positions or {}).get(job_id)
            else:
                position = old.position
            row = JobForecast(
                job_id=job_id,
                start_at=e.start_at,
                finish_at=e.finish_at,
                detail=e.detail[:255],
                position=position,
                computed_at=now,
            )
            fields = (row.start_at, row.finish_at, row.detail, row.position)
            if old is None or fields != (old.start_at, old.finish_at, old.detail, old.position):
                changed.append(row)
        JobForecast.objects.bulk_create(
            changed,
            update_conflicts=True,
            unique_fields=["job"],
            update_fields=["start_at", "finish_at", "detail", "position", "computed_at"],
            batch_size=500,
        )
        return len(changed)


def job_forecasts_store(
    estimates: dict[int, Estimate],
    *,
    now: datetime,
    prune: bool = True,
    positions: Mapping[int, int] | None = None,
    new_positions: Mapping[int, int] | None = None,
    live_only: bool = False,
) -> int:
    """Upsert the estimates in one statement, writing only the rows whose times, detail or position
    changed (`computed_at`: when a row last changed); with `prune`, drop the rows of jobs that have
    ended. `positions`: queue positions to store with them (None: keep the stored ones).
    `new_positions`: with `positions` None, the positions of rows not stored yet (the others keep
    theirs). `live_only`: leave out the jobs that are no longer pending or running (a forecast played
    over several refreshes answers for jobs that may have ended since it read the queue). Returns how
    many rows were written.

    After a round most of a deep queue's estimates are what they were (the jobs behind the forecast's
    window, the order under FIFO), so the refresh writes what changed rather than every live job."""
    if not is_postgresql():
        return _job_forecasts_store_portable(
            estimates,
            now=now,
            prune=prune,
            positions=positions,
            new_positions=new_positions,
            live_only=live_only,
        )
    table = connection.ops.quote_name(JobForecast._meta.db_table)
    jobs_table = connection.ops.quote_name(Job._meta.db_table)
    job_ids = list(estimates)
    given = positions if positions is not None else (new_positions or {})
    columns = [
        job_ids,
        [estimates[j].start_at for j in job_ids],
        [estimates[j].finish_at for j in job_ids],
        [estimates[j].detail[:255] for j in job_ids],
        [given.get(j) for j in job_ids],
    ]
    compared = ["start_at", "finish_at", "detail"] + (["position"] if positions is not None else [])
    assignments = ", ".join(f"{c} = EXCLUDED.{c}" for c in [*compared, "computed_at"])
    old = ", ".join(f"{table}.{c}" for c in compared)
    new = ", ".join(f"EXCLUDED.{c}" for c in compared)
    live = f"WHERE EXISTS (SELECT 1 FROM {jobs_table} j WHERE j.id = u.job_id AND j.state = ANY(%s)) "
    with transaction.atomic(), connection.cursor() as cursor:
        if prune:
            # By state, not by absence from `estimates`: a job submitted while this forecast ran (its
            # row stored by its admission) is live and keeps its row.
            cursor.execute(
                f"DELETE FROM {table} f USING {jobs_table} j "
                "WHERE f.job_id = j.id AND NOT (j.state = ANY(%s))",
                [LIVE_STATES],
            )
        if not job_ids:
            return 0
        cursor.execute(
            f"INSERT INTO {table} (job_id, start_at, finish_at, detail, position, computed_at) "
            "SELECT u.*, %s FROM unnest(%s::bigint[], %s::timestamptz[], %s::timestamptz[], "
            "%s::varchar[], %s::integer[]) AS u(job_id, start_at, finish_at, detail, position) "
            f"{live if live_only else ''}"
            f"ON CONFLICT (job_id) DO UPDATE SET {assignments} "
            f"WHERE ({old}) IS DISTINCT FROM ({new})",
            [now, *columns, *([LIVE_STATES] if live_only else [])],
        )
        return cursor.rowcount
