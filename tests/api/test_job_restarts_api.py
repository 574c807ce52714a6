"""A job's restarts in the REST API: its detail and every job of a list, in the list's own query."""

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from rest_framework.test import APIClient

from tests.factories import JobFactory
from tests.scheduler_app.test_restarts_selectors import (
    LOST_WORK_GPU_S,
    STARTUP_GPU_S,
    moved_twice_and_preempted,
)

pytestmark = pytest.mark.django_db

JOBS = "/api/v1/jobs/"
MOVED = {
    "moves": 2,
    "preemptions": 1,
    "requeues": 0,
    "resizes": 0,
    "restarts": 3,
    "gpu_s_lost": LOST_WORK_GPU_S + STARTUP_GPU_S,
}
NONE = {"moves": 0, "preemptions": 0, "requeues": 0, "resizes": 0, "restarts": 0, "gpu_s_lost": 0.0}


def test_the_detail_and_the_list_show_each_jobs_restarts(user):
    client = APIClient()
    client.force_authenticate(user)
    moved, calm = moved_twice_and_preempted(), JobFactory(owner=user)
    assert client.get(f"{JOBS}{moved.pk}/").json()["restarts"] == MOVED
    assert client.get(f"{JOBS}{calm.pk}/").json()["restarts"] == NONE
    listed = {
        job["id"]: job["restarts"]
        for job in client.get(JOBS, {"state": ["RUNNING", "PENDING"]}).json()["results"]
    }
    assert listed == {moved.pk: MOVED, calm.pk: NONE}


def test_a_longer_list_costs_no_more_queries(user):
    client = APIClient()
    client.force_authenticate(user)

    def queries_for_list() -> int:
        with CaptureQueriesContext(connection) as queries:
            assert client.get(JOBS, {"state": ["RUNNING"]}).status_code == 200
        return len(queries.captured_queries)

    moved_twice_and_preempted()
    one = queries_for_list()
    for _ in range(5):
        moved_twice_and_preempted()
    assert queries_for_list() == one
