"""A submission's count of the pending jobs ahead (FIFO: services/admission_window.py; SWAF:
services/admission_tail.py) reads the pending jobs' partial indexes (migration 0026), never the whole
job table, even as a prepared statement's generic plan on tables without statistics: the sequential
scan read every pending, running and finished job (SWAF: 10 ms at 10,000 pending for a job inside the
forecast's window, 20 ms behind it with 100,000 finished jobs)."""

from __future__ import annotations

import pytest
from django.db import connection
from django.utils import timezone

from infra.prepared_sql import numbered
from scheduler_app.conf import scheduler_conf
from scheduler_app.models import Job, JobState
from scheduler_app.services import admission_tail, admission_window
from tests.factories import JobFactory, WorkloadFactory

pytestmark = pytest.mark.django_db


@pytest.fixture
def queue(settings):
    """3,000 pending jobs of two workloads and GPU counts behind 1,000 finished ones, never analyzed."""
    if connection.vendor != "postgresql":
        pytest.skip("the plan is PostgreSQL's")
    settings.ATTUNE_SCHEDULER = {**settings.ATTUNE_SCHEDULER, "policy": "swaf"}
    admission_tail.rates_forget()
    first = JobFactory(state=JobState.COMPLETED, finished_at=timezone.now())
    other = WorkloadFactory(name="other")
    Job.objects.bulk_create(
        [
            JobFactory.build(
                owner=first.owner,
                workload=first.workload if i % 2 else other,
                num_gpus=1 + i % 4,
                total_iters=1000 + i,
                state=JobState.COMPLETED if i < 1000 else JobState.PENDING,
            )
            for i in range(4000)
        ]
    )
    yield first
    admission_tail.rates_forget()


def _generic_plan(count) -> str:
    """The plan PostgreSQL may keep for the count's statement once prepared: generic, for any values."""
    seen = []

    def capture(execute, sql, params, many, context):
        seen.append((sql, params))
        return execute(sql, params, many, context)

    with connection.execute_wrapper(capture):
        count()
    sql, params = next((sql, params) for sql, params in seen if "OFFSET" in sql)
    text, values = numbered(sql, params)
    with connection.cursor() as cursor:
        cursor.execute("SET LOCAL plan_cache_mode = force_generic_plan")
        cursor.execute(f"PREPARE count_plan AS {text}")
        try:
            cursor.execute(
                "SELECT parameter_types::text[] FROM pg_prepared_statements WHERE name = 'count_plan'"
            )
            types = cursor.fetchone()[0]
            cursor.execute(f"EXPLAIN EXECUTE count_plan ({', '.join(f'%s::{t}' for t in types)})", values)
            return "\n".join(row[0] for row in cursor.fetchall())
        finally:
            cursor.execute("DEALLOCATE count_plan")


@pytest.mark.parametrize("iters", [1500, 5000], ids=["inside", "behind"])
def test_swafs_count_reads_the_pending_jobs_indexes(queue, iters):
    job = JobFactory(owner=queue.owner, workload=queue.workload, total_iters=iters)
    plan = _generic_plan(lambda: admission_tail.swaf_ahead_at_least(job, 1000, scheduler_conf().policy_obj()))
    assert f"Seq Scan on {Job._meta.db_table}" not in plan, plan
    assert "scheduler_app_job_pending_ahead" in plan, plan


def test_fifos_count_reads_the_pending_jobs_indexes(queue):
    job = JobFactory(owner=queue.owner, workload=queue.workload)
    plan = _generic_plan(lambda: admission_window.pending_ahead_at_least(job, 1000))
    assert f"Seq Scan on {Job._meta.db_table}" not in plan, plan
    assert "scheduler_app_job_pending_fifo" in plan, plan
