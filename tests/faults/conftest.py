"""Fixtures for fault tests: private PostgreSQL and Redis for the session, a fresh stack per test.

Nothing here uses pytest-django's test database or the machine's shared PostgreSQL and Redis: the
service under test runs as real processes (gunicorn, a Celery worker with beat, agents) on private
instances that the tests may stop, restart and kill (tests/faults/stack.py and the modules it names).
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from pathlib import Path

import pytest

from tests.e2e.job_runtime import job_runtime as make_job_runtime
from tests.faults.private_services import PrivateServices
from tests.faults.processes import why_cannot_run
from tests.faults.stack import Stack


@pytest.fixture(scope="session")
def faults_root():
    reason = why_cannot_run()
    if reason:
        pytest.skip(reason)
    root = Path(tempfile.mkdtemp(prefix="attune-faults-", dir="/tmp"))
    root.chmod(0o711)  # jobs run as another account and must reach their lease directories
    yield root
    if os.environ.get("ATTUNE_FAULTS_KEEP"):  # logs, spools and databases' logs, to look at afterwards
        print(f"\n[faults] kept {root}")
    else:
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="session")
def private_services(faults_root):
    t0 = time.monotonic()
    services = PrivateServices(faults_root)
    print(
        f"\n[faults] private PostgreSQL on port {services.pg.port}, Redis on port {services.redis.port}; "
        f"template database migrated in {services.template_s:.1f} s ({time.monotonic() - t0:.1f} s in all)"
    )
    yield services
    services.close()


@pytest.fixture(scope="session")
def faults_job_runtime():
    """The Unix account jobs run as (tests/e2e/job_runtime.py): created with useradd, removed after."""
    yield from make_job_runtime()


@pytest.fixture
def stack(private_services, faults_root, faults_job_runtime, request):
    """A fresh database and the whole service as processes, started; everything killed afterwards."""
    root = faults_root / request.node.name.replace("[", "-").replace("]", "")
    root.mkdir()
    root.chmod(0o711)
    # `@pytest.mark.stack_env({...})`: settings of the service's processes for this test.
    marker = request.node.get_closest_marker("stack_env")
    env = marker.args[0] if marker else None
    s = Stack(private_services, root, agent_args=faults_job_runtime.agent_args, env=env)
    t0 = time.monotonic()
    try:
        s.start_all()
        print(f"\n[faults] stack up in {time.monotonic() - t0:.1f} s (database {s.dbname}, web {s.url})")
        yield s
    finally:
        s.stop_all()
        # A test that restarted Redis or PostgreSQL leaves them running for the next one.
        if not private_services.redis.ping():
            private_services.redis.start()
