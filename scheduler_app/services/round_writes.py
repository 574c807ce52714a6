"""A round's bulk inserts: one statement per table on PostgreSQL, the ORM's bulk statements elsewhere (the
jobs' states are services/job_lifecycle.py's jobs_transition_bulk)."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from django.db import connection, models

from scheduler_app.models import RoundDecision

# Why hand-written statements: the ORM's bulk_create and update build, prepare and adapt every value
# of every row in Python (field by field), which for a thousand-job queue was most of what a round
# spent outside the database (docs/performance.md, "Live round"). Here each column travels as one
# array parameter and PostgreSQL does the casts: one statement per table, whatever the number of rows.


def _is_postgresql() -> bool:
    return connection.vendor == "postgresql"


def _column(field: models.Field, rows: Sequence[Mapping[str, Any]]) -> list[Any]:
    """One column's values: each row's, or the field's default (evaluated per row, as __init__ does)."""
    name = field.attname
    values = [row[name] if name in row else field.get_default() for row in rows]
    if isinstance(field, models.JSONField):
        return [None if v is None else json.dumps(v, cls=field.encoder) for v in values]
    return values


def model_rows_insert(model: type[models.Model], rows: Sequence[Mapping[str, Any]]) -> list[int]:
    """Insert rows of `model` given as field attname -> value (a missing field gets its default; an
    auto primary key is left to the database); returns their ids in the rows' order.

    A row may be an unsaved instance's vars(): what __init__ stored. On PostgreSQL one INSERT ...
    SELECT FROM unnest(one array per column) RETURNING id, whose ids come back in the rows' order as
    Django's own bulk_create relies on; values go as they are (aware datetimes, numbers, strings,
    UUIDs; JSON dumped), without building a model instance or preparing each value in Python. Fields
    that set themselves on save (auto_now) are not supported. Elsewhere the ORM's bulk_create.
    """
    if not rows:
        return []
    meta = model._meta
    fields = [f for f in meta.concrete_fields if f is not meta.auto_field]
    if not _is_postgresql():
        names = {f.attname for f in fields}
        objs = [model(**{k: v for k, v in row.items() if k in names}) for row in rows]
        return [obj.pk for obj in model.objects.bulk_create(objs, batch_size=1000)]
    quote = connection.ops.quote_name
    columns = ", ".join(quote(f.column) for f in fields)
    arrays = ", ".join(f"%s::{f.db_type(connection)}[]" for f in fields)
    with connection.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO {quote(meta.db_table)} ({columns}) SELECT * FROM unnest({arrays})"
            f" RETURNING {quote(meta.pk.column)}",
            [_column(f, rows) for f in fields],
        )
        return [pk for (pk,) in cursor.fetchall()]


def round_decisions_insert(round_id: int, rows: list[tuple[int, int, str, str, float | None]]) -> None:
    """Store a round's decision for every job it considered: (job id, position, outcome, reason, speed-up).

    On PostgreSQL one INSERT over unnest'ed arrays, built from tuples: even building a thousand model
    instances (for model_rows_insert) costs milliseconds, and every round stores one per queued job.
    Elsewhere (the embedded SQLite demo) bulk_create.
    """
    if not rows:
        return
    if not _is_postgresql():
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
