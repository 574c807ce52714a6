"""The job page and the queue page say as of when the estimates they show hold."""

import re
from datetime import timedelta

import pytest
from django.utils import timezone

from scheduler_app.services.forecasts import job_forecasts_refresh
from scheduler_app.templatetags.as_of import as_of_words
from tests.web.conftest import pending_job, running_job

pytestmark = pytest.mark.django_db


def refreshed_minutes_ago(minutes: int):
    at = timezone.now().replace(microsecond=0) - timedelta(minutes=minutes, seconds=10)
    job_forecasts_refresh(now=at)
    return at


def test_the_job_page_says_as_of_when_its_estimate_holds(user, client_of, cluster):
    waiting = pending_job(user)
    running, _ = running_job(user, cluster, gpus=4)
    at = refreshed_minutes_ago(3)
    clock, _ = as_of_words(at)  # the day too, where it was yesterday (just after midnight)
    client = client_of(user)

    html = client.get(f"/jobs/{waiting.pk}/").content.decode()
    start = re.search(r'<dd id="estimated-start">(.*?)</dd>', html, re.S).group(1)
    assert f'(as of <span class="as-of" title="{at.isoformat()}">{clock}</span>, 3 min ago)' in start
    finish = re.search(r'<dd id="estimated-finish">(.*?)</dd>', html, re.S).group(1)
    assert "as of" not in finish  # said once, by the start

    html = client.get(f"/jobs/{running.pk}/").content.decode()
    finish = re.search(r'<dd id="estimated-finish">(.*?)</dd>', html, re.S).group(1)
    assert f">{clock}</span>, 3 min ago)" in finish


def test_a_job_without_an_estimate_says_no_time(user, client_of, cluster):
    waiting = pending_job(user)
    html = client_of(user).get(f"/jobs/{waiting.pk}/").content.decode()
    assert "estimate-as-of" not in html and "as of" not in html


def test_the_queue_page_says_as_of_when_and_each_row_on_hover(user, client_of, cluster):
    pending_job(user)
    at = refreshed_minutes_ago(12)
    clock, _ = as_of_words(at)  # the day too, where it was yesterday (just after midnight)
    html = client_of(user).get("/jobs/").content.decode()
    note = re.search(r'<small class="muted" id="estimates-as-of">(.*?)</small>', html, re.S).group(1)
    assert "estimates as of <span" in note and f">{clock}</span>, 12 min ago, or newer" in note
    assert f'title="as of {clock}, 12 min ago"' in html
