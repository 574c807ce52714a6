"""Browser fixtures: Debian's headless chromium driven by playwright's sync API against `live_server`.

Tests ask for `browser_page` (a fresh page in its own context; `page.console_errors` collects console
errors and uncaught page errors, so a test can assert there are none) and log in with
`login(page, live_server, user)`, a fixture or a plain import from this module. These tests use
`transactional_db`: the live server's thread must see what the test committed.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

CHROMIUM = Path("/usr/bin/chromium")
TEST_PASSWORD = "pw-for-tests"  # tests.factories.UserFactory's
TIMEOUT_MS = 15_000

# playwright's sync API runs an event loop in the test's thread; Django would then refuse the ORM
# calls that fixtures and tests make there ("cannot call this from an async context"). They are
# plain synchronous calls, so the guard is lifted for this test session.
os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"

HERE = Path(__file__).resolve().parent


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark every test under tests/browser/ `browser`, so `-m "not browser"` leaves them out."""
    for item in items:
        if HERE in Path(str(item.path)).resolve().parents:
            item.add_marker(pytest.mark.browser)


@pytest.fixture(scope="session")
def chromium_browser() -> Iterator[Any]:
    """One headless chromium for the session (launching one costs about a second)."""
    if not CHROMIUM.exists():
        pytest.skip(f"{CHROMIUM} is absent: install Debian's chromium (apt-get install -y chromium)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), headless=True)
        yield browser
        browser.close()


@pytest.fixture
def browser_page(chromium_browser, live_server, transactional_db) -> Iterator[Any]:
    """A fresh page (own cookies) whose `console_errors` lists console errors and page errors."""
    context = chromium_browser.new_context(base_url=live_server.url, locale="en-US", timezone_id="UTC")
    context.set_default_timeout(TIMEOUT_MS)
    page = context.new_page()
    page.console_errors = []
    page.on("console", lambda msg: page.console_errors.append(msg.text) if msg.type == "error" else None)
    page.on("pageerror", lambda exc: page.console_errors.append(f"page error: {exc}"))
    yield page
    context.close()


def login(page: Any, live_server: Any, user: Any, password: str = TEST_PASSWORD) -> Any:
    """Log `user` in through the login form; returns the page, now on the queue."""
    page.goto(f"{live_server.url}/accounts/login/")
    page.get_by_label("Username").fill(user.get_username())
    page.get_by_label("Password").fill(password)
    page.get_by_role("button", name="Log in").click()
    page.wait_for_url(f"{live_server.url}/jobs/")
    return page


@pytest.fixture(name="login")
def login_fixture():
    """`login` as a fixture, for tests that prefer asking for it to importing it."""
    return login


@pytest.fixture
def cluster(settings, monkeypatch):
    """One 4-GPU server and res18 under FIFO + tune; rounds run only when a test says so (no Redis,
    no beat), and each round's forecast refresh runs at its commit, as the forecasts worker would."""
    from scheduler_app.services.forecasts import job_forecasts_refresh
    from tests.api.helpers import make_server, workload

    settings.ATTUNE_SCHEDULER = {
        **settings.ATTUNE_SCHEDULER,
        "policy": "fifo",
        "allocator": "tune",
        "inline_rounds": False,
    }
    monkeypatch.setattr(
        "scheduler_app.services.round_requests.scheduling_round_request", lambda *, trigger: None
    )
    monkeypatch.setattr(
        "scheduler_app.services.forecast_refresh.job_forecasts_refresh_request",
        lambda *, trigger: job_forecasts_refresh(),
    )
    workload("res18")
    return make_server("gpu01", gpus=4, cpus=12, mem_gb=250)
