"""model_rows builds the same instances as Model.objects.raw() for the same statement."""

from __future__ import annotations

import pytest
from django.db import connection

from cluster_app.models import Server
from infra.raw_rows import _plans, model_rows
from profiles_app.models import Workload
from scheduler_app.models import Allocation, Job
from tests.factories import AllocationFactory, JobFactory, ServerFactory, WorkloadFactory

pytestmark = pytest.mark.django_db


def _state(instance) -> dict:
    """Every loaded attribute (fields and annotations), not Django's bookkeeping."""
    return {k: v for k, v in instance.__dict__.items() if k != "_state"}


def _table(model) -> str:
    return connection.ops.quote_name(model._meta.db_table)


def assert_same_as_raw(model, sql: str, params: list) -> list:
    ours = model_rows(model, sql, params)
    theirs = list(model.objects.raw(sql, params))
    assert len(ours) == len(theirs) > 0
    for a, b in zip(ours, theirs, strict=True):
        assert type(a) is type(b)
        assert _state(a) == _state(b)
        assert {k: type(v) for k, v in _state(a).items()} == {k: type(v) for k, v in _state(b).items()}
        assert a.get_deferred_fields() == b.get_deferred_fields()
        assert a._state.adding is False and a._state.db == b._state.db
    return ours


def test_every_column_of_rows_with_json_dates_uuids_and_nulls():
    workload = WorkloadFactory()
    jobs = [JobFactory(workload=workload), JobFactory(workload=None, command="python train.py")]
    AllocationFactory(job=jobs[0])
    assert_same_as_raw(Job, f"SELECT * FROM {_table(Job)} ORDER BY id", [])
    assert_same_as_raw(Workload, f"SELECT * FROM {_table(Workload)} WHERE id = %s", [workload.pk])
    assert_same_as_raw(Allocation, f"SELECT * FROM {_table(Allocation)}", [])


def test_some_columns_leave_the_others_deferred_and_extra_columns_become_attributes():
    allocation = AllocationFactory()
    sql = f"SELECT id, lease_id, job_id, started_at, 1 + 1 AS rank FROM {_table(Allocation)}"
    (row,) = assert_same_as_raw(Allocation, sql, [])
    assert row.rank == 2 and row.lease_id == allocation.lease_id
    assert "num_gpus" in row.get_deferred_fields()
    sql = f"SELECT s.*, s.name AS server_name FROM {_table(Server)} s WHERE s.id = %s"
    (server,) = assert_same_as_raw(Server, sql, [ServerFactory().pk])
    assert server.server_name == server.name


def test_the_set_up_is_kept_per_statement_shape_and_the_primary_key_is_required():
    JobFactory()
    sql = f"SELECT * FROM {_table(Job)}"
    model_rows(Job, sql, [])
    plans = dict(_plans_of_this_connection())
    model_rows(Job, sql + " WHERE id > %s", [0])  # same columns: the same plan
    assert len(_plans_of_this_connection()) == len(plans)
    with pytest.raises(ValueError, match="primary key"):
        model_rows(Job, f"SELECT name FROM {_table(Job)}", [])


def _plans_of_this_connection() -> dict:
    from django.db import connections

    return _plans[connections["default"]]
