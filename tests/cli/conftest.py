"""Fixtures of the command line's tests: a live service with a user, and a way to run commands."""

from __future__ import annotations

import pytest

from tests.api.helpers import make_server, workload
from tests.factories import UserFactory

PASSWORD = "correct horse battery staple"


@pytest.fixture
def service(live_server, tmp_path, monkeypatch):
    """A live API with one 4-GPU server and res18; the CLI's login file in a temporary place."""
    make_server("gpu01", gpus=4, cpus=12, mem_gb=250)
    workload("res18")
    user = UserFactory(username="alice")
    user.set_password(PASSWORD)
    user.save()
    monkeypatch.setenv("ATTUNE_TOKEN_FILE", str(tmp_path / "token"))
    monkeypatch.setenv("ATTUNE_PASSWORD", PASSWORD)
    for name in ("ATTUNE_SERVER", "ATTUNE_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    return live_server.url
