"""Multi-row writes in one statement: UPDATE ... FROM (VALUES ...), INSERT ... ON CONFLICT DO NOTHING,
INSERT ... SELECT FROM unnest(arrays); Django's bulk statements on SQLite where they differ."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from functools import cache
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
    pk = meta.pk
    columns, head, one, tail = _update_parts(model, tuple(fields))
    params: list[Any] = []
    for row in rows:
        params.append(pk.get_db_prep_save(row["pk"], connection))
        params += [c.get_db_prep_save(row[f], connection) for f, c in zip(fields, columns[1:], strict=True)]
    sql = head + ", ".join([one] * len(rows)) + tail
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return cursor.rowcount


@cache
def _update_parts(model: type[Model], fields: tuple[str, ...]) -> tuple[tuple, str, str, str]:
    """`update_from_values`' statement around its VALUES rows, built once per model and fields
    (PostgreSQL): the columns (the key first), the text before the rows, one row's casts, the text
    after. Built for every statement (three in an agent's exit), each column's type and quoted name
    took 0.07 ms of CPU for a job's two progress columns, 0.015 ms with the parts kept."""
    meta, qn = model._meta, connection.ops.quote_name
    columns = (meta.pk, *(meta.get_field(f) for f in fields))
    one = "(" + ", ".join(f"%s::{c.db_type(connection)}" for c in columns) + ")"
    table = qn(meta.db_table)
    aliases = ", ".join(qn(c.column) for c in columns)
    sets = ", ".join(f"{qn(c.column)} = v.{qn(c.column)}" for c in columns[1:])
    key = qn(meta.pk.column)
    return (
        columns,
        f"UPDATE {table} SET {sets} FROM (VALUES ",
        one,
        f") AS v({aliases}) WHERE {table}.{key} = v.{key}",
    )


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

    A row may be an unsaved instance's vars(): what __init__ stored. On PostgreSQL one statement,
    RETURNING id, whose ids come back in the rows' order as Django's own bulk_create relies on: one
    row as INSERT ... VALUES, more as INSERT ... SELECT FROM unnest(one array per column), a statement
    whose text does not grow with the rows (PostgreSQL parses one row's array literals and casts for
    more CPU than its VALUES: bench.submit_cost). Values go as they are (aware datetimes, numbers,
    strings, UUIDs; JSON dumped), without building a model instance or preparing each value in Python.
    Fields that set themselves on save (auto_now) are not supported. Elsewhere the ORM's bulk_create.
    """
    if not rows:
        return []
    if not is_postgresql():
        return _bulk_create(model, rows)
    if len(rows) == 1:
        sql, fields = _insert_values_statement(model)
        params = _values(fields, rows[0])
    else:
        sql, fields = _insert_unnest_statement(model)
        params = [_column(f, rows) for f in fields]
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return [pk for (pk,) in cursor.fetchall()]


def model_row_insert_with(
    model: type[models.Model],
    row: Mapping[str, Any],
    child_model: type[models.Model],
    child_row: Mapping[str, Any],
    fk: str,
) -> tuple[int, int]:
    """Insert one row of `model` and one of `child_model` that refers to it by its field `fk` (an
    attname, e.g. "job_id"; the child's own value for it is ignored), rows given as in
    model_rows_insert; returns their ids.

    On PostgreSQL one statement, the child's INSERT fed the row's id by a data-modifying WITH: one
    round trip where two cost each side a statement (a submission and its first event). The foreign
    key must be deferred, as Django's are on PostgreSQL: the statement's two parts do not see each
    other's rows, and it is checked at commit. Elsewhere two statements.
    """
    if not is_postgresql():
        (pk,) = model_rows_insert(model, [row])
        (child_pk,) = model_rows_insert(child_model, [{**child_row, fk: pk}])
        return pk, child_pk
    sql, fields, child_fields = _insert_with_statement(model, child_model, fk)
    with connection.cursor() as cursor:
        cursor.execute(sql, _values(fields, row) + _values(child_fields, child_row))
        pk, child_pk = cursor.fetchone()
    return pk, child_pk


def _bulk_create(model: type[models.Model], rows: Sequence[Mapping[str, Any]]) -> list[int]:
    names = {f.attname for f in _inserted_fields(model)}
    objs = [model(**{k: v for k, v in row.items() if k in names}) for row in rows]
    return [obj.pk for obj in model.objects.bulk_create(objs, batch_size=1000)]


def _inserted_fields(model: type[models.Model]) -> list[models.Field]:
    meta = model._meta
    return [f for f in meta.concrete_fields if f is not meta.auto_field]


def _values(fields: Sequence[models.Field], row: Mapping[str, Any]) -> list[Any]:
    """One row's values in the fields' order, as _column gives a column's."""
    values = []
    for field in fields:
        value = row[field.attname] if field.attname in row else field.get_default()
        if value is not None and isinstance(field, models.JSONField):
            value = json.dumps(value, cls=field.encoder)
        values.append(value)
    return values


# The statements are built once per model (PostgreSQL only): each column's type took more CPU to look
# up than the database took to insert a submission's row (bench.submit_cost).
@cache
def _insert_values_statement(model: type[models.Model]) -> tuple[str, list[models.Field]]:
    """INSERT ... VALUES (%s, ...) RETURNING id for one row, and its fields in order."""
    fields = _inserted_fields(model)
    return f"{_insert_into(model, fields)} VALUES ({_placeholders(fields)}) {_returning(model)}", fields


@cache
def _insert_unnest_statement(model: type[models.Model]) -> tuple[str, list[models.Field]]:
    """INSERT ... SELECT * FROM unnest(%s::type[], ...) RETURNING id, and its fields in order."""
    fields = _inserted_fields(model)
    arrays = ", ".join(f"%s::{f.db_type(connection)}[]" for f in fields)
    return f"{_insert_into(model, fields)} SELECT * FROM unnest({arrays}) {_returning(model)}", fields


@cache
def _insert_with_statement(
    model: type[models.Model], child_model: type[models.Model], fk: str
) -> tuple[str, list[models.Field], list[models.Field]]:
    """model_row_insert_with's statement, the row's fields and the child's (without `fk`)."""
    parent, fields = _insert_values_statement(model)
    fk_field = child_model._meta.get_field(fk)
    child_fields = [f for f in _inserted_fields(child_model) if f is not fk_field]
    quote = connection.ops.quote_name
    pk, child_pk = quote(model._meta.pk.column), quote(child_model._meta.pk.column)
    sql = (
        f"WITH p AS ({parent}) {_insert_into(child_model, [fk_field, *child_fields])}"
        f" VALUES ((SELECT {pk} FROM p), {_placeholders(child_fields)})"
        f" RETURNING {quote(fk_field.column)}, {child_pk}"
    )
    return sql, fields, child_fields


def _insert_into(model: type[models.Model], fields: Sequence[models.Field]) -> str:
    quote = connection.ops.quote_name
    return f"INSERT INTO {quote(model._meta.db_table)} ({', '.join(quote(f.column) for f in fields)})"


def _placeholders(fields: Sequence[models.Field]) -> str:
    return ", ".join(["%s"] * len(fields))


def _returning(model: type[models.Model]) -> str:
    return f"RETURNING {connection.ops.quote_name(model._meta.pk.column)}"
