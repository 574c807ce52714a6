"""Fixtures for agent tests: a fake service over HTTP, agents on temp dirs, start-command builders."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from agent.agent import Agent, AgentConfig
from agent.gpus import FakeGpuBackend
from agent.host import HostInventory, StaticHostBackend
from agent.launcher import ISOLATION_AFFINITY, ProcessLauncher
from tests.agent.fake_service import FakeService

# Synthetic jobs run 100x faster than real time: res18 at 3 cores/GPU takes 6.4 ms per iteration.
TIME_SCALE = 0.01


@pytest.fixture
def service() -> Iterator[FakeService]:
    with FakeService() as svc:
        yield svc


@pytest.fixture
def make_agent(tmp_path: Path, service: FakeService) -> Iterator[Callable[..., Agent]]:
    """Build agents on the same spool/work dirs (a second one is the "restarted" agent)."""
    agents: list[Agent] = []

    def build(*, fake_gpus: int = 2, stop_leases_on_exit: bool = True, **overrides: Any) -> Agent:
        config = AgentConfig(
            server_url=service.url,
            token=service.token,
            name="node-a",
            spool_dir=tmp_path / "spool",
            work_dir=tmp_path / "work",
            time_scale=TIME_SCALE,
            isolation=ISOLATION_AFFINITY,
            progress_interval_s=0.1,
            log_interval_s=0.1,
            tick_s=0.05,
            max_backoff_s=0.3,
            http_timeout_s=2.0,
            stop_leases_on_exit=stop_leases_on_exit,
            exit_grace_s=0.0,
            # Catalog workloads keep the test's identity: this interpreter may sit where no other account
            # can read it (/root). tests/agent/test_identity.py covers running jobs as other accounts.
            job_user=None,
        )
        for key, value in overrides.items():
            setattr(config, key, value)
        agent = Agent(
            config,
            gpu_backend=FakeGpuBackend(fake_gpus, "node-a"),
            host_backend=StaticHostBackend(HostInventory(num_cpus=24, mem_gb=500.0)),
            launcher=ProcessLauncher(isolation=ISOLATION_AFFINITY),
        )
        agents.append(agent)
        return agent

    yield build
    for agent in agents:  # no job outlives its test (shutdown is a no-op for agents already shut down)
        agent.config.stop_leases_on_exit = True
        agent.shutdown(timeout_s=2.0)


def start_cmd(
    lease_id: str,
    *,
    gpu_uuids: list[str],
    job_id: int = 1,
    num_cpus: int = 3,
    mem_gb: float = 62.5,
    iters: int = 60,
    resume_iters: int = 0,
    argv: list[str] | None = None,
    env: dict[str, str] | None = None,
) -> dict[str, Any]:
    """A `start` command as the service sends it (the synthetic workload unless `argv` is given)."""
    return {
        "kind": "start",
        "lease_id": lease_id,
        "job_id": job_id,
        "job_name": f"job-{job_id}",
        "argv": argv
        or [
            "python",
            "-m",
            "agent.workload",
            "--model",
            "res18",
            "--iters",
            str(iters),
            "--log-every",
            "20",
            "--progress-every-s",
            "0.05",
        ],
        "env": env or {},
        "gpu_uuids": gpu_uuids,
        "num_cpus": num_cpus,
        "mem_gb": mem_gb,
        "resume_iters": resume_iters,
    }


def python_job(code: str) -> list[str]:
    """argv running a snippet with this interpreter (jobs that misbehave on purpose)."""
    return [sys.executable, "-c", code]
