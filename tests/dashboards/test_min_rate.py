"""The QoS dashboard's minimum-rate kind: judged at completion from the measured rate, apart."""

from __future__ import annotations

import pytest
from django.utils import timezone

from profiles_app.models import SpeedObservation
from scheduler_app.dashboards import selectors
from scheduler_app.dashboards.buckets import Window
from scheduler_app.models import JobState
from tests.dashboards.conftest import T0, at, completed_job
from tests.factories import AllocationFactory, JobFactory, TeamFactory

pytestmark = pytest.mark.django_db


def measured(job, *leases: tuple[float, int]) -> None:
    """Leases of `job` whose agents reported `rate` iterations/s, `samples` times each."""
    now = timezone.now()
    for rate, samples in leases:
        SpeedObservation.objects.create(
            workload=job.workload,
            job=job,
            allocation=AllocationFactory(job=job),
            cpus_per_gpu=3,
            mem_gb_per_gpu=62.5,
            predicted_iters_per_s=2.0,
            measured_iters_per_s=rate,
            samples=samples,
            first_at=now,
            at=now,
        )


def test_min_rate_jobs_have_their_own_guarantee_rate():
    team = TeamFactory(name="x")
    # Day 1: met (3 reports at 2.0 and 1 at 1.0: weighted 1.75 >= 1.5), missed (1.0 < 1.5).
    measured(
        completed_job(submitted_h=0, finished_h=5, team=team, qos_min_rate_iters_per_s=1.5),
        (2.0, 3),
        (1.0, 1),
    )
    measured(completed_job(submitted_h=0, finished_h=6, team=team, qos_min_rate_iters_per_s=1.5), (1.0, 4))
    # Day 2: met.
    measured(completed_job(submitted_h=20, finished_h=30, qos_min_rate_iters_per_s=0.5), (0.5, 3))
    # Left out: no report; failed; still running; finished after the window.
    completed_job(submitted_h=0, finished_h=7, qos_min_rate_iters_per_s=1.0)
    failed = JobFactory(
        state=JobState.FAILED, submitted_at=at(1), finished_at=at(2), qos_min_rate_iters_per_s=0.1
    )
    measured(failed, (5.0, 3))
    measured(JobFactory(state=JobState.RUNNING, submitted_at=at(1), qos_min_rate_iters_per_s=0.1), (5.0, 3))
    measured(completed_job(submitted_h=40, finished_h=50, qos_min_rate_iters_per_s=0.1), (5.0, 3))
    # A deadline job: counted in the deadline kind only.
    completed_job(submitted_h=0, finished_h=5, qos_deadline_at=at(10))
    data = selectors.qos_series(window=Window(start=T0, end=at(48), bucket_s=86400))
    assert data["min_rate"] == {
        "met": [1, 1],
        "decided": [2, 1],
        "rate_pct": [50.0, 100.0],
        "overall_pct": pytest.approx(66.667),
    }
    assert (data["met"], data["decided"], data["overall_pct"]) == ([1, 0], [1, 0], 100.0)


def test_no_min_rate_jobs_gives_an_empty_series():
    completed_job(submitted_h=0, finished_h=5, qos_deadline_at=at(10))
    data = selectors.qos_series(window=Window(start=T0, end=at(48), bucket_s=86400))
    assert data["min_rate"] == {
        "met": [0, 0],
        "decided": [0, 0],
        "rate_pct": [None, None],
        "overall_pct": None,
    }


def test_the_qos_page_says_how_the_rate_kind_is_judged(staff_client):
    page = staff_client.get("/dashboards/qos/").content.decode()
    assert "minimum rate" in page
