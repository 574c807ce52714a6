"""Multi-row UPDATE in one statement: PostgreSQL's UPDATE ... FROM (VALUES ...), Django's bulk_update else."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from django.db import connection
from django.db.models import Model


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
    if connection.vendor != "postgresql":
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
