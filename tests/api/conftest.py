"""Fixtures of the agent API tests: gpu01 (4 GPUs, 12 cores, 250 GB) and a client with its token."""

import pytest

from scheduler_app.models import JobState
from scheduler_app.services.rounds import scheduling_round_run
from tests.api.helpers import agent_client, make_server, submit


@pytest.fixture
def server():
    return make_server("gpu01", gpus=4, cpus=12, mem_gb=250)


@pytest.fixture
def agent(server):
    return agent_client(server)


@pytest.fixture
def running(user, server, fifo_tune):
    """A res18 job of 1000 iterations on 2 GPUs of gpu01, placed by a real round."""
    job = submit(user, gpus=2, iters=1000, name="res18-a")
    scheduling_round_run()
    job.refresh_from_db()
    assert job.state == JobState.RUNNING
    return job
