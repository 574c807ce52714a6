"""A WSGI environ from an ASGI scope, and a request body read from ASGI as WSGI reads it.

Adapted from a2wsgi 1.10.10 (a2wsgi/wsgi.py: `build_environ`, `Body`, `unicode_to_wsgi`), Copyright (c)
abersheeran, licensed under the Apache License, Version 2.0 (http://www.apache.org/licenses/LICENSE-2.0).
Owned here because a2wsgi exports neither (its `__all__` is WSGIMiddleware and ASGIMiddleware): a minor
release may move them. Changes: type hints, names, comments. tests/config/test_wsgi_environ.py compares
these with a2wsgi's own while a2wsgi is installed (bench/a2wsgi_asgi.py still uses its public API).
"""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import Awaitable, Callable, Iterator
from typing import Any, BinaryIO

_FS_ENCODING, _ESCAPE = sys.getfilesystemencoding(), "surrogateescape"


def unicode_to_wsgi(text: str) -> str:
    """An environment variable as a WSGI "bytes-as-unicode" string (PEP 3333)."""
    return text.encode(_FS_ENCODING, _ESCAPE).decode("iso-8859-1")


def build_environ(scope: dict[str, Any], body: BinaryIO | StreamedBody) -> dict[str, Any]:
    """The WSGI environ of an ASGI HTTP `scope`, with `body` as its `wsgi.input`."""
    script_name = scope.get("root_path", "").encode("utf8").decode("latin1")
    path_info = scope["path"].encode("utf8").decode("latin1")
    if path_info.startswith(script_name):
        path_info = path_info[len(script_name) :]
    script_name_override = os.environ.get("SCRIPT_NAME", "")
    if script_name_override:
        script_name = unicode_to_wsgi(script_name_override)
    environ: dict[str, Any] = {
        "asgi.scope": scope,
        "REQUEST_METHOD": scope["method"],
        "SCRIPT_NAME": script_name,
        "PATH_INFO": path_info,
        "QUERY_STRING": scope["query_string"].decode("ascii"),
        "SERVER_PROTOCOL": f"HTTP/{scope['http_version']}",
        "wsgi.version": (1, 0),
        "wsgi.url_scheme": scope.get("scheme", "http"),
        "wsgi.input": body,
        "wsgi.errors": sys.stdout,
        "wsgi.multithread": True,
        "wsgi.multiprocess": True,
        "wsgi.run_once": False,
    }
    # Server name and port: required by WSGI, optional in ASGI.
    server_addr, server_port = scope.get("server") or ("localhost", 80)
    environ["SERVER_NAME"] = server_addr
    environ["SERVER_PORT"] = str(server_port or 0)
    client = scope.get("client")
    if client is not None:
        environ["REMOTE_ADDR"], environ["REMOTE_PORT"] = client[0], str(client[1])
    for raw_name, raw_value in scope.get("headers", []):
        name = raw_name.decode("latin1")
        if name == "content-length":
            key = "CONTENT_LENGTH"
        elif name == "content-type":
            key = "CONTENT_TYPE"
        else:
            key = f"HTTP_{name}".upper().replace("-", "_")
        value = raw_value.decode("latin1")  # HTTP allows ASCII only; latin1 to be safe, as a2wsgi does
        if key in environ:
            value = environ[key] + "," + value  # a repeated header: its values joined
        environ[key] = value
    return environ


class StreamedBody:
    """A request body read from ASGI `receive` as the application asks for it, on the application's
    thread: each read that needs more hands a `receive()` to the event loop and waits for it."""

    def __init__(self, loop: asyncio.AbstractEventLoop, receive: Callable[[], Awaitable[dict]]) -> None:
        self.buffer = bytearray()
        self.loop = loop
        self.receive = receive
        self._more = True  # whether the client has more to send

    @property
    def has_more(self) -> bool:
        return self._more or bool(self.buffer)

    def _receive_more(self) -> bytes:
        if not self._more:
            return b""
        message = asyncio.run_coroutine_threadsafe(self.receive(), loop=self.loop).result()
        self._more = message.get("more_body", False)
        return message.get("body", b"")

    def read(self, size: int = -1) -> bytes:
        while size == -1 or size > len(self.buffer):
            self.buffer.extend(self._receive_more())
            if not self._more:
                break
        if size == -1:
            result = bytes(self.buffer)
            self.buffer.clear()
        else:
            result = bytes(self.buffer[:size])
            del self.buffer[:size]
        return result

    def readline(self, limit: int = -1) -> bytes:
        while True:
            end = self.buffer.find(b"\n", 0, limit if limit > -1 else None)
            if end != -1:
                result = bytes(self.buffer[: end + 1])
                del self.buffer[: end + 1]
                return result
            if limit != -1:
                result = bytes(self.buffer[:limit])
                del self.buffer[:limit]
                return result
            if not self._more:
                break
            self.buffer.extend(self._receive_more())
        result = bytes(self.buffer)
        self.buffer.clear()
        return result

    def readlines(self, hint: int = -1) -> list[bytes]:
        if not self.has_more:
            return []
        if hint == -1:
            data = self.read(-1)
            lines = data.split(b"\n")
            if data[-1:] == b"\n":
                lines.pop()
            return [line + b"\n" for line in lines]
        return [self.readline() for _ in range(hint)]

    def __iter__(self) -> Iterator[bytes]:
        while self.has_more:
            yield self.readline()
