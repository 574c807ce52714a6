"""Named prepared statements for the agents' calls (infra/prepared_sql.py), on PostgreSQL."""

import pytest
from django.db import connection, transaction

from cluster_app.models import Server
from infra.prepared_sql import numbered, prepared_statements
from tests.factories import ServerFactory

pytestmark = pytest.mark.django_db(transaction=True)


def _prepared_on_server() -> set[str]:
    with connection.cursor() as cursor:
        cursor.execute("SELECT name FROM pg_prepared_statements WHERE name LIKE 'att_%%'")
        return {name for (name,) in cursor.fetchall()}


def test_placeholders_become_numbered_in_order():
    text, values = numbered("SELECT %s, %s WHERE a LIKE 'x%%'", [1, "b"])
    assert (text, values) == ("SELECT $1, $2 WHERE a LIKE 'x%'", [1, "b"])
    text, values = numbered("SELECT %(b)s, %(a)s, %(b)s", {"a": 1, "b": 2, "unused": 3})
    assert (text, values) == ("SELECT $1, $2, $1", [2, 1])
    for sql, params in (("SELECT %s, %s", [1]), ("SELECT %s", [1, 2]), ("SELECT %(a)s", [1])):
        with pytest.raises(ValueError):
            numbered(sql, params)


def _postgresql_only():
    if connection.vendor != "postgresql":
        pytest.skip("prepared statements are PostgreSQL's; the embedded SQLite runs statements as they are")


def test_a_statement_is_prepared_once_per_connection_and_answers_as_unprepared():
    _postgresql_only()
    servers = [ServerFactory() for _ in range(3)]
    ids = sorted(s.pk for s in servers)
    sql = f"SELECT id, name FROM {Server._meta.db_table} WHERE id = ANY(%s) ORDER BY id"
    with connection.cursor() as cursor:
        cursor.execute(sql, [ids])
        plain = cursor.fetchall()
    before = _prepared_on_server()
    with prepared_statements():
        for _ in range(7):  # past PostgreSQL's five custom plans, onto the generic one
            with connection.cursor() as cursor:
                cursor.execute(sql, [ids])
                assert cursor.fetchall() == plain
    added = _prepared_on_server() - before
    assert len(added) == 1, added
    with connection.cursor() as cursor:
        cursor.execute("SELECT statement FROM pg_prepared_statements WHERE name = %s", [added.pop()])
        assert "ANY($1)" in cursor.fetchone()[0]


def test_writes_report_their_rows_and_prepared_statements_outlive_a_rollback():
    _postgresql_only()
    server = ServerFactory(name="before")
    sql = f"UPDATE {Server._meta.db_table} SET name = %(name)s WHERE id = %(id)s"
    with prepared_statements():
        with transaction.atomic():
            with connection.cursor() as cursor:
                cursor.execute(sql, {"id": server.pk, "name": "rolled-back"})
                assert cursor.rowcount == 1
            transaction.set_rollback(True)
        # The name is known on this connection: the statement is EXECUTEd, not PREPAREd again (which
        # PostgreSQL would refuse: it already exists).
        with connection.cursor() as cursor:
            cursor.execute(sql, {"id": server.pk, "name": "after"})
            assert cursor.rowcount == 1
    server.refresh_from_db()
    assert server.name == "after"


def test_a_new_connection_prepares_again_and_other_statements_pass_through():
    _postgresql_only()
    server = ServerFactory()
    sql = f"SELECT name FROM {Server._meta.db_table} WHERE id = %s"
    with prepared_statements():
        with connection.cursor() as cursor:
            cursor.execute(sql, [server.pk])
        connection.close()  # what CONN_MAX_AGE or a failed health check does
        with connection.cursor() as cursor:
            cursor.execute(sql, [server.pk])
            assert cursor.fetchone() == (server.name,)
            cursor.execute("SET LOCAL lock_timeout = '1s'")  # not preparable: run as it is
            cursor.execute("SELECT 1")  # no parameters: nothing to plan again
    assert len(_prepared_on_server()) == 1


def test_statements_run_unprepared_when_the_setting_is_off(settings):
    _postgresql_only()
    server = ServerFactory()
    connection.close()  # a fresh session, without what earlier tests prepared
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT name FROM {Server._meta.db_table} WHERE id = %s", [server.pk])
    settings.ATTUNE_DB_PREPARED_STATEMENTS = False
    with prepared_statements(), connection.cursor() as cursor:
        cursor.execute(f"SELECT name FROM {Server._meta.db_table} WHERE id = %s", [server.pk])
    assert _prepared_on_server() == set()
