"""config/wsgi_environ.py, adapted from a2wsgi, against a2wsgi's own: the same environ, the same reads.

This fails when a2wsgi moves or changes `build_environ` or `Body` (not in its public API): then read its
change and decide whether the copy follows it.
"""

from __future__ import annotations

import asyncio
import threading

import pytest
from a2wsgi import wsgi as a2wsgi_wsgi

from config.wsgi_environ import StreamedBody, build_environ

SCOPES = [
    {
        "type": "http",
        "method": "POST",
        "path": "/api/v1/agent/sync",
        "root_path": "",
        "query_string": b"a=1&b=%C3%A9",
        "http_version": "1.1",
        "scheme": "https",
        "server": ("attune.example", 443),
        "client": ("10.0.0.7", 51234),
        "headers": [
            (b"content-type", b"application/json"),
            (b"content-length", b"12"),
            (b"x-forwarded-for", b"10.0.0.1"),
            (b"x-forwarded-for", b"10.0.0.2"),  # repeated: joined with a comma
            (b"authorization", b"Bearer att_x"),
        ],
    },
    {  # no server, no client, a root path and a non-ASCII path
        "type": "http",
        "method": "GET",
        "path": "/attune/jobs/caf\u00e9",
        "root_path": "/attune",
        "query_string": b"",
        "http_version": "2",
        "headers": [],
    },
]


@pytest.mark.parametrize("scope", SCOPES)
def test_the_environ_is_a2wsgis(scope, monkeypatch):
    monkeypatch.delenv("SCRIPT_NAME", raising=False)
    body = object()
    assert build_environ(scope, body) == a2wsgi_wsgi.build_environ(scope, body)


def test_a_script_name_from_the_environment_is_a2wsgis(monkeypatch):
    monkeypatch.setenv("SCRIPT_NAME", "/mounted")
    ours = build_environ(SCOPES[1], None)
    assert ours == a2wsgi_wsgi.build_environ(SCOPES[1], None)
    assert ours["SCRIPT_NAME"] == "/mounted"


def _reads(body_class, messages: list[dict], calls: list[tuple]) -> list:
    """What `calls` (method, argument) return on a body fed `messages`, read off the loop's thread as
    WSGI does. The loop runs on a thread of its own: the test's thread may already have a running loop
    (playwright's sync API leaves one behind), where run_forever would refuse to start."""
    loop = asyncio.new_event_loop()
    pending = list(messages)

    async def receive() -> dict:
        return pending.pop(0)

    loop_thread = threading.Thread(target=loop.run_forever, daemon=True)
    loop_thread.start()
    results: list = []
    try:
        body = body_class(loop, receive)
        for method, argument in calls:
            results.append(getattr(body, method)(*argument))
        results.append(body.has_more)
    finally:
        loop.call_soon_threadsafe(loop.stop)
        loop_thread.join(5)
        loop.close()
    return results


MESSAGES = [
    {"type": "http.request", "body": b"first line\nsec", "more_body": True},
    {"type": "http.request", "body": b"ond line\n", "more_body": True},
    {"type": "http.request", "body": b"tail without newline", "more_body": False},
]


@pytest.mark.parametrize(
    "calls",
    [
        [("read", ())],
        [("read", (4,)), ("read", (100,)), ("read", (5,))],
        [("readline", ()), ("readline", ()), ("readline", ()), ("readline", ())],
        [("readline", (5,)), ("readline", ()), ("read", (3,))],
        [("readlines", ())],
    ],
)
def test_the_body_reads_as_a2wsgis(calls):
    assert _reads(StreamedBody, MESSAGES, calls) == _reads(a2wsgi_wsgi.Body, MESSAGES, calls)
