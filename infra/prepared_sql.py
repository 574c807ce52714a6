"""Named prepared statements on PostgreSQL for the agents' calls: planning was most of their database cost.

Each agent sync runs the same dozen statements with new values; PostgreSQL parsed and planned every one
of them every time (`python -m bench.sync_cost`: the PostgreSQL backend's CPU per empty sync went from
about 2.2 ms to 1.0 ms once prepared, docs/performance.md). Within `prepared_statements()`, every SELECT,
INSERT, UPDATE, DELETE or WITH statement that has parameters is PREPAREd once per database connection
(named by a hash of its text) and then run as EXECUTE; PostgreSQL plans it afresh for its first five
runs and then keeps a generic plan when that is no worse. A generic plan is chosen without the values
and, on a new database or one that autovacuum has not analyzed yet, without statistics: a statement
here must have one good plan whatever they say (scheduler_app/selectors/agents.py `live_leases_sql`,
whose join once started from every RUNNING job; tests/scheduler_app/test_live_leases_plan.py shows
how to check one). Statements are session objects in
PostgreSQL: they outlive a rolled-back transaction, and go with the connection (Django's persistent
connections keep them for CONN_MAX_AGE). Statements with different text (an IN list of 3 leases or
of 4) are different statements; at most MAX_PER_CONNECTION are kept, later ones run unprepared.

Off with ATTUNE_DB_PREPARED_STATEMENTS=0, for a pooler in transaction mode (PgBouncer) that moves a
session's statements between server connections. Other databases (the embedded SQLite) are untouched.
What an administrator sees changes: pg_stat_activity shows `EXECUTE att_...(...)` for these statements;
the text behind a name is in that session's pg_prepared_statements (and in the server's log with
log_statement, which prints both).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.db import connection

from infra.vendor import is_postgresql

PREPARABLE = ("SELECT", "INSERT", "UPDATE", "DELETE", "WITH")
MAX_PER_CONNECTION = 256
# A statement with more parameters than this (an IN list of a whole queue) is one of a kind: planned as is.
MAX_PARAMS = 100
_PLACEHOLDER = re.compile(r"%\((\w+)\)s|%s|%%")


def numbered(sql: str, params: Sequence[Any] | Mapping[str, Any]) -> tuple[str, list[Any]]:
    """`sql` with psycopg2's placeholders (`%s` in order, or `%(name)s`) as PostgreSQL's `$1, $2, ...`
    and the values in that order; `%%` becomes `%`. ValueError when the placeholders and `params`
    do not match."""
    text, names = _numbered(sql, params)
    return text, _ordered_values(params, names)


def _numbered(sql: str, params: Sequence[Any] | Mapping[str, Any]) -> tuple[str, tuple[str, ...] | None]:
    """`sql` numbered (see `numbered`) and the names of its `$1, $2, ...` (None: positional)."""
    named = isinstance(params, Mapping)
    names: list[str] = []
    count = 0

    def one(match: re.Match[str]) -> str:
        nonlocal count
        token = match.group(0)
        if token == "%%":
            return "%"
        if token == "%s":
            if named:
                raise ValueError("a %s placeholder with named parameters")
            count += 1
            return f"${count}"
        if not named:
            raise ValueError("a named placeholder with positional parameters")
        name = match.group(1)
        if name not in names:
            names.append(name)
        return f"${names.index(name) + 1}"

    text = _PLACEHOLDER.sub(one, sql)
    if not named and count != len(params):
        raise ValueError(f"{count} %s placeholders for {len(params)} parameters")
    return text, tuple(names) if named else None


def _ordered_values(params: Sequence[Any] | Mapping[str, Any], names: tuple[str, ...] | None) -> list[Any]:
    return list(params) if names is None else [params[name] for name in names]  # type: ignore[index]


def _statement_name(sql: str) -> str:
    return "att_" + hashlib.blake2b(sql.encode(), digest_size=10).hexdigest()


@dataclass(frozen=True)
class _Prepared:
    """A statement prepared on a session: its parameters' order and the EXECUTE that runs it."""

    order: tuple[str, ...] | None  # the names of `%(name)s` placeholders; None: positional
    execute_sql: str


def _prepared_on_session(db) -> dict[str, _Prepared]:
    """Name -> statement, of those prepared on `db`'s current server session (a new connection starts
    empty)."""
    raw = db.connection
    session = (id(raw), raw.get_backend_pid())
    state = db.__dict__.get("_attune_prepared")
    if state is None or state[0] != session:
        state = (session, {})
        db._attune_prepared = state
    return state[1]


def _run_prepared(execute, sql, params, many, context):
    """An execute_wrapper: PREPARE once, then EXECUTE (see the module's docstring)."""
    if many or not params or len(params) > MAX_PARAMS or not sql.lstrip()[:6].upper().startswith(PREPARABLE):
        return execute(sql, params, many, context)
    db = context["connection"]
    prepared = _prepared_on_session(db)
    name = _statement_name(sql)
    statement = prepared.get(name)
    if statement is None:
        if len(prepared) >= MAX_PER_CONNECTION:
            return execute(sql, params, many, context)
        text, names = _numbered(sql, params)
        execute(f"PREPARE {name} AS {text}", None, False, context)
        # Each argument cast to the type PostgreSQL inferred for it: psycopg2 writes values as typed
        # literals (a list is ARRAY[...] of text), which a plain statement's own casts convert but
        # EXECUTE would refuse (text[] is not jsonb[]).
        execute(
            "SELECT parameter_types::text[] FROM pg_prepared_statements WHERE name = %s",
            [name],
            False,
            context,
        )
        types = context["cursor"].fetchone()[0]
        arguments = ", ".join(f"%s::{t}" for t in types)
        statement = prepared[name] = _Prepared(names, f"EXECUTE {name}({arguments})")
    return execute(statement.execute_sql, _ordered_values(params, statement.order), False, context)


def prepared_enabled() -> bool:
    """On PostgreSQL, when allowed, and when connections persist: with a connection per request
    (CONN_MAX_AGE=0) every statement would be prepared for one use, three round trips for one."""
    return (
        is_postgresql()
        and bool(settings.ATTUNE_DB_PREPARED_STATEMENTS)
        and connection.settings_dict.get("CONN_MAX_AGE") != 0
    )


@contextmanager
def prepared_statements() -> Iterator[None]:
    """Run this thread's statements on the default database as prepared statements (PostgreSQL)."""
    if not prepared_enabled():
        yield
        return
    with connection.execute_wrapper(_run_prepared):
        yield
