"""The accounting page's table of GPU-hours lost to restarts per day."""

from datetime import timedelta

import pytest
from django.utils import timezone

from tests.scheduler_app.test_restarts_selectors import LOST_WORK_GPU_S, moved_twice_and_preempted

pytestmark = pytest.mark.django_db


def test_the_page_shows_a_table_of_the_days_and_their_total(staff_user, client_of, settings):
    settings.TIME_ZONE = "UTC"
    t0 = (timezone.now() - timedelta(days=5)).replace(hour=10, minute=0, second=0, microsecond=0)
    moved_twice_and_preempted(t0)
    html = client_of(staff_user).get("/accounting/", {"window": "30d"}).content.decode()
    day1, day2 = (f"{(t0 + timedelta(days=n)):%Y-%m-%d}" for n in (0, 1))
    assert f'<tr data-day="{day1}">' in html and f'<tr data-day="{day2}">' in html
    total = (LOST_WORK_GPU_S + 4 * 50 + 4 * 60 + 8 * 30) / 3600
    assert f'<td id="restart-loss-total">{total:.2f}</td>' in html


def test_a_window_without_restarts_says_so(staff_user, client_of):
    html = client_of(staff_user).get("/accounting/", {"window": "24h"}).content.decode()
    assert 'id="restart-loss">No GPU time lost to restarts in this window.' in html
