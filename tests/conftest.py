"""Shared pytest setup: report which database the suite runs on; which tests run alone; common fixtures."""

import os
import sys
from pathlib import Path

import pytest
from django.conf import settings

# One chromium for the whole session, for every package with browser tests (tests/browser_support.py).
from tests.browser_support import browser_page, chromium_browser  # noqa: F401

# The service processes the end-to-end and fault tests start (gunicorn, Celery) inherit this: with
# DEBUG=0 they refuse the repository's public default key (config/secret_key.py).
os.environ.setdefault("SECRET_KEY", "attune-test-suite-only-secret-key-not-for-any-deployment")
# pytest-django may have loaded the settings before this file (with the demo's default key): the test
# process signs what those processes check (agent wait tickets, tokens), so it uses the same key.
if settings.configured:
    settings.SECRET_KEY = os.environ["SECRET_KEY"]


TESTS = Path(__file__).resolve().parent
# Tests that start real service, agent, browser or job processes, or time real work: `make test` runs
# them one at a time after the rest, which it runs in pytest-xdist workers (README.md, the Makefile).
SERIAL_PATHS = tuple(
    TESTS / name
    for name in (
        "agent",
        "auth",
        "browser",
        "config",
        "demo",
        "device",
        "e2e",
        "faults",
        # schemathesis's items share one node id, of which pytest-xdist would run only the first.
        "api/test_schema_fuzz.py",
        "test_docs_examples.py",
        "test_smoke.py",
    )
)
SERIAL_CHOICES = ("include", "exclude", "only")


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--serial",
        choices=SERIAL_CHOICES,
        default="include",
        help="the tests marked serial (real processes, timed work): include them (default), exclude "
        "them (what `make test` runs in parallel workers) or run only them",
    )


def pytest_configure(config: pytest.Config) -> None:
    # `workerinput`: this process is a worker (a pytest a test starts inherits PYTEST_XDIST_WORKER).
    if hasattr(config, "workerinput") and "tests.xdist_services" not in sys.modules:
        # Without it every worker would share the Redis databases, and one's FLUSHDB empty another's.
        raise pytest.UsageError("run pytest-xdist workers with -p tests.xdist_services (as `make test` does)")


def is_serial(path: Path) -> bool:
    return any(path == serial or serial in path.parents for serial in SERIAL_PATHS)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark the tests under SERIAL_PATHS `serial`; keep or drop them as --serial says."""
    choice = config.getoption("serial")
    kept, dropped = [], []
    for item in items:
        serial = is_serial(Path(str(item.path)).resolve())
        if serial:
            item.add_marker(pytest.mark.serial)
        if choice == "include" or (choice == "only") == serial:
            kept.append(item)
        else:
            dropped.append(item)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = kept


def pytest_report_header(config: pytest.Config) -> list[str]:
    db = settings.DATABASES["default"]
    where = db.get("HOST") or db.get("NAME")
    return [
        f"attune database: {db['ENGINE'].rsplit('.', 1)[-1]} ({where})",
        f"attune redis: {settings.REDIS_URL}",
        f"attune cache: {settings.CACHES['default']['BACKEND'].rsplit('.', 2)[-2]} "
        f"({settings.CACHES['default'].get('LOCATION') or 'in process'})",
    ]


@pytest.fixture(autouse=True)
def progress_applied_in_sync(settings):
    """In-process tests call no worker, so their syncs apply their own progress (ATTUNE_PROGRESS_APPLY_S
    0): a test reads a sync's effect right after it. The worker's applier, the default with workers, is
    tested in tests/scheduler_app/test_report_applier.py (the `deferred` fixture there) and runs for real
    under the end-to-end and fault tests' Celery beat."""
    settings.ATTUNE_SCHEDULER = {**settings.ATTUNE_SCHEDULER, "progress_apply_s": 0.0}


@pytest.fixture(autouse=True)
def admission_forecast_in_request(settings):
    """In-process tests call no forecasts worker either, so a submission on a short queue (at most 50
    live jobs) forecasts in its request and its answer has the prediction. The shipped default (0:
    every submission's forecast goes to the worker) is the path of the tests that set
    `admission_in_request_max_jobs` 0 (tests/api/test_submission_answer.py,
    tests/cli/test_submit_admission_wait.py ...) and of the end-to-end tests' real worker."""
    settings.ATTUNE_SCHEDULER = {**settings.ATTUNE_SCHEDULER, "admission_in_request_max_jobs": 50}


@pytest.fixture
def user(db):
    from tests.factories import UserFactory

    return UserFactory()


@pytest.fixture
def staff_user(db):
    from tests.factories import UserFactory

    return UserFactory(is_staff=True, is_superuser=True)


@pytest.fixture
def live_redis(settings):
    """A client of the Redis at REDIS_URL, for tests of the services' debounce keys; skips, saying
    why, when none answers there."""
    import redis

    client = redis.Redis.from_url(settings.REDIS_URL, socket_connect_timeout=1)
    try:
        client.ping()
    except redis.RedisError:
        pytest.skip(f"no Redis at {settings.REDIS_URL}")
    return client


@pytest.fixture
def fifo_tune(settings):
    """The live driver with FIFO + tune, rounds asked for but not run inline (tests run them)."""
    settings.ATTUNE_SCHEDULER = {
        **settings.ATTUNE_SCHEDULER,
        "policy": "fifo",
        "allocator": "tune",
        "inline_rounds": False,
    }


@pytest.fixture
def fifo_proportional_minute_rounds(settings):
    """FIFO + proportional, 60 s rounds, rounds not run inline, no QoS rejection: every job runs at
    speed 1 on an idle cluster, so forecast starts and finishes can be checked by hand."""
    settings.ATTUNE_SCHEDULER = {
        **settings.ATTUNE_SCHEDULER,
        "policy": "fifo",
        "allocator": "proportional",
        "inline_rounds": False,
        "round_s": 60,
        "reject_unattainable_qos": False,
    }


@pytest.fixture
def gpu01_res18(db):
    """One 4-GPU server, gpu01 (12 cores, 250 GB: 3 cores and 62.5 GB per GPU), and res18."""
    from tests.api.helpers import make_server, workload

    workload("res18")
    return make_server("gpu01", gpus=4, cpus=12, mem_gb=250)
