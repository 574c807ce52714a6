"""The service under test for the live benches: gunicorn as the image runs it, a Celery worker with beat
and one of the `forecasts` queue, on a database and Redis of the bench's own."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx

from bench.live_common import logger

REPO_ROOT = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def service_env(database_url: str, redis_url: str, interval_s: float) -> dict[str, str]:
    return {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "config.settings",
        "DATABASE_URL": database_url,
        "REDIS_URL": redis_url,
        "CELERY_BROKER_URL": redis_url,
        "CELERY_RESULT_BACKEND": redis_url,
        "CACHE_URL": redis_url,
        "DEBUG": "0",
        # With DEBUG=0 gunicorn and Celery refuse the repository's public key (config/secret_key.py).
        "SECRET_KEY": os.environ.get("SECRET_KEY") or "attune-bench-only-secret-key-not-for-any-deployment",
        "ATTUNE_INLINE_ROUNDS": "0",
        "ATTUNE_AGENT_WAKE": "1",
        "ATTUNE_AGENT_SYNC_INTERVAL_S": str(interval_s),
        # A fleet this size is never silent for long; keep the defaults' proportions to the interval.
        "ATTUNE_NODE_NOT_RESPONDING_AFTER_S": str(int(interval_s * 6)),
        "ATTUNE_NODE_DOWN_AFTER_S": str(int(interval_s * 24)),
        # The defaults' proportions too (60 + 30 + 10 s at a 10 s interval): the fence expires before DOWN.
        "ATTUNE_LEASE_FENCE_S": str(interval_s * 6 + 1),
        "ATTUNE_LEASE_FENCE_GRACE_S": str(interval_s * 3),
        "ATTUNE_LEASE_FENCE_MARGIN_S": str(interval_s),
        "LOG_LEVEL": "WARNING",
        "PYTHONUNBUFFERED": "1",
    }


def healthz_wait(base_url: str, web: subprocess.Popen, *, failure: str, timeout_s: float = 60.0) -> None:
    """Until the web tier at `base_url` answers `/healthz`; RuntimeError(`failure`) if its process ends
    or `timeout_s` pass first."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            if httpx.get(f"{base_url}/healthz", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        if web.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(failure)
        time.sleep(0.3)


@contextmanager
def processes(env: dict[str, str], *, workers: int | None) -> Iterator[tuple[str, dict[str, int]]]:
    """gunicorn (config/gunicorn.conf.py) on a free port, a Celery worker with beat and one of the
    `forecasts` queue, as docker-compose runs them; yields the URL and their pids by part."""
    port = free_port()
    web_env = {**env, "ATTUNE_BIND": f"127.0.0.1:{port}"}
    if workers:
        web_env["WEB_CONCURRENCY"] = str(workers)
    logs = tempfile.mkdtemp(prefix="attune-bench-fleet-")
    web_log = open(Path(logs) / "web.log", "w")  # noqa: SIM115
    worker_log = open(Path(logs) / "worker.log", "w")  # noqa: SIM115
    forecasts_log = open(Path(logs) / "forecasts-worker.log", "w")  # noqa: SIM115
    web = subprocess.Popen(
        [sys.executable, "-m", "gunicorn", "-c", "config/gunicorn.conf.py", "--log-level", "warning"],
        cwd=REPO_ROOT, env=web_env, stdout=web_log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    worker = subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "config", "worker", "-B", "--pool", "solo",
         "--loglevel", "WARNING", "--without-gossip", "--without-mingle", "-s", f"{logs}/beat"],
        cwd=REPO_ROOT, env=env, stdout=worker_log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    forecasts = subprocess.Popen(
        ["nice", "-n", "10", sys.executable, "-m", "celery", "-A", "config", "worker", "-Q", "forecasts",
         "--pool", "solo", "--loglevel", "WARNING", "--without-gossip", "--without-mingle",
         "-n", "forecasts@%h"],
        cwd=REPO_ROOT, env=env, stdout=forecasts_log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    base_url = f"http://127.0.0.1:{port}"
    try:
        healthz_wait(base_url, web, failure=f"gunicorn did not start; see {logs}/web.log")
        logger.info("web tier at %s (logs in %s)", base_url, logs)
        yield base_url, {"web": web.pid, "rounds": worker.pid, "forecasts": forecasts.pid}
    finally:
        for proc in (forecasts, worker, web):
            proc.terminate()
        for proc in (forecasts, worker, web):
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
        web_log.close()
        worker_log.close()
        forecasts_log.close()
