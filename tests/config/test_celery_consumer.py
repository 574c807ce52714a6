"""config/celery_consumer.py: a Celery worker that holds an unacked message (an ETA task) lives through
Redis outages and retries the broker every few seconds, on a private redis-server; Celery's own consumer
exits there (the cause, kept in view)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from config.celery import app as attune_app
from tests.faults.private_services import PrivateRedis
from tests.faults.processes import REPO_ROOT, kill_group, wait_until

pytestmark = pytest.mark.skipif(shutil.which("redis-server") is None, reason="no redis-server on PATH")

OUR_CONSUMER = "config.celery_consumer:Consumer"
CRASH = "Unrecoverable error"
# A bare Celery app as the service's workers are configured where it matters here (acks_late, one
# message prefetched, Redis as broker and result backend); the consumer class comes from the command line.
APP = """
import os, sys
if os.environ["CONSUMER"] != "celery":
    import config.celery_consumer  # imported before the app below, which stays the current one
from celery import Celery

app = Celery("outages", broker=os.environ["BROKER"], backend=os.environ["BROKER"])
app.conf.task_acks_late = True
app.conf.worker_prefetch_multiplier = 1
if os.environ["CONSUMER"] != "celery":
    app.conf.worker_consumer = os.environ["CONSUMER"]


@app.task
def noop():
    return 1
"""


@pytest.fixture
def private_redis(tmp_path: Path) -> Iterator[PrivateRedis]:
    server = PrivateRedis(tmp_path)
    yield server
    server.stop()


def _outages_survived(
    tmp_path: Path, server: PrivateRedis, *, consumer: str, outages: int
) -> tuple[int, str]:
    """Start a worker of the bare app, give it an ETA task to hold, and stop Redis (2 s) `outages`
    times; returns (outages it lived through, its log). Alive after the last one, it must also run a
    task sent after it."""
    (tmp_path / "outages_app.py").write_text(APP)
    env = {
        "PATH": "/usr/bin:/bin",
        "PYTHONPATH": f"{tmp_path}:{REPO_ROOT}",
        "BROKER": server.url(0),
        "CONSUMER": consumer,
        "DJANGO_SETTINGS_MODULE": "config.settings",
        # The suite's key (tests/conftest.py): a worker refuses the public default with DEBUG=0.
        "SECRET_KEY": os.environ["SECRET_KEY"],
    }
    log_path = tmp_path / "worker.log"
    argv = [sys.executable, "-m", "celery", "-A", "outages_app", "worker", "--pool", "solo", "-l", "INFO"]
    argv += ["--without-gossip", "--without-mingle", "--without-heartbeat"]
    with log_path.open("w") as log:
        worker = subprocess.Popen(
            argv, cwd=tmp_path, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
    send = [sys.executable, "-c", "import outages_app; outages_app.noop.apply_async(countdown=600)"]
    survived = 0
    try:
        wait_until(lambda: "ready." in log_path.read_text(), timeout_s=30, what="the worker to be ready")
        for _ in range(outages):
            received = log_path.read_text().count("] received")
            # Sent once the worker is connected again (it retries after 1, 2 ... s), and held by it.
            wait_until(
                lambda n=survived: log_path.read_text().count("Connected to redis://") > n,
                timeout_s=30,
                what="the worker to be connected",
            )
            subprocess.run(send, cwd=tmp_path, env=env, check=True, timeout=30)
            wait_until(
                lambda n=received: log_path.read_text().count("] received") > n,
                timeout_s=10,
                what="the worker to hold the ETA task",
            )
            server.stop()
            time.sleep(2.0)
            server.start()
            # The consumer notices at once; a worker that exits does so within moments.
            time.sleep(1.0)
            if worker.poll() is not None:
                break
            survived += 1
        if survived == outages:
            run = [
                sys.executable,
                "-c",
                "import outages_app; print(outages_app.noop.delay().get(timeout=30))",
            ]
            assert (
                subprocess.run(run, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60).stdout
                == "1\n"
            )
    finally:
        kill_group(worker, signal.SIGTERM)
    return survived, log_path.read_text(errors="replace")


def test_the_services_celery_app_uses_this_consumer_and_retries_the_broker_for_ever():
    assert attune_app.conf.worker_consumer == OUR_CONSUMER
    assert attune_app.conf.broker_connection_max_retries is None


def test_a_worker_holding_an_eta_task_lives_through_redis_outages(tmp_path, private_redis):
    survived, log = _outages_survived(tmp_path, private_redis, consumer=OUR_CONSUMER, outages=2)
    assert survived == 2 and CRASH not in log, log[-4000:]
    # and it retried the broker 1 s after losing it, not Celery's 2 s growing to 30 s
    assert "Trying again in 1.00 second" in log, log[-4000:]


def test_celerys_own_consumer_exits_there(tmp_path, private_redis):
    """The cause, kept in view: with Celery's consumer the same worker exits at the first outage. Should
    a Celery release stop doing so, this says that config/celery_consumer.py may go."""
    survived, log = _outages_survived(tmp_path, private_redis, consumer="celery", outages=1)
    if survived:
        pytest.xfail("Celery's own consumer survived: config/celery_consumer.py may no longer be needed")
    assert CRASH in log and "'NoneType' object has no attribute 'hostname'" in log, log[-4000:]
