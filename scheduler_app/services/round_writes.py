"""A round's decisions and its in-place resizes in one statement each on PostgreSQL (its new allocations and
events go through infra.bulk_sql.model_rows_insert; the jobs' states are services/job_lifecycle.py's)."""

from __future__ import annotations

from django.db import connection

from infra.vendor import is_postgresql
from profiles_app.models import SpeedObservation
from scheduler_app.models import Allocation, RoundDecision

# Why hand-written statements: the ORM's bulk_create and update build, prepare and adapt every value
# of every row in Python (field by field), which for a thousand-job queue was most of what a round
# spent outside the database (docs/performance.md, "Live round"). Here each column travels as one
# array parameter and PostgreSQL does the casts: one statement per table, whatever the number of rows.


def round_decisions_insert(round_id: int, rows: list[tuple[int, int, str, str, float | None]]) -> None:
    """Store a round's decision for every job it considered: (job id, position, outcome, reason, speed-up).

    On PostgreSQL one INSERT over unnest'ed arrays, built from tuples: even building a thousand model
    instances (for infra.bulk_sql.model_rows_insert) costs milliseconds, and every round stores one per
    queued job. Elsewhere (the embedded SQLite demo) bulk_create.
    """
    if not rows:
        return
    if not is_postgresql():
        RoundDecision.objects.bulk_create(
            [
                RoundDecision(round_id=round_id, job_id=j, position=p, outcome=o, reason=r, speedup=s)
                for j, p, o, r, s in rows
            ],
            batch_size=1000,
        )
        return
    job_ids, positions, outcomes, reasons_, speedups = (list(column) for column in zip(*rows, strict=True))
    with connection.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO {RoundDecision._meta.db_table}"
            " (round_id, job_id, position, outcome, reason, speedup)"
            " SELECT %s, v.job_id, v.position, v.outcome, v.reason, v.speedup"
            " FROM unnest(%s::bigint[], %s::int[], %s::varchar[], %s::varchar[], %s::float8[])"
            " AS v(job_id, position, outcome, reason, speedup)",
            [round_id, job_ids, positions, outcomes, reasons_, speedups],
        )


def allocations_resize(rows: list[tuple[int, int, float, float]]) -> None:
    """Give active leases new cores and memory in place: (allocation id, cores, memory GB, speed-up).

    The lease, its GPUs, its start and its process stay; its agent applies the new size at its next
    sync (docs/agent.md, "Resizing in place"). On PostgreSQL one UPDATE over unnest'ed arrays; an
    ended lease is left as it was. Elsewhere one UPDATE per lease.
    """
    if not rows:
        return
    # A lease's speed observation pairs the shape and prediction of its first report with its last
    # measure: after a resize that would set the old size's prediction against the new size's speed
    # (a ratio of 2.4 for res18 going from 9 to 3 cores) and teach the profile nonsense. The next
    # report starts a new one at the new size.
    SpeedObservation.objects.filter(allocation_id__in=[row[0] for row in rows]).delete()
    if not is_postgresql():
        for allocation_id, cpus, mem_gb, speedup in rows:
            Allocation.objects.filter(pk=allocation_id, ended_at__isnull=True).update(
                num_cpus=cpus, mem_gb=mem_gb, speedup=speedup
            )
        return
    ids, cpus, mems, speedups = (list(column) for column in zip(*rows, strict=True))
    with connection.cursor() as cursor:
        cursor.execute(
            f"UPDATE {Allocation._meta.db_table} AS a"
            " SET num_cpus = v.num_cpus, mem_gb = v.mem_gb, speedup = v.speedup"
            " FROM unnest(%s::bigint[], %s::int[], %s::float8[], %s::float8[])"
            " AS v(id, num_cpus, mem_gb, speedup)"
            " WHERE a.id = v.id AND a.ended_at IS NULL",
            [ids, cpus, mems, speedups],
        )
