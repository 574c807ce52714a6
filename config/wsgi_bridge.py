"""Django's WSGI application served from ASGI on a pool of threads, one hand-over per request.

a2wsgi, which this replaces for the common case, hands every message between the event loop and the
request's thread with a blocking round trip: the body's read, the response's start, each chunk and
the end, four or five a request, each waking the loop and the thread and passing the GIL between
them (15 % of the web tier's GIL samples under the agent fleet, 2026-11-27). Here a request's body is
read on the loop, Django runs on a thread and its whole answer comes back with the thread's result,
then the loop sends it. Two kinds still stream: a request body larger than `BUFFERED_BODY_MAX_BYTES`,
read as Django asks for it (config/wsgi_environ.py's StreamedBody, adapted from a2wsgi), and a
streaming response (a file, a generator), sent chunk by chunk from its thread as it is produced.

Everything runs on the threads of one pool, which live as long as the process and keep Django's
persistent database connections; a response is closed (Django's `request_finished`, which returns
that thread's connection or keeps it) on the thread that ran its request.
"""

from __future__ import annotations

import asyncio
import contextvars
import io
import itertools
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from config.wsgi_environ import StreamedBody, build_environ

# A request body up to this size is read whole before Django sees it; the agents' syncs, the forms and
# the API's requests are a few kilobytes. Larger ones are read as Django asks for them.
BUFFERED_BODY_MAX_BYTES = 1024 * 1024

WSGIApp = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]
Message = dict[str, Any]


class _Answer:
    """A response built on a request's thread: its status, headers and body; `streamed` where it was a
    streaming one, already sent from that thread."""

    def __init__(self) -> None:
        self.status = 500
        self.headers: list[tuple[bytes, bytes]] = []
        self.written: list[bytes] = []  # PEP 3333's legacy write(), which Django never calls
        self.body = b""
        self.streamed = False

    def start_response(self, status: str, headers: list[tuple[str, str]], exc_info: Any = None) -> Callable:
        if exc_info is not None and self.streamed:
            raise exc_info[1].with_traceback(exc_info[2])  # headers already sent: PEP 3333's rule
        self.status = int(status.split(" ", 1)[0])
        self.headers = [(n.strip().encode("latin1").lower(), v.strip().encode("latin1")) for n, v in headers]
        return self.written.append


def _declared_length(scope: dict[str, Any]) -> int:
    """The request's Content-Length, 0 where it has none (or one that is not a number)."""
    for name, value in scope.get("headers", ()):
        if name == b"content-length":
            return int(value) if value.isdigit() else 0
    return 0


class BufferedWSGI:
    """An ASGI application that runs a WSGI application (Django's) on `workers` threads."""

    def __init__(self, app: WSGIApp, *, workers: int) -> None:
        self._app = app
        self._executor = ThreadPoolExecutor(thread_name_prefix="WSGI", max_workers=workers)

    async def __call__(self, scope: dict[str, Any], receive: Callable, send: Callable) -> None:
        if scope["type"] == "websocket":  # WSGI has none: closed at once, as a2wsgi does
            await send({"type": "websocket.close", "code": 1000})
            return
        if _declared_length(scope) > BUFFERED_BODY_MAX_BYTES:
            await self._streamed(scope, receive, send, read=b"")
            return
        parts: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return  # the client went away before its request was whole: nothing to answer
            parts.append(message.get("body", b""))
            size += len(parts[-1])
            if not message.get("more_body", False):
                break
            if size > BUFFERED_BODY_MAX_BYTES:
                await self._streamed(scope, receive, send, read=b"".join(parts))
                return
        await self._answer(build_environ(scope, io.BytesIO(b"".join(parts))), send)

    async def _answer(self, environ: dict[str, Any], send: Callable) -> None:
        """Run the application on a pool's thread and send its answer (a streaming one is sent from there)."""
        loop = asyncio.get_running_loop()
        run = contextvars.copy_context().run
        answer = await loop.run_in_executor(self._executor, run, self._respond, environ, loop, send)
        if answer.streamed:
            return
        await send({"type": "http.response.start", "status": answer.status, "headers": answer.headers})
        await send({"type": "http.response.body", "body": b"".join([*answer.written, answer.body])})

    def _respond(self, environ: dict[str, Any], loop: asyncio.AbstractEventLoop, send: Callable) -> _Answer:
        """On a pool's thread: run the application and read its answer, or send it if it streams."""
        answer = _Answer()
        iterable = self._app(environ, answer.start_response)
        try:
            if getattr(iterable, "streaming", False):  # Django's StreamingHttpResponse, FileResponse
                answer.streamed = True
                self._send_streaming(answer, iterable, loop, send)
            else:
                answer.body = b"".join(iterable)
        finally:
            close = getattr(iterable, "close", None)
            if close is not None:
                close()
        return answer

    @staticmethod
    def _send_streaming(
        answer: _Answer, chunks: Iterable[bytes], loop: asyncio.AbstractEventLoop, send: Callable
    ) -> None:
        def send_now(message: Message) -> None:
            asyncio.run_coroutine_threadsafe(send(message), loop).result()

        send_now({"type": "http.response.start", "status": answer.status, "headers": answer.headers})
        for chunk in itertools.chain(answer.written, chunks):  # as produced: a generator is not read ahead
            if chunk:
                send_now({"type": "http.response.body", "body": chunk, "more_body": True})
        send_now({"type": "http.response.body", "body": b""})

    async def _streamed(
        self, scope: dict[str, Any], receive: Callable, send: Callable, *, read: bytes
    ) -> None:
        """A large request body, read as the application asks for it (each read a hand-over to the loop):
        what was read already comes first."""
        replay: list[Message] = [{"type": "http.request", "body": read, "more_body": True}] if read else []

        async def replaying() -> Message:
            return replay.pop() if replay else await receive()

        body = StreamedBody(asyncio.get_running_loop(), replaying)
        await self._answer(build_environ(scope, body), send)
