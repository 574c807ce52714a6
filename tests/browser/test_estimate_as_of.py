"""A job page in a real browser says as of when its estimate holds, and follows a newer refresh."""

from __future__ import annotations

from datetime import timedelta

from django.utils import timezone

from scheduler_app.services.forecast_as_of import forecast_confirm
from scheduler_app.services.forecasts import job_forecasts_refresh
from scheduler_app.templatetags.as_of import as_of_words
from tests.api.helpers import make_server, submit, workload
from tests.browser.conftest import login


def test_the_job_page_says_as_of_when_and_follows_the_next_refresh(browser_page, live_server, user):
    workload("res18")
    make_server("gpu01", gpus=4, cpus=12, mem_gb=250)
    submit(user, gpus=4, name="ahead")
    job = submit(user, gpus=4, name="waiting")
    at = timezone.now().replace(microsecond=0) - timedelta(minutes=25, seconds=5)
    job_forecasts_refresh(now=at)
    page = login(browser_page, live_server, user)
    page.goto(f"{live_server.url}/jobs/{job.pk}/")
    page.evaluate("window.__not_reloaded = true")
    start = page.locator("#estimated-start")
    assert start.inner_text().endswith(f"(as of {as_of_words(at)[0]}, 25 min ago)"), start.inner_text()

    # A cycle that started a minute ago finishes: the live refresh (every 5 s) shows it, no reload.
    later = timezone.now().replace(microsecond=0) - timedelta(seconds=65)
    forecast_confirm(later)
    page.wait_for_function(
        "() => document.querySelector('#estimated-start').textContent.includes('1 min ago')", timeout=15_000
    )
    assert start.inner_text().endswith(f"(as of {as_of_words(later)[0]}, 1 min ago)"), start.inner_text()
    assert page.evaluate("window.__not_reloaded") is True
    assert browser_page.console_errors == []
