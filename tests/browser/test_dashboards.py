"""The staff dashboards in a real browser: every chart drawn from its JSON; a what-if run to its charts."""

from __future__ import annotations

import re

import pytest
from django.core.cache import cache
from django.urls import reverse
from playwright.sync_api import expect

from scheduler_app.conf import scheduler_conf
from scheduler_app.durations import format_duration, format_iter_time
from scheduler_app.models import SimulationRun, SimulationStatus
from tests.dashboards.test_views import seed_a_little
from tests.scheduler_app.test_durations import CASES, ITER_CASES

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
        # The browser's clock, 24-hour (14:02:31), as the pages print times; not its locale's "2:02:31 PM".
        expect(page.locator("#dash-status")).to_have_text(re.compile(r"^updated \d\d:\d\d:\d\d$"))
        if name == "qos":  # seed_a_little's five forecasts, each 30 min early, 3 of 5 verdicts right
            expect(page.locator('[data-chart="admission-time"] .gtitle')).to_contain_text(
                "5 jobs, median 30 min, verdict right 60%"
            )
        if name == "jobs":  # five jobs of 2 h each
            cdf = page.locator('[data-chart="jct-cdf"]')
            expect(cdf.locator(".gtitle")).to_contain_text("5 completed jobs, median 2 h")
            expect(cdf.locator(".xtitle")).to_have_text("job completion time (h)")
        assert (
            page.locator(".chart[data-endpoint] .main-svg").count()
            >= page.locator(".chart[data-endpoint]").count()
        )
    # A new window redraws in place, without a page reload, and the page's URL keeps it.
    page.evaluate("document.body.dataset.marker = 'same-page'")
    with page.expect_response(re.compile(r"/dashboards/api/queue\.json\?window=30d$")):
        page.locator("#dash-window").select_option("30d")
    page.wait_for_function(ALL_CHARTS_DRAWN)
    assert page.evaluate("document.body.dataset.marker") == "same-page"
    assert page.url.endswith("/dashboards/queue/?window=30d")
    assert page.console_errors == []


def test_the_window_survives_a_reload_and_goes_with_every_data_request(
    browser_page, live_server, login, staff_user, quiet_scheduler
):
    seed_a_little()
    page = login(browser_page, live_server, staff_user)
    requested: list[str] = []
    page.on("request", lambda r: requested.append(r.url) if "/dashboards/api/" in r.url else None)
    page.goto(f"{live_server.url}{reverse('dashboards:utilisation')}")
    page.wait_for_function(ALL_CHARTS_DRAWN)
    expect(page.locator("#dash-window")).to_have_value("24h")  # the default
    assert requested and all(url.endswith("?window=24h") for url in requested)
    with page.expect_response(re.compile(r"/dashboards/api/utilisation\.json\?window=6h$")):
        page.locator("#dash-window").select_option("6h")
    assert page.url.endswith("/dashboards/utilisation/?window=6h")
    requested.clear()
    page.reload()
    page.wait_for_function(ALL_CHARTS_DRAWN)
    expect(page.locator("#dash-window")).to_have_value("6h")
    assert requested and all(url.endswith("?window=6h") for url in requested)
    # Going to another dashboard keeps it too.
    page.get_by_role("link", name="Queue", exact=True).last.click()
    page.wait_for_url(re.compile(r"/dashboards/queue/\?window=6h$"))
    expect(page.locator("#dash-window")).to_have_value("6h")
    assert page.console_errors == []


def test_the_charts_write_durations_as_the_server_does(browser_page, live_server, login, staff_user):
    page = login(browser_page, live_server, staff_user)
    page.goto(f"{live_server.url}{reverse('dashboards:queue')}")
    seconds = [s for s, _ in CASES] + [None, 1e-9, 86399.9, 123456789.0]
    got = page.evaluate("xs => xs.map(x => window.AttuneDashboards.formatDuration(x))", seconds)
    assert got == [format_duration(s) for s in seconds]


def test_the_prediction_table_writes_iteration_times_as_the_server_does(
    browser_page, live_server, login, staff_user
):
    page = login(browser_page, live_server, staff_user)
    page.goto(f"{live_server.url}{reverse('dashboards:qos')}")
    seconds = [s for s, _ in ITER_CASES if s != float("inf")]  # JSON has no infinity
    got = page.evaluate("xs => xs.map(x => window.AttuneDashboards.formatIterTime(x))", seconds)
    assert got == [format_iter_time(s) for s in seconds]
    expect(page.locator("table[data-table='prediction-accuracy'] tbody")).to_contain_text(
        "no workload has a GENIE fit"
    )
    assert page.console_errors == []


def test_a_what_if_run_shows_its_progress_and_result_charts(
    browser_page, live_server, login, staff_user, quiet_scheduler
):
    page = login(browser_page, live_server, staff_user)
    page.goto(f"{live_server.url}{reverse('dashboards:whatif')}")
    shipped = scheduler_conf()  # the page offers the shipped scheduler against proportional
    expect(page.get_by_label(shipped.policy, exact=True)).to_be_checked()
    expect(page.get_by_label("proportional", exact=True)).to_be_checked()
    expect(page.get_by_label(shipped.allocator, exact=True)).to_be_checked()
    page.locator("#id_num_jobs").fill("20")
    page.locator("#id_servers").fill("2")
    page.get_by_role("button", name="Run simulation").click()
    page.wait_for_url(re.compile(r"/dashboards/whatif/\d+/$"))
    page.wait_for_selector("#whatif-run.whatif-done", timeout=60_000)
    page.wait_for_function(
        "() => [...document.querySelectorAll('.whatif-chart')].every(el => el.querySelector('.main-svg'))"
    )
    expect(page.locator("#whatif-table-body tr")).to_have_count(2)
    expect(page.locator("#whatif-table-body")).to_contain_text(f"{shipped.policy}/{shipped.allocator}")
    # Durations in readable units; the philly trace has no QoS target, and the page says what that means.
    cells = page.locator("#whatif-table-body tr").first.locator("td").all_inner_texts()
    assert all(re.fullmatch(r"-?[0-9.]+ (s|min|h|d)", c) for c in cells[1:5]), cells
    assert cells[5] == "\u2013"
    expect(page.locator("#whatif-no-qos")).to_be_visible()
    expect(page.locator("#whatif-status")).to_contain_text("SUCCEEDED")
    run = SimulationRun.objects.get()
    assert run.status == SimulationStatus.SUCCEEDED and len(run.results["runs"]) == 2
    assert page.console_errors == []
