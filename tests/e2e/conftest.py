"""Fixtures for end-to-end tests: PostgreSQL + Redis only, a live API server, a worker, agents."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import pytest
import redis
from django.conf import settings
from django.db import connection

from tests.e2e.job_runtime import job_runtime as make_job_runtime
from tests.e2e.processes import Agent, CeleryWorker

# The worker runs beat with short periods so that a test sees rounds, sweeps and node failure quickly.
# Agents sync every second and are not woken (see live_settings): the worker's rounds need not bump
# wake generations that no one waits on.
WORKER_ENV = {
    "ATTUNE_ROUND_S": "3",
    "ATTUNE_EARLY_ROUND_DELAY_S": "0.5",
    "ATTUNE_LIVENESS_SWEEP_S": "1",
    "ATTUNE_AGENT_SYNC_INTERVAL_S": "1",
    "ATTUNE_AGENT_WAKE": "0",
    "ATTUNE_NODE_NOT_RESPONDING_AFTER_S": "4",
    "ATTUNE_NODE_DOWN_AFTER_S": "8",
    # The fence expires (5 + 2 + 1 s after a node's last sync) just as it goes DOWN (docs/faults.md).
    "ATTUNE_LEASE_FENCE_S": "5",
    "ATTUNE_LEASE_FENCE_GRACE_S": "2",
    "ATTUNE_LEASE_FENCE_MARGIN_S": "1",
    "ATTUNE_PREEMPT_GRACE_S": "3",
}


def _redis_available() -> bool:
    try:
        return bool(redis.Redis.from_url(settings.REDIS_URL, socket_timeout=1).ping())
    except redis.RedisError:
        return False


@pytest.fixture
def e2e_ready(transactional_db):
    if connection.vendor != "postgresql":
        pytest.skip("end-to-end tests run on PostgreSQL (set DATABASE_URL), not the embedded SQLite")
    if not _redis_available():
        pytest.skip(f"Redis is not reachable at {settings.REDIS_URL}")
    # A clean broker: no stale tasks from an earlier run reach this worker.
    redis.Redis.from_url(settings.CELERY_BROKER_URL).flushdb()


@pytest.fixture
def live_settings(settings):
    """What the in-process API server tells agents and how it triggers rounds (same as the worker).

    pytest-django's live server is Django's WSGI application alone: the agents' long-poll (served by
    config/asgi.py beside Django) is not there, so no sync offers it and agents sync every second.
    The long-poll itself runs under a real ASGI server in tests/cluster_app/test_agent_wake.py.
    """
    settings.ATTUNE_AGENT_SYNC_INTERVAL_S = 1
    settings.ATTUNE_AGENT_WAKE = False
    # The web tier (this process) answers the agents' syncs with the fence and gates starts on it.
    settings.ATTUNE_LEASE_FENCE_S = float(WORKER_ENV["ATTUNE_LEASE_FENCE_S"])
    settings.ATTUNE_LEASE_FENCE_GRACE_S = float(WORKER_ENV["ATTUNE_LEASE_FENCE_GRACE_S"])
    settings.ATTUNE_LEASE_FENCE_MARGIN_S = float(WORKER_ENV["ATTUNE_LEASE_FENCE_MARGIN_S"])
    settings.ATTUNE_SCHEDULER = {
        **settings.ATTUNE_SCHEDULER,
        "inline_rounds": False,
        "early_round_delay_s": 0.5,
        "preempt_grace_s": 3,
        "round_s": 3,
    }
    return settings


@pytest.fixture
def worker(e2e_ready, live_settings, tmp_path):
    w = CeleryWorker(tmp_path, **WORKER_ENV)
    yield w
    w.stop()


@pytest.fixture(scope="session")
def job_runtime():
    """The Unix account e2e jobs run as, and the agents' options for it (tests/e2e/job_runtime.py)."""
    yield from make_job_runtime()


@pytest.fixture
def start_agents(worker, live_server, tmp_path, job_runtime):
    """Start N fake-GPU agents against the live server; all are stopped (jobs included) at the end."""
    agents: list[Agent] = []
    work_root = Path(tempfile.mkdtemp(prefix="attune-e2e-agents-", dir="/tmp"))
    work_root.chmod(0o711)

    def start(n: int, *, gpus: int = 4, cpus: int = 12, mem_gb: float = 250.0, time_scale: float = 0.02):
        for i in range(n):
            agents.append(
                Agent(
                    tmp_path,
                    live_server.url,
                    f"node{i + 1}",
                    gpus=gpus,
                    cpus=cpus,
                    mem_gb=mem_gb,
                    time_scale=time_scale,
                    extra_args=tuple(job_runtime.agent_args),
                    work_root=work_root,
                )
            )
        return agents

    yield start
    for agent in agents:
        agent.stop()
    shutil.rmtree(work_root, ignore_errors=True)
