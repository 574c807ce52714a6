"""The job page shows a job's moves, preemptions and the GPU time lost to restarts."""

import re

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from tests.factories import JobFactory
from tests.scheduler_app.test_restarts_selectors import (
    LOST_WORK_GPU_S,
    STARTUP_GPU_S,
    moved_twice_and_preempted,
)

pytestmark = pytest.mark.django_db


def restarts_text(html: str) -> str:
    found = re.search(r'<dd id="job-restarts">(.*?)</dd>', html, re.S)
    assert found, html
    return re.sub(r"<[^>]+>", "", found.group(1)).replace("&times;", "x")


def test_a_moved_and_preempted_job_shows_its_restarts_and_the_gpu_time_they_lost(user, client_of, cluster):
    job = moved_twice_and_preempted()
    text = restarts_text(client_of(user).get(f"/jobs/{job.pk}/").content.decode())
    hours = (LOST_WORK_GPU_S + STARTUP_GPU_S) / 3600
    assert text.startswith("moved 2x, preempted 1x, requeued 0x · ")
    assert f"{hours:.2f} GPU-hours lost" in text


def test_a_job_never_stopped_shows_none(user, client_of, cluster):
    job = JobFactory(owner=user)
    assert restarts_text(client_of(user).get(f"/jobs/{job.pk}/").content.decode()) == "none"


def test_the_restarts_come_with_the_jobs_own_query(user, client_of, cluster):
    job = moved_twice_and_preempted()
    with CaptureQueriesContext(connection) as queries:
        assert client_of(user).get(f"/jobs/{job.pk}/").status_code == 200
    assert len([q for q in queries.captured_queries if '"restart_moves"' in q["sql"]]) == 1
