"""The jobs dashboard's GPU-hours lost to restarts per day: its endpoint's days and totals, and its chart."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.urls import reverse
from django.utils import timezone

from tests.scheduler_app.test_restarts_selectors import LOST_WORK_GPU_S, moved_twice_and_preempted

pytestmark = pytest.mark.django_db


def test_the_endpoint_gives_the_clusters_gpu_hours_lost_each_day(staff_client, settings):
    settings.TIME_ZONE = "UTC"
    t0 = (timezone.now() - timedelta(days=3)).replace(hour=10, minute=0, second=0, microsecond=0)
    moved_twice_and_preempted(t0)
    data = staff_client.get(reverse("dashboards:api_restarts"), {"window": "7d"}).json()
    day1, day2 = ((t0 + timedelta(days=n)).date().isoformat() for n in (0, 1))
    assert data["days"] == [day1, day2]
    first, second = (LOST_WORK_GPU_S + 4 * 50 + 4 * 60) / 3600, 8 * 30 / 3600
    assert data["gpu_hours"] == [pytest.approx(first, abs=1e-6), pytest.approx(second, abs=1e-6)]
    assert data["total_gpu_hours"] == pytest.approx(first + second, abs=1e-6)
    # A window that ends before the restarts holds none.
    empty = staff_client.get(reverse("dashboards:api_restarts"), {"window": "1h"}).json()
    assert (empty["days"], empty["total_gpu_hours"]) == ([], 0)


def test_the_jobs_page_has_the_chart(staff_client):
    html = staff_client.get(reverse("dashboards:jobs")).content.decode()
    assert f'data-endpoint="{reverse("dashboards:api_restarts")}" data-chart="restart-loss"' in html
