"""Fixtures of the agent API tests: gpu01 (4 GPUs, 12 cores, 250 GB) and a client with its token."""

import pytest

from tests.api.helpers import agent_client, make_server


@pytest.fixture
def server():
    return make_server("gpu01", gpus=4, cpus=12, mem_gb=250)


@pytest.fixture
def agent(server):
    return agent_client(server)
