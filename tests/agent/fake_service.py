"""An in-memory stand-in for the service side of the agent protocol, served over real HTTP in a thread."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class FakeService:
    """Answers register/heartbeat/poll/reports like docs/agent-protocol.md says, and records everything.

    `commands` (or `command_fn(running)`) is what every poll answers, as the real service recomputes its
    answer from its database on each poll. `reports` holds each (lease_id, seq) once (idempotency);
    `report_posts` every report as received, duplicates included. Failure knobs: `down` (503 on every
    endpoint), `reports_down` (503 on /reports only), `register_status` (e.g. 409).
    """

    def __init__(
        self, *, token: str = "test-token", heartbeat_interval_s: float = 0.2, poll_interval_s: float = 0.1
    ) -> None:
        self.token = token
        self.heartbeat_interval_s = heartbeat_interval_s
        self.poll_interval_s = poll_interval_s
        self.lock = threading.Lock()
        self.registrations: list[dict[str, Any]] = []
        self.heartbeats: list[dict[str, Any]] = []
        self.polls: list[list[str]] = []
        self.reports: dict[tuple[str, int], dict[str, Any]] = {}
        self.report_posts: list[dict[str, Any]] = []
        self.commands: list[dict[str, Any]] = []
        self.command_fn: Callable[[list[str]], list[dict[str, Any]]] | None = None
        self.down = False
        self.reports_down = False
        self.register_status = 200
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler_class())
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, args=(0.05,), daemon=True)

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def __enter__(self) -> FakeService:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()

    # -- queries for tests ---------------------------------------------------------------------

    def reports_for(self, lease_id: str, kind: str | None = None) -> list[dict[str, Any]]:
        with self.lock:
            found = [r for (lid, _seq), r in self.reports.items() if lid == lease_id]
        found.sort(key=lambda r: r["seq"])
        return [r for r in found if kind is None or r["kind"] == kind]

    def exited(self, lease_id: str) -> dict[str, Any] | None:
        found = self.reports_for(lease_id, "exited")
        return found[0] if found else None

    # -- HTTP ----------------------------------------------------------------------------------

    def _answer(self, path: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        if self.down:
            return 503, {"detail": "down"}
        if path == "/api/v1/agent/register":
            if self.register_status != 200:
                return self.register_status, {"detail": "refused", "uuids": ["GPU-x"]}
            with self.lock:
                self.registrations.append(body)
            return 200, {
                "server": body["hostname"],
                "heartbeat_interval_s": self.heartbeat_interval_s,
                "poll_interval_s": self.poll_interval_s,
            }
        if path == "/api/v1/agent/heartbeat":
            with self.lock:
                self.heartbeats.append(body)
            return 200, {"state": "MIXED"}
        if path == "/api/v1/agent/poll":
            running = list(body.get("running", []))
            with self.lock:
                self.polls.append(running)
            commands = self.command_fn(running) if self.command_fn else list(self.commands)
            return 200, {"commands": commands}
        if path == "/api/v1/agent/reports":
            if self.reports_down:
                return 503, {"detail": "down"}
            acked, rejected = [], []
            with self.lock:
                for report in body.get("reports", []):
                    self.report_posts.append(report)
                    if not isinstance(report.get("lease_id"), str) or not isinstance(report.get("seq"), int):
                        rejected.append(
                            {
                                "lease_id": report.get("lease_id"),
                                "seq": report.get("seq"),
                                "error": "malformed",
                            }
                        )
                        continue
                    report = {**report, "received_at_s": time.time()}
                    self.reports.setdefault((report["lease_id"], report["seq"]), report)
                    acked.append([report["lease_id"], report["seq"]])
            return 200, {"acked": acked, "rejected": rejected}
        return 404, {"detail": "not found"}

    def _handler_class(self) -> type[BaseHTTPRequestHandler]:
        service = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                if self.headers.get("Authorization") != f"Bearer {service.token}":
                    status, answer = 401, {"detail": "bad token"}
                else:
                    length = int(self.headers.get("Content-Length") or 0)
                    body = json.loads(self.rfile.read(length) or b"{}")
                    status, answer = service._answer(self.path, body)
                data = json.dumps(answer).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, format: str, *args: Any) -> None:  # keep test output quiet
                pass

        return Handler


def wait_for(predicate: Callable[[], Any], timeout_s: float = 10.0, interval_s: float = 0.02) -> Any:
    """Poll `predicate` until it returns something truthy; fail the test after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s}s waiting for {predicate}")
        time.sleep(interval_s)
