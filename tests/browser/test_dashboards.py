"""The staff dashboards in a real browser: every chart drawn from its JSON; a what-if run to its charts."""

from __future__ import annotations

import re

import pytest
from django.core.cache import cache
from django.urls import reverse
from playwright.sync_api import expect

from scheduler_app.models import SimulationRun, SimulationStatus
from tests.dashboards.test_views import seed_a_little

DASHBOARDS = ["index", "utilisation", "jobs", "qos", "queue"]
ALL_CHARTS_DRAWN = """() => {
  const charts = [...document.querySelectorAll('.chart[data-endpoint]')];
  return charts.length > 0
    && charts.every(el => el.classList.contains('js-plotly-plot') && el.querySelector('.main-svg'));
}"""


@pytest.fixture
def quiet_scheduler(settings):
    """Known policy/allocator; what-if runs on a thread of the live server (the embedded mode's path)."""
    cache.clear()  # no closed bucket cached by an earlier test
    settings.ATTUNE_SCHEDULER = {
        **settings.ATTUNE_SCHEDULER,
        "policy": "fifo",
        "allocator": "tune",
        "inline_rounds": True,
    }


def test_every_dashboard_draws_its_charts(browser_page, live_server, login, staff_user, quiet_scheduler):
    seed_a_little()
    page = login(browser_page, live_server, staff_user)
    for name in DASHBOARDS:
        page.goto(f"{live_server.url}{reverse(f'dashboards:{name}')}")
        page.wait_for_function(ALL_CHARTS_DRAWN)
        expect(page.locator("#dash-status")).to_contain_text("updated")
        if name == "qos":  # seed_a_little's five forecasts, each 30 min early, 3 of 5 verdicts right
            expect(page.locator('[data-chart="admission-time"] .gtitle')).to_contain_text(
                "5 jobs, median 0.50 h, verdict right 60%"
            )
        assert (
            page.locator(".chart[data-endpoint] .main-svg").count()
            >= page.locator(".chart[data-endpoint]").count()
        )
    # A new window redraws in place, without a page reload.
    page.evaluate("document.body.dataset.marker = 'same-page'")
    with page.expect_response(re.compile(r"/dashboards/api/queue\.json\?days=30")):
        page.locator("#dash-days").select_option("30")
    page.wait_for_function(ALL_CHARTS_DRAWN)
    assert page.evaluate("document.body.dataset.marker") == "same-page"
    assert page.console_errors == []


def test_a_what_if_run_shows_its_progress_and_result_charts(
    browser_page, live_server, login, staff_user, quiet_scheduler
):
    page = login(browser_page, live_server, staff_user)
    page.goto(f"{live_server.url}{reverse('dashboards:whatif')}")
    expect(page.get_by_label("fifo", exact=True)).to_be_checked()
    expect(page.get_by_label("proportional", exact=True)).to_be_checked()
    expect(page.get_by_label("tune", exact=True)).to_be_checked()
    page.locator("#id_num_jobs").fill("20")
    page.locator("#id_servers").fill("2")
    page.get_by_role("button", name="Run simulation").click()
    page.wait_for_url(re.compile(r"/dashboards/whatif/\d+/$"))
    page.wait_for_selector("#whatif-run.whatif-done", timeout=60_000)
    page.wait_for_function(
        "() => [...document.querySelectorAll('.whatif-chart')].every(el => el.querySelector('.main-svg'))"
    )
    expect(page.locator("#whatif-table-body tr")).to_have_count(2)
    expect(page.locator("#whatif-table-body")).to_contain_text("fifo/tune")
    expect(page.locator("#whatif-status")).to_contain_text("SUCCEEDED")
    run = SimulationRun.objects.get()
    assert run.status == SimulationStatus.SUCCEEDED and len(run.results["runs"]) == 2
    assert page.console_errors == []
