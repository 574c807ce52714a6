"""An in-memory stand-in for the service side of the agent protocol, served over real HTTP in a thread."""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

WAIT_PATH = "/api/v1/agent/wait"


class FakeService:
    """Answers register, sync and wait like docs/agent-protocol.md says, and records everything.

    `commands` (or `command_fn(running)`) is what every sync answers, as the real service recomputes its
    answer from its database on each sync. `reports` holds each (lease_id, seq) once (idempotency);
    `report_posts` every report as received, duplicates included; `syncs` every sync call (its sample,
    running list and report keys, and when it arrived). Each sync acks every well-formed report it
    carries and rejects the others.

    The long-poll: with `offer_wait`, each sync answer offers a `wait` on GET WAIT_PATH, which is held
    until `wake()` moves the generation past the one the agent saw, or until its timeout. The server is
    threaded, so a held wait never delays a sync.

    Failure knobs: `down` (503 on every endpoint), `sync_status` (e.g. 503 or 401: the whole sync is
    refused and nothing it carried is recorded), `ack` (False: the reports are committed but the answer
    acks none, as when the answer is lost), `wait_status` (e.g. 503 on GET WAIT_PATH), `register_status`
    (e.g. 409).
    """

    def __init__(
        self,
        *,
        token: str = "test-token",
        sync_interval_s: float = 0.1,
        offer_wait: bool = False,
        wait_timeout_s: float = 30.0,
    ) -> None:
        self.token = token
        self.sync_interval_s = sync_interval_s
        self.offer_wait = offer_wait
        self.wait_timeout_s = wait_timeout_s
        self.lock = threading.Lock()
        self._changed = threading.Condition(self.lock)  # a wake, or the service closing
        self.registrations: list[dict[str, Any]] = []
        self.syncs: list[dict[str, Any]] = []
        self.reports: dict[tuple[str, int], dict[str, Any]] = {}
        self.report_posts: list[dict[str, Any]] = []
        self.acked: set[tuple[str, int]] = set()
        self.waits: list[dict[str, Any]] = []  # every wait call: its query, and its answer once given
        self.waiting = 0  # waits held right now
        self.generation = 0
        self.commands: list[dict[str, Any]] = []
        self.command_fn: Callable[[list[str]], list[dict[str, Any]]] | None = None
        self.down = False
        self.sync_status = 200
        self.sync_body: dict[str, Any] = {"detail": "refused"}  # the body of a refused sync
        self.ack = True
        self.wait_status = 200
        self.register_status = 200
        self.fence: dict[str, float] | None = None  # the answers' `fence` (None: left out, as an old service)
        self._tickets: set[str] = set()
        self._closing = False
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler_class())
        self._server.daemon_threads = True
        self._server.block_on_close = False  # a wait still held at exit must not hold up the test
        self._thread = threading.Thread(target=self._server.serve_forever, args=(0.05,), daemon=True)

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def __enter__(self) -> FakeService:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        with self._changed:
            self._closing = True
            self._changed.notify_all()
        self._server.shutdown()
        self._server.server_close()

    # -- test controls -------------------------------------------------------------------------

    def wake(self, commands: list[dict[str, Any]] | None = None) -> None:
        """The agent's commands changed (optionally to `commands`): move the generation, answer waits."""
        with self._changed:
            if commands is not None:
                self.commands = commands
            self.generation += 1
            self._changed.notify_all()

    # -- queries for tests ---------------------------------------------------------------------

    @property
    def samples(self) -> list[dict[str, Any]]:
        with self.lock:
            return [s["sample"] for s in self.syncs]

    @property
    def running(self) -> list[list[str]]:
        """The running list of each sync, in order."""
        with self.lock:
            return [s["running"] for s in self.syncs]

    def sync_times(self) -> list[float]:
        """When each sync arrived (time.monotonic())."""
        with self.lock:
            return [s["at_s"] for s in self.syncs]

    def reports_for(self, lease_id: str, kind: str | None = None) -> list[dict[str, Any]]:
        with self.lock:
            found = [r for (lid, _seq), r in self.reports.items() if lid == lease_id]
        found.sort(key=lambda r: r["seq"])
        return [r for r in found if kind is None or r["kind"] == kind]

    def exited(self, lease_id: str) -> dict[str, Any] | None:
        found = self.reports_for(lease_id, "exited")
        return found[0] if found else None

    # -- HTTP ----------------------------------------------------------------------------------

    def _sync(self, body: dict[str, Any]) -> dict[str, Any]:
        running = list(body.get("running", []))
        acked, rejected = [], []
        with self.lock:
            self.syncs.append(
                {
                    "at_s": time.monotonic(),
                    "sample": body.get("sample"),
                    "running": running,
                    **({"sizes": body["sizes"]} if "sizes" in body else {}),
                    "reports": [(r.get("lease_id"), r.get("seq")) for r in body.get("reports", [])],
                }
            )
            for report in body.get("reports", []):
                self.report_posts.append(report)
                lease_id, seq = report.get("lease_id"), report.get("seq")
                if not isinstance(lease_id, str) or not isinstance(seq, int) or "kind" not in report:
                    rejected.append(
                        {
                            "lease_id": lease_id if isinstance(lease_id, str) else None,
                            "seq": seq if isinstance(seq, int) else None,
                            "error": "malformed",
                            "code": 400,
                        }
                    )
                    continue
                self.reports.setdefault((lease_id, seq), {**report, "received_at_s": time.time()})
                if self.ack:
                    self.acked.add((lease_id, seq))
                    acked.append([lease_id, seq])
            generation = self.generation
            wait = None
            if self.offer_wait:
                ticket = f"ticket-{len(self.syncs)}"
                self._tickets.add(ticket)
                wait = {
                    "url": WAIT_PATH,
                    "ticket": ticket,
                    "generation": generation,
                    "timeout_s": self.wait_timeout_s,
                }
        commands = self.command_fn(running) if self.command_fn else list(self.commands)
        answer = {
            "state": "MIXED" if running else "IDLE",
            "commands": commands,
            "acked": acked,
            "rejected": rejected,
            "sync_interval_s": self.sync_interval_s,
            "wait": wait,
        }
        return {**answer, "fence": self.fence} if self.fence else answer

    def _answer_post(self, path: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        if self.down:
            return 503, {"detail": "down"}
        if path == "/api/v1/agent/register":
            if self.register_status != 200:
                return self.register_status, {"detail": "refused", "uuids": ["GPU-x"]}
            with self.lock:
                self.registrations.append(body)
            answer = {"server": body["hostname"], "sync_interval_s": self.sync_interval_s}
            return 200, {**answer, "fence": self.fence} if self.fence else answer
        if path == "/api/v1/agent/sync":
            if self.sync_status != 200:
                return self.sync_status, self.sync_body
            return 200, self._sync(body)
        return 404, {"detail": "not found"}

    def _answer_wait(self, query: str) -> tuple[int, dict[str, Any]]:
        """Hold until the generation passes the agent's (woken) or the timeout (not woken)."""
        params = {k: v[0] for k, v in parse_qs(query).items()}
        record: dict[str, Any] = {"query": params, "at_s": time.monotonic()}
        with self._changed:
            self.waits.append(record)
            if self.down or self.wait_status != 200:
                record["answer"] = 503 if self.down else self.wait_status
                return record["answer"], {"detail": "waking is unavailable"}
            if params.get("ticket") not in self._tickets:
                record["answer"] = 401
                return 401, {"detail": "bad or expired ticket"}
            seen, timeout_s = int(params["generation"]), float(params["timeout_s"])
            self.waiting += 1
            try:
                self._changed.wait_for(lambda: self.generation > seen or self._closing, timeout_s)
            finally:
                self.waiting -= 1
            answer = {"generation": self.generation, "woken": self.generation > seen}
            record["answer"] = answer
        return 200, answer

    def _handler_class(self) -> type[BaseHTTPRequestHandler]:
        service = self

        class Handler(BaseHTTPRequestHandler):
            def _send(self, status: int, answer: dict[str, Any]) -> None:
                data = json.dumps(answer).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                # An agent that stopped (and closed its client) while its wait was held is gone.
                with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                    self.wfile.write(data)

            def do_POST(self) -> None:
                if self.headers.get("Authorization") != f"Bearer {service.token}":
                    status, answer = 401, {"detail": "bad token"}
                else:
                    length = int(self.headers.get("Content-Length") or 0)
                    body = json.loads(self.rfile.read(length) or b"{}")
                    status, answer = service._answer_post(self.path, body)
                self._send(status, answer)

            def do_GET(self) -> None:
                # Like the real wait endpoint: the signed ticket is the credential, not the agent token.
                url = urlsplit(self.path)
                if url.path != WAIT_PATH:
                    self._send(404, {"detail": "not found"})
                    return
                self._send(*service._answer_wait(url.query))

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
