"""Multi-row writes in one statement: UPDATE ... FROM (VALUES ...), INSERT ... ON CONFLICT DO NOTHING,
INSERT ... SELECT FROM unnest(arrays); Django's bulk statements on SQLite where they differ."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from django.db import connection, models
from django.db.models import Model

from infra.vendor import is_postgresql


def update_from_values(model: type[Model], rows: Sequence[dict[str, Any]], fields: Sequence[str]) -> int:
    """Set `fields` of each row (a dict with "pk" and those fields) in one statement; returns how many.

    On PostgreSQL: UPDATE t SET f = v.f FROM (VALUES (...), ...) AS v(pk, f...) WHERE t.pk = v.pk, every
    value cast to its column's type (a NULL in the first row would otherwise leave the type unknown).
    Django's bulk_update writes CASE WHEN pk = ... per field, which PostgreSQL plans in time growing with
    the rows; elsewhere (the embedded SQLite) that is what is used.
    """
    if not rows:
        return 0
    meta = model._meta
    if not is_postgresql():
        objects = [model(pk=row["pk"], **{f: row[f] for f in fields}) for row in rows]
        return model.objects.bulk_update(objects, list(fields))
    qn = connection.ops.quote_name
    pk = meta.pk
    columns = [pk] + [meta.get_field(f) for f in fields]
    one = "(" + ", ".join(f"%s::{c.db_type(connection)}" for c in columns) + ")"
    params: list[Any] = []
    for row in rows:
        params.append(pk.get_db_prep_save(row["pk"], connection))
        params += [meta.get_field(f).get_db_prep_save(row[f], connection) for f in fields]
    table = qn(meta.db_table)
    aliases = ", ".join(qn(c.column) for c in columns)
    sets = ", ".join(f"{qn(c.column)} = v.{qn(c.column)}" for c in columns[1:])
    sql = (
        f"UPDATE {table} SET {sets} FROM (VALUES {', '.join([one] * len(rows))}) AS v({aliases}) "
        f"WHERE {table}.{qn(pk.column)} = v.{qn(pk.column)}"
    )
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return cursor.rowcount


def insert_new(
    model: type[Model], conflict: Sequence[str], rows: Sequence[dict[str, Any]], returning: Sequence[str]
) -> list[tuple[Any, ...]]:
    """INSERT `rows` into `model`'s table, skipping those that clash on `conflict`; returns the
    `returning` columns of the rows actually inserted.

    ON CONFLICT DO NOTHING RETURNING is PostgreSQL's and SQLite's (3.35+) alike, and it is what tells a
    retried report (nothing inserted) from a new one, even when both arrive at once: the second waits
    on the unique index and then inserts nothing. Django's bulk_create(ignore_conflicts=True) does not
    say which rows went in.
    """
    if not rows:
        return []
    meta, qn = model._meta, connection.ops.quote_name
    names = list(rows[0])
    fields = [meta.get_field(name) for name in names]  # attnames ("server_id") resolve too
    columns = ", ".join(qn(f.column) for f in fields)
    one = "(" + ", ".join(["%s"] * len(fields)) + ")"
    pairs = list(zip(names, fields, strict=True))
    params = [f.get_db_prep_save(row[name], connection) for row in rows for name, f in pairs]
    sql = (
        f"INSERT INTO {qn(meta.db_table)} ({columns}) VALUES {', '.join([one] * len(rows))} "
        f"ON CONFLICT ({', '.join(qn(meta.get_field(c).column) for c in conflict)}) DO NOTHING "
        f"RETURNING {', '.join(qn(meta.get_field(c).column) for c in returning)}"
    )
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return cursor.fetchall()


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
    if not is_postgresql():
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
