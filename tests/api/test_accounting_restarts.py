"""Accounting's GPU-hours lost to restarts per day: in the report, the endpoint and the page, scoped
like the rows (staff: the cluster's)."""

from datetime import timedelta

import pytest
from rest_framework.test import APIClient

from scheduler_app.selectors import accounting_report
from tests.scheduler_app.test_restarts_selectors import LOST_WORK_GPU_S, T0, moved_twice_and_preempted

pytestmark = pytest.mark.django_db

DAY1_GPU_H = (LOST_WORK_GPU_S + 4 * 50 + 4 * 60) / 3600
DAY2_GPU_H = 8 * 30 / 3600
WINDOW = {"start": (T0 - timedelta(days=1)).isoformat(), "end": (T0 + timedelta(days=3)).isoformat()}


@pytest.fixture(autouse=True)
def utc(settings):
    settings.TIME_ZONE = "UTC"


def test_the_report_has_the_gpu_hours_lost_each_day_of_the_jobs_its_reader_may_see(user, staff_user):
    job = moved_twice_and_preempted()
    start, end = T0 - timedelta(days=1), T0 + timedelta(days=3)
    days = accounting_report(start=start, end=end, user=staff_user, now=end).restart_loss_by_day
    assert [(d.day.isoformat(), d.gpu_hours) for d in days] == [
        ("2026-03-02", pytest.approx(DAY1_GPU_H)),
        ("2026-03-03", pytest.approx(DAY2_GPU_H)),
    ]
    # Another user's job: not in their report, as its rows are not.
    assert accounting_report(start=start, end=end, user=user, now=end).restart_loss_by_day == []
    assert accounting_report(start=start, end=end, user=job.owner, now=end).restart_loss_by_day == days


def test_the_endpoint_lists_the_days(staff_user):
    moved_twice_and_preempted()
    client = APIClient()
    client.force_authenticate(staff_user)
    body = client.get("/api/v1/accounting/", WINDOW).json()
    assert [d["day"] for d in body["restart_loss_by_day"]] == ["2026-03-02", "2026-03-03"]
    assert body["restart_loss_by_day"][1]["gpu_hours"] == pytest.approx(DAY2_GPU_H)
