"""The agents' calls through config/agent_calls.py in tests: Django's test client routed as the image's
ASGI application routes them (`AgentCallsFirst`), so that the agent API's tests run unchanged against
both paths (the `agent_path` fixture: "django", then "native")."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any
from unittest import mock

import pytest
from django.core.signals import request_finished, request_started
from django.db import close_old_connections
from django.http import HttpResponse
from django.test.client import ClientHandler

from config.agent_calls import agent_answer, is_agent_call

# How the agents' calls went under the native path since the fixture began: "answered" here,
# "handed back" to Django's handler. Lets a test show that a call was answered by the path it tests.
ROUTED: Counter[str] = Counter()


def _routed(original: Callable[[ClientHandler, dict[str, Any]], HttpResponse]) -> Callable[..., HttpResponse]:
    def call(self: ClientHandler, environ: dict[str, Any]) -> HttpResponse:
        if not is_agent_call(environ):
            return original(self, environ)
        # Django's request signals as ClientHandler sends them: the test's connection is not closed.
        request_started.disconnect(close_old_connections)
        request_started.send(sender=self.__class__, environ=environ)
        request_started.connect(close_old_connections)
        request, response = agent_answer(environ)
        if response is None:
            ROUTED["handed back"] += 1
            return original(self, environ)
        ROUTED["answered"] += 1
        response.wsgi_request = request
        request_finished.disconnect(close_old_connections)
        response.close()
        request_finished.connect(close_old_connections)
        return response

    return call


@pytest.fixture(params=["django", "native"])
def agent_path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """The test's agent calls through Django's handler, or through config/agent_calls.py first."""
    ROUTED.clear()
    if request.param == "native":
        monkeypatch.setattr(ClientHandler, "__call__", _routed(ClientHandler.__call__))
    return request.param


@contextmanager
def routed(path: str) -> Iterator[None]:
    """Within it, the test client's agent calls go `path`'s way ("django" or "native")."""
    if path == "django":
        yield
        return
    with mock.patch.object(ClientHandler, "__call__", _routed(ClientHandler.__call__)):
        yield
