"""infra.bulk_sql: multi-row UPDATE and INSERT ... ON CONFLICT DO NOTHING, on this run's database.

The suite runs on PostgreSQL; test_the_same_tests_pass_on_sqlite runs this file again on SQLite (the
embedded demo's database), where update_from_values takes Django's bulk_update path.
"""

from __future__ import annotations

import os
import subprocess
import sys
from datetime import UTC, datetime, timedelta

import pytest
from django.db import connection

from cluster_app.models import ClusterUsageMinute, NodeState, Server
from cluster_app.usage_minutes import SUM_FIELDS
from infra.bulk_sql import insert_new, model_row_insert_with, model_rows_insert, update_from_values
from infra.vendor import is_postgresql
from scheduler_app.models import Job, JobEvent
from tests.factories import ServerFactory, UserFactory, WorkloadFactory
from tests.standalone import ROOT

pytestmark = pytest.mark.django_db
# Set in the SQLite run's environment, so that it does not start a third.
ON_SQLITE_ENV = "ATTUNE_TEST_INFRA_ON_SQLITE"
MINUTE = datetime(2026, 1, 2, 3, 4, tzinfo=UTC)


def test_update_from_values_sets_each_rows_own_values_and_nothing_else():
    a, b, untouched = ServerFactory(), ServerFactory(), ServerFactory()
    rows = [
        {"pk": a.pk, "state": NodeState.DRAINED, "state_reason": "maintenance", "mem_gb": 12.5},
        {"pk": b.pk, "state": NodeState.DOWN, "state_reason": "", "mem_gb": 64.0},
    ]
    assert update_from_values(Server, rows, ["state", "state_reason", "mem_gb"]) == 2
    got = {s.pk: (s.state, s.state_reason, s.mem_gb) for s in Server.objects.all()}
    assert got[a.pk] == (NodeState.DRAINED, "maintenance", 12.5)
    assert got[b.pk] == (NodeState.DOWN, "", 64.0)
    assert got[untouched.pk] == (untouched.state, untouched.state_reason, untouched.mem_gb)


def test_update_from_values_of_no_rows_runs_no_statement(django_assert_num_queries):
    with django_assert_num_queries(0):
        assert update_from_values(Server, [], ["state"]) == 0


def test_update_from_values_is_one_statement_on_postgresql(django_assert_num_queries):
    servers = [ServerFactory() for _ in range(5)]
    rows = [{"pk": s.pk, "state_reason": f"r{i}"} for i, s in enumerate(servers)]
    if is_postgresql():
        with django_assert_num_queries(1):  # UPDATE ... FROM (VALUES ...), whatever the rows
            update_from_values(Server, rows, ["state_reason"])
    else:
        update_from_values(Server, rows, ["state_reason"])  # Django's bulk_update
    assert sorted(Server.objects.values_list("state_reason", flat=True)) == [f"r{i}" for i in range(5)]


def test_insert_new_returns_only_the_rows_it_inserted():
    later = MINUTE + timedelta(minutes=1)
    first = insert_new(
        ClusterUsageMinute,
        ["minute"],
        [_minute_row(MINUTE, 1), _minute_row(later, 2)],
        ["id", "servers_sampled"],
    )
    assert sorted(sampled for _, sampled in first) == [1, 2]
    again = insert_new(
        ClusterUsageMinute,
        ["minute"],
        [
            _minute_row(MINUTE, 9),
            _minute_row(later + timedelta(minutes=1), 3),
        ],
        ["servers_sampled"],
    )
    assert again == [(3,)]  # the clash on `minute` inserted nothing and returned nothing
    assert ClusterUsageMinute.objects.get(minute=MINUTE).servers_sampled == 1  # not overwritten
    assert ClusterUsageMinute.objects.count() == 3
    assert insert_new(ClusterUsageMinute, ["minute"], [], ["id"]) == []


def test_model_rows_insert_returns_the_ids_in_the_rows_order_and_fills_defaults():
    minutes = [MINUTE + timedelta(minutes=i) for i in (3, 1, 2)]
    ids = model_rows_insert(
        ClusterUsageMinute, [{"minute": m, "gpu_samples": i} for i, m in enumerate(minutes)]
    )
    assert len(set(ids)) == 3
    stored = {row.pk: row for row in ClusterUsageMinute.objects.all()}
    assert [stored[pk].minute for pk in ids] == minutes  # each id is its own row's
    assert [stored[pk].gpu_samples for pk in ids] == [0, 1, 2]
    assert {stored[pk].servers_sampled for pk in ids} == {0}  # the field's default
    assert model_rows_insert(ClusterUsageMinute, []) == []


def test_model_rows_insert_of_one_row_stores_its_values_and_defaults(django_assert_num_queries):
    with django_assert_num_queries(1):
        (pk,) = model_rows_insert(ClusterUsageMinute, [{"minute": MINUTE, "gpu_samples": 7}])
    stored = ClusterUsageMinute.objects.get(pk=pk)
    assert (stored.minute, stored.gpu_samples, stored.servers_sampled) == (MINUTE, 7, 0)


def test_model_row_insert_with_stores_a_row_and_its_child_that_refers_to_it(django_assert_num_queries):
    owner, workload = UserFactory(), WorkloadFactory()
    job = Job(owner=owner, name="parent", workload=workload, num_gpus=1, total_iters=10)
    event = JobEvent(kind="submitted", to_state="PENDING", data={"held": True, "n": [1, 2]}, at=MINUTE)
    with django_assert_num_queries(1 if is_postgresql() else 2):
        pk, event_pk = model_row_insert_with(Job, vars(job), JobEvent, vars(event), "job_id")
    assert Job.objects.get(pk=pk).name == "parent"
    stored = JobEvent.objects.get(pk=event_pk)
    assert (stored.job_id, stored.kind, stored.data, stored.at) == (
        pk,
        "submitted",
        {"held": True, "n": [1, 2]},
        MINUTE,
    )


def _minute_row(minute: datetime, servers_sampled: int) -> dict:
    """Every column: insert_new writes what it is given, not the model's Python-side defaults."""
    return {"minute": minute, **dict.fromkeys(SUM_FIELDS, 0), "servers_sampled": servers_sampled}


def test_is_postgresql_names_this_runs_vendor():
    assert is_postgresql() == (connection.vendor == "postgresql")


@pytest.mark.skipif(bool(os.environ.get(ON_SQLITE_ENV)), reason="this is the SQLite run")
def test_the_same_tests_pass_on_sqlite(tmp_path):
    """This file again on SQLite (pytest-django builds its test database there in memory)."""
    env = {k: v for k, v in os.environ.items() if k != "DATABASE_URL"}
    env["DATABASE_URL"] = f"sqlite:///{tmp_path / 'infra.sqlite3'}"
    env[ON_SQLITE_ENV] = "1"
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--create-db", __file__],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    assert "8 passed, 1 skipped" in result.stdout
