"""Browser fixtures: Debian's headless chromium driven by playwright's sync API against `live_server`.

Tests ask for `browser_page` (a fresh page in its own context; `page.console_errors` collects console
errors and uncaught page errors, so a test can assert there are none) and log in with
`login(page, live_server, user)`, a fixture or a plain import from this module. These tests use
`transactional_db`: the live server's thread must see what the test committed.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.browser_support import CHROMIUM, TEST_PASSWORD, TIMEOUT_MS, login  # noqa: F401 - this package's API

HERE = Path(__file__).resolve().parent


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark every test under tests/browser/ `browser`, so `-m "not browser"` leaves them out."""
    for item in items:
        if HERE in Path(str(item.path)).resolve().parents:
            item.add_marker(pytest.mark.browser)


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
