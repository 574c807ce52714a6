"""A lean asyncio HTTP/1.1 client for the fleet bench's emulated agents: keep-alive, JSON, h11.

Why not httpx: at a few hundred emulated agents httpx's async stack (anyio, httpcore) took the bench's
whole core (py-spy: 80 % of its samples), so the bench measured its own event loop's lag, not the
service. This client does only what the agent protocol needs (GET with a query, POST of JSON,
Content-Length or chunked answers, connections kept alive and reused) over h11, the HTTP/1.1 state
machine httpx itself uses, at a fraction of the CPU per request.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode, urlsplit

import h11

READ_BYTES = 65536


class LeanHTTPError(Exception):
    """The request failed before a whole answer came back (connection, protocol or timeout)."""


@dataclass
class LeanResponse:
    status_code: int
    content: bytes

    def json(self) -> Any:
        return json.loads(self.content)

    @property
    def text(self) -> str:
        return self.content.decode(errors="replace")


class _Connection:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.h11 = h11.Connection(h11.CLIENT)

    def usable(self) -> bool:
        return not self.reader.at_eof() and not self.writer.is_closing()

    def close(self) -> None:
        self.writer.close()


class LeanClient:
    """`max_connections` keep-alive connections to one base URL, each request on a free one."""

    def __init__(
        self, base_url: str, *, headers: dict[str, str], timeout_s: float, max_connections: int = 2
    ) -> None:
        parts = urlsplit(base_url)
        self._host, self._port = parts.hostname or "127.0.0.1", parts.port or 80
        self._headers = [("host", f"{self._host}:{self._port}"), *headers.items()]
        self._timeout_s = timeout_s
        self._idle: list[_Connection] = []
        self._slots = asyncio.Semaphore(max_connections)

    async def request(
        self, method: str, path: str, *, json: Any = None, params: dict[str, Any] | None = None
    ) -> LeanResponse:
        target = f"{path}?{urlencode(params)}" if params else path
        body = b"" if json is None else _dumps(json)
        headers = list(self._headers)
        if json is not None:
            headers += [("content-type", "application/json"), ("content-length", str(len(body)))]
        async with self._slots:
            while self._idle:
                connection = self._idle.pop()
                if connection.usable():
                    try:
                        return await self._exchange(connection, method, target, headers, body)
                    except LeanHTTPError:
                        # The server may have closed a kept-alive connection as we reused it: once
                        # more on a new one, as httpx does.
                        break
                connection.close()
            try:
                reader, writer = await asyncio.wait_for(
                    asyncio.open_connection(self._host, self._port), self._timeout_s
                )
            except (OSError, TimeoutError) as exc:
                raise LeanHTTPError(f"connect: {exc!r}") from exc
            return await self._exchange(_Connection(reader, writer), method, target, headers, body)

    async def _exchange(
        self, connection: _Connection, method: str, target: str, headers: list, body: bytes
    ) -> LeanResponse:
        try:
            return await asyncio.wait_for(
                self._cycle(connection, method, target, headers, body), self._timeout_s
            )
        except (OSError, TimeoutError, h11.ProtocolError, LeanHTTPError) as exc:
            connection.close()
            raise LeanHTTPError(repr(exc)) from exc

    async def _cycle(
        self, connection: _Connection, method: str, target: str, headers: list, body: bytes
    ) -> LeanResponse:
        conn = connection.h11
        out = conn.send(h11.Request(method=method, target=target, headers=headers))
        if body:
            out += conn.send(h11.Data(data=body))
        out += conn.send(h11.EndOfMessage())
        connection.writer.write(out)
        await connection.writer.drain()
        status, chunks = 0, []
        while True:
            event = conn.next_event()
            if event is h11.NEED_DATA:
                data = await connection.reader.read(READ_BYTES)
                if not data:
                    raise LeanHTTPError("connection closed before the answer ended")
                conn.receive_data(data)
            elif isinstance(event, h11.Response):
                status = event.status_code
            elif isinstance(event, h11.Data):
                chunks.append(bytes(event.data))
            elif isinstance(event, h11.EndOfMessage):
                break
            elif isinstance(event, h11.ConnectionClosed):
                raise LeanHTTPError("connection closed")
        if conn.our_state is h11.DONE and conn.their_state is h11.DONE:
            conn.start_next_cycle()
            self._idle.append(connection)
        else:
            connection.close()
        return LeanResponse(status, b"".join(chunks))

    async def aclose(self) -> None:
        for connection in self._idle:
            connection.close()
        self._idle.clear()


def _dumps(value: Any) -> bytes:
    return json.dumps(value, separators=(",", ":")).encode()
