"""The suite's one headless chromium (Debian's, driven by playwright's sync API) and its pages.

One session-wide browser for every package that drives it (tests/browser, tests/auth): playwright's
sync API keeps an event loop running in the test thread while it is started, so a second
`sync_playwright()` in the same session fails ("using Playwright Sync API inside the asyncio loop").
The fixtures are defined once here and made visible to the whole suite by tests/conftest.py.
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
