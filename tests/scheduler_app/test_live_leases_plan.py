"""The statement every sync runs for its server's live leases (selectors/agents.py) keeps a plan that
starts from that server's leases, even as a prepared statement's generic plan on tables with no
statistics: the plan that started from every RUNNING job instead cost 13 ms a sync, not 0.05."""

from __future__ import annotations

import re

import pytest
from django.db import connection

from scheduler_app.models import Allocation, Job, JobState
from scheduler_app.selectors.agents import _live_leases, live_leases_sql
from tests.factories import AllocationFactory, JobFactory, ServerFactory

pytestmark = pytest.mark.django_db


def test_a_servers_live_leases_are_read_from_its_leases_first_whatever_the_statistics():
    if connection.vendor != "postgresql":
        pytest.skip("the plan is PostgreSQL's")
    servers = [ServerFactory() for _ in range(4)]
    first = JobFactory(state=JobState.RUNNING)  # one owner and workload for all: a user's hash is slow
    jobs = Job.objects.bulk_create(
        [
            JobFactory.build(state=JobState.RUNNING, owner=first.owner, workload=first.workload)
            for _ in range(2999)
        ]
    )
    Allocation.objects.bulk_create(
        [AllocationFactory.build(job=job, server=servers[i % 4]) for i, job in enumerate([first, *jobs])]
    )
    mine = set(Allocation.objects.filter(server=servers[0]).values_list("lease_id", flat=True))
    assert _live_leases(servers[0].pk) == (mine, False)
    numbered = iter(range(1, 10))
    statement = re.sub(r"%s", lambda _: f"${next(numbered)}", live_leases_sql())
    with connection.cursor() as cursor:
        # As a prepared statement after its fifth run may be planned: for any server, no statistics
        # (the test database is never analyzed: autovacuum, if on at all, has not come by yet).
        cursor.execute("SET LOCAL plan_cache_mode = force_generic_plan")
        cursor.execute(f"PREPARE live_leases_plan AS {statement}")
        try:
            cursor.execute(
                "EXPLAIN EXECUTE live_leases_plan (%s, 'running', 'running', %s, %s)", [servers[0].pk] * 3
            )
            plan = "\n".join(row[0] for row in cursor.fetchall())
        finally:
            cursor.execute("DEALLOCATE live_leases_plan")
    print(plan)
    job_table = Job._meta.db_table
    assert f"Seq Scan on {job_table}" not in plan, plan
    assert not re.search(rf"Index.* Scan using \S*state\S* on {job_table}", plan), plan
