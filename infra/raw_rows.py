"""Model instances from a hand-written SELECT, as `Model.objects.raw()` builds them, with its per-query
set-up done once per statement shape.

raw() works out, on every query, which column feeds which field (a scan of the model's fields against
the column list, quadratic in the columns: a `SELECT *` of the job table) and each column's
converters. On an agent sync that was about a tenth of the web tier's CPU (py-spy on
`bench.sync_cost`). The result depends only on the model and the columns a statement returns, so it is
kept per connection (converters may be bound to it; a connection belongs to one thread) and per
(model, columns). Columns that are not fields become attributes, as raw()'s annotations do.
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from django.db import connections
from django.db.models import Model
from django.db.models.sql import Query

M = TypeVar("M", bound=Model)


@dataclass(frozen=True)
class _Plan:
    init_names: list[str]  # attnames given to Model.from_db, in the model's field order
    init_positions: list[int]  # their columns in a row
    annotations: list[tuple[str, int]]  # (attribute, column) for columns that are no field
    converters: list[tuple[int, list, Any]]  # (column, converter functions, their expression)


_plans: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _plan(connection, model: type[Model], columns: tuple[str, ...]) -> _Plan:
    per_connection = _plans.setdefault(connection, {})
    plan = per_connection.get((model, columns))
    if plan is not None:
        return plan
    to_identifier = connection.introspection.identifier_converter
    by_column = {to_identifier(f.column): f for f in model._meta.fields}
    position: dict[str, int] = {}
    for i, column in enumerate(columns):
        position.setdefault(column, i)  # the first of a repeated name, as list.index() in raw()
    init_fields = [f for f in model._meta.fields if to_identifier(f.column) in position]
    if model._meta.pk not in init_fields:
        raise ValueError(f"a query of {model.__name__} must return its primary key column")
    fields = [by_column.get(c) for c in columns]
    cols = [f.get_col(f.model._meta.db_table) if f else None for f in fields]
    compiler = connection.ops.compiler("SQLCompiler")(Query(model), connection, connection.alias)
    plan = _Plan(
        init_names=[f.attname for f in init_fields],
        init_positions=[position[to_identifier(f.column)] for f in init_fields],
        annotations=[(c, i) for i, c in enumerate(columns) if c not in by_column],
        converters=[(i, convs, expr) for i, (convs, expr) in compiler.get_converters(cols).items()],
    )
    per_connection[(model, columns)] = plan
    return plan


def model_rows(model: type[M], sql: str, params: Sequence[Any] = (), *, using: str = "default") -> list[M]:
    """The instances of `model` that `sql` returns (it must select the primary key), as raw() would."""
    connection = connections[using]
    columns, rows = _fetched(connection, sql, params)
    plan = _plan(connection, model, columns)
    if plan.converters:
        return [_built(connection, using, model, plan, list(row)) for row in rows]
    instances = []
    for row in rows:  # no converter: the row as fetched, without a copy
        instance = model.from_db(using, plan.init_names, [row[pos] for pos in plan.init_positions])
        for name, pos in plan.annotations:
            setattr(instance, name, row[pos])
        instances.append(instance)
    return instances


def model_rows_joined(
    model: type[M],
    sql: str,
    params: Sequence[Any] = (),
    *,
    joined: dict[str, type[Model]],
    using: str = "default",
) -> list[M]:
    """`model_rows` of a SELECT that also reads related rows: a column named `<attr>__<column>` is the
    column `<column>` of `joined[attr]`'s row, built as model_rows builds it and set as the instance's
    `attr` (None where its primary key is NULL: an outer join found none). One statement where a second
    one read the related rows by their keys."""
    connection = connections[using]
    columns, rows = _fetched(connection, sql, params)
    by_attr: dict[str, list[int]] = {attr: [] for attr in joined}
    own = []
    for i, column in enumerate(columns):
        attr, _, rest = column.partition("__")
        (by_attr[attr] if rest and attr in joined else own).append(i)
    own_plan = _plan(connection, model, tuple(columns[i] for i in own))
    related_plans = []  # (attr, model, its columns, its plan, its primary key's position among them)
    for attr, related in joined.items():
        plan = _plan(connection, related, tuple(columns[i].partition("__")[2] for i in by_attr[attr]))
        pk_at = plan.init_positions[plan.init_names.index(related._meta.pk.attname)]
        related_plans.append((attr, related, by_attr[attr], plan, pk_at))
    instances = []
    for row in rows:
        instance = _built(connection, using, model, own_plan, [row[i] for i in own])
        for attr, related, positions, plan, pk_at in related_plans:
            values = [row[i] for i in positions]
            other = None if values[pk_at] is None else _built(connection, using, related, plan, values)
            setattr(instance, attr, other)
        instances.append(instance)
    return instances


def _fetched(connection, sql: str, params: Sequence[Any]) -> tuple[tuple[str, ...], list[tuple[Any, ...]]]:
    """The statement's column names (as the backend names identifiers) and every row it returns."""
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        to_identifier = connection.introspection.identifier_converter
        columns = tuple(to_identifier(d[0]) for d in cursor.description)
        return columns, cursor.fetchall()


def _built(connection, using: str, model: type[M], plan: _Plan, row: list[Any]) -> M:
    """One instance of `model` from `row` (a list, converted in place), as `plan` reads it."""
    for pos, convs, expression in plan.converters:
        value = row[pos]
        for convert in convs:
            value = convert(value, expression, connection)
        row[pos] = value
    instance = model.from_db(using, plan.init_names, [row[pos] for pos in plan.init_positions])
    for name, pos in plan.annotations:
        setattr(instance, name, row[pos])
    return instance
