"""config/wsgi_bridge.py under a real uvicorn: a request's body and answer whole, handed between the
event loop and a thread once; a large body and a streaming answer streamed; a response closed on the
thread that ran its request (Django's database connections are per thread)."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from config import wsgi_bridge
from config.wsgi_bridge import BufferedWSGI
from tests.asgi_server import uvicorn_serving

pytest.importorskip("uvicorn")


class Recorder:
    """A WSGI application that echoes its request and records the threads it ran and was closed on."""

    def __init__(self) -> None:
        self.ran_on: list[int] = []
        self.closed_on: list[int] = []
        self.produced = 0  # chunks of a streaming answer taken from its generator so far

    def __call__(self, environ, start_response):
        self.ran_on.append(threading.get_ident())
        length = int(environ.get("CONTENT_LENGTH") or 0)
        body = environ["wsgi.input"].read(length) if length else environ["wsgi.input"].read()
        path = environ["PATH_INFO"]
        start_response("201 Created", [("Content-Type", "text/plain"), ("X-Path", path)])
        chunks = [b"got ", str(len(body)).encode(), b" bytes: ", body[:16]]
        if path == "/stream":
            chunks = self._parts(50)
        return Answer(chunks, streaming=path == "/stream", on_close=self.closed_on)

    def _parts(self, count: int):
        for i in range(count):
            self.produced += 1
            yield f"part {i};".encode()


class Answer:
    """A response iterable with Django's `streaming` flag and a close() that records its thread."""

    def __init__(self, chunks, *, streaming: bool, on_close: list[int]) -> None:
        self._chunks, self.streaming, self._on_close = chunks, streaming, on_close

    def __iter__(self):
        return iter(self._chunks)

    def close(self) -> None:
        self._on_close.append(threading.get_ident())


def closed_on_its_thread(app: Recorder) -> bool:
    """Whether every response was closed on the thread that ran it. A streamed one is closed after its
    last chunk is sent, so the client may have it a moment before: waited for, up to 5 s."""
    deadline = time.monotonic() + 5
    while len(app.closed_on) < len(app.ran_on) and time.monotonic() < deadline:
        time.sleep(0.01)
    return app.closed_on == app.ran_on


@pytest.fixture
def served(monkeypatch) -> Iterator[tuple[str, Recorder, list[int]]]:
    """The bridge around a Recorder under uvicorn on a free port; (base URL, the app, hand-overs from a
    thread to the loop: one entry per run_coroutine_threadsafe, how many chunks were produced by then)."""
    app = Recorder()
    crossings: list[int] = []
    real = asyncio.run_coroutine_threadsafe

    def counted(coro, loop):
        crossings.append(app.produced)
        return real(coro, loop)

    monkeypatch.setattr(wsgi_bridge.asyncio, "run_coroutine_threadsafe", counted)
    with uvicorn_serving(BufferedWSGI(app, workers=2)) as base_url:
        yield base_url, app, crossings


def test_a_request_is_answered_whole_with_no_hand_over_but_the_threads_result(served):
    base, app, crossings = served
    response = httpx.post(base + "/sync", content=b"x" * 5000, timeout=10)
    assert response.status_code == 201
    assert response.text == "got 5000 bytes: " + "x" * 16
    assert response.headers["x-path"] == "/sync" and response.headers["content-type"] == "text/plain"
    assert crossings == []  # a2wsgi made four or five blocking round trips here
    assert app.closed_on == app.ran_on and app.ran_on[0] != threading.get_ident()


def test_a_get_without_a_body_is_answered(served):
    base, _, _ = served
    response = httpx.get(base + "/page?x=1", timeout=10)
    assert response.status_code == 201 and response.text == "got 0 bytes: "


def test_a_body_declared_over_the_buffered_size_is_streamed_to_the_application(served, monkeypatch):
    base, app, crossings = served
    monkeypatch.setattr(wsgi_bridge, "BUFFERED_BODY_MAX_BYTES", 1024)
    payload = bytes(range(256)) * 64  # 16 KiB
    response = httpx.post(base + "/upload", content=payload, timeout=10)
    assert response.status_code == 201
    assert response.content == b"got 16384 bytes: " + payload[:16]
    assert crossings, "not a2wsgi's streaming path"  # its body reads and sends hand over one by one
    assert closed_on_its_thread(app)


def test_a_body_of_unknown_length_arrives_whole_whichever_path_it_takes(served, monkeypatch):
    base, app, _ = served
    monkeypatch.setattr(wsgi_bridge, "BUFFERED_BODY_MAX_BYTES", 1024)
    payload = bytes(range(256)) * 64

    def pieces():  # chunked: read on the loop until it passes 1 KiB, the rest streamed
        for i in range(0, len(payload), 1000):
            yield payload[i : i + 1000]

    response = httpx.post(base + "/upload", content=pieces(), timeout=10)
    assert response.status_code == 201
    assert response.content == b"got 16384 bytes: " + payload[:16]
    assert closed_on_its_thread(app)


def test_a_streaming_answer_is_sent_in_order_from_its_thread(served):
    base, app, crossings = served
    response = httpx.get(base + "/stream", timeout=10)
    assert response.status_code == 201
    assert response.text == "".join(f"part {i};" for i in range(50))
    assert len(crossings) == 52  # its start, 50 chunks, its end
    assert crossings == [0, *range(1, 51), 50]  # each chunk sent as it is produced, none read ahead
    assert closed_on_its_thread(app)


def test_many_requests_at_once_are_each_answered_with_their_own_body(served):
    base, _, _ = served

    def post(i: int) -> str:
        return httpx.post(f"{base}/r{i}", content=f"{i:08d}".encode(), timeout=20).text

    # Threads, not asyncio.run: in the whole suite an earlier test's library (playwright's sync API)
    # may leave an event loop running on this thread.
    with ThreadPoolExecutor(40) as pool:
        answers = list(pool.map(post, range(40)))
    assert answers == [f"got 8 bytes: {i:08d}" for i in range(40)]
