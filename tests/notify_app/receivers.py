"""Local receivers for notification tests: an SMTP sink (aiosmtpd) and an HTTP webhook receiver."""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Iterable
from dataclasses import dataclass, field
from email import message_from_bytes
from email.message import Message
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from aiosmtpd.controller import Controller


def free_port() -> int:
    """A TCP port nobody listens on right now (connecting to it is refused until a receiver binds it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class SmtpSink:
    """An SMTP server on 127.0.0.1 that keeps every message it accepts; `refuse_next` answers the next
    N messages with a 451 (temporary failure) instead."""

    def __init__(self, port: int | None = None) -> None:
        self.port = port or free_port()
        self.messages: list[Message] = []
        self.refused = 0
        self.refuse_next = 0
        self._lock = threading.Lock()
        self._controller = Controller(self, hostname="127.0.0.1", port=self.port)

    async def handle_DATA(self, server, session, envelope) -> str:  # aiosmtpd's handler hook
        with self._lock:
            if self.refuse_next > 0:
                self.refuse_next -= 1
                self.refused += 1
                return "451 4.3.0 try again later"
            message = message_from_bytes(envelope.content)
            message["X-Envelope-To"] = ", ".join(envelope.rcpt_tos)
            self.messages.append(message)
        return "250 OK"

    def start(self) -> SmtpSink:
        self._controller.start()
        return self

    def stop(self) -> None:
        self._controller.stop()


@dataclass
class Received:
    path: str
    headers: dict[str, str]
    body: dict[str, Any]
    status: int


@dataclass
class HttpReceiver:
    """A webhook receiver on 127.0.0.1: answers each POST with the next status of `statuses` (then
    200) and keeps every request, including the ones it refused."""

    port: int = field(default_factory=free_port)
    statuses: list[int] = field(default_factory=list)
    requests: list[Received] = field(default_factory=list)

    def __post_init__(self) -> None:
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length)
                status = receiver.statuses.pop(0) if receiver.statuses else 200
                receiver.requests.append(
                    Received(self.path, dict(self.headers), json.loads(raw or b"{}"), status)
                )
                self.send_response(status)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"ok")

            def log_message(self, *args: Any) -> None:  # keep test output quiet
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/hook/secret-token"

    @property
    def delivered(self) -> list[Received]:
        """The requests it accepted (2xx)."""
        return [r for r in self.requests if 200 <= r.status < 300]

    def start(self) -> HttpReceiver:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()


def email_settings(settings, port: int) -> None:
    """Point Django's mail at an SMTP server on 127.0.0.1:`port` (a pytest-django `settings`)."""
    settings.EMAIL_BACKEND = "django.core.mail.backends.smtp.EmailBackend"
    settings.EMAIL_HOST = "127.0.0.1"
    settings.EMAIL_PORT = port
    settings.EMAIL_USE_TLS = settings.EMAIL_USE_SSL = False
    settings.EMAIL_HOST_USER = settings.EMAIL_HOST_PASSWORD = ""
    settings.EMAIL_TIMEOUT = 5


def subjects(messages: Iterable[Message]) -> list[str]:
    return [str(m["Subject"]) for m in messages]
