"""The agent's one call: a sync every interval (usage, spooled reports, running leases; commands and
acks back), sooner when something urgent happened or the service woke us (docs/agent-protocol.md)."""

from __future__ import annotations

import logging
import random
import threading
from collections.abc import Callable
from typing import Any

from agent.client import ServiceClient, ServiceError
from agent.fence import boot_clock_s
from agent.spool import Spool

log = logging.getLogger(__name__)

# Each wait for the next sync is the interval times a factor in [1 - JITTER, 1 + JITTER]: a thousand
# agents started together do not stay in step.
JITTER = 0.1
NOT_REGISTERED = "not_registered"  # a sync's 409 code: the server has no registration (agent-protocol.md)
WAIT_RETRY_S = 5.0


class Syncer:
    """Runs the sync loop on its own thread and, when the service offers one, a long-poll beside it.

    Delivery of reports is at-least-once: a report leaves the spool only once a sync's answer acked or
    rejected it, so a crash between the service's commit and our delete sends it again, and the
    service's (lease_id, seq) idempotency turns that into a no-op.
    """

    def __init__(
        self,
        spool: Spool,
        client: ServiceClient,
        *,
        sample: Callable[[], dict[str, Any]],
        running: Callable[[], list[str]],
        apply_commands: Callable[[list[dict[str, Any]]], None],
        interval_s: float,
        renew: Callable[[list[str], float, Any], None] = lambda listed, sent_boot_s, fence: None,
        reregister: Callable[[], None] = lambda: None,
        boot_clock: Callable[[], float] = boot_clock_s,
        batch_size: int = 500,
        max_backoff_s: float = 30.0,
        stop_event: threading.Event | None = None,
        sizes: Callable[[], dict[str, list[float]]] | None = None,
    ) -> None:
        self.spool = spool
        self.client = client
        self.sample = sample
        self.running = running
        self.sizes = sizes  # the running leases' sizes, for an agent that resizes them in place
        self.apply_commands = apply_commands
        self.renew = renew
        self.reregister = reregister
        self.boot_clock = boot_clock
        self.interval_s = interval_s
        self.batch_size = batch_size
        self.max_backoff_s = max_backoff_s
        self.stop_event = stop_event or threading.Event()
        self.syncs = 0
        self._wake = threading.Event()
        self._wait: dict[str, Any] | None = None  # the last answer's long-poll offer
        self._wait_changed = threading.Event()
        self._threads: list[threading.Thread] = []

    def notify(self, urgent: bool = True) -> None:
        """A report was spooled: an urgent one (an exit, a failed start, a profiling point) is sent now,
        others (a start, progress, logs) at the next sync."""
        if urgent:
            self._wake.set()

    def sync_once(self) -> tuple[dict[str, Any], bool]:
        """One sync; returns the answer and whether the spool holds more than this sync carried.

        Raises ServiceError when the service cannot be reached or refuses the call.
        """
        batch = self.spool.pending(self.batch_size)
        running = self.running()
        payload = {"sample": self.sample(), "running": running, "reports": [r.as_json() for r in batch]}
        if self.sizes is not None:
            payload["sizes"] = self.sizes()
        # Before the request leaves (retries included): the service's clock for this sync starts later,
        # so a lease renewed as of now is stopped by its fence no later than the service counts on.
        sent_boot_s = self.boot_clock()
        answer = self.client.sync(payload)
        self.syncs += 1
        self.spool.remove(self._settled(answer))
        self.apply_commands(answer.get("commands") or [])
        self.renew(running, sent_boot_s, answer.get("fence"))
        if answer.get("sync_interval_s"):
            self.interval_s = float(answer["sync_interval_s"])
        wait = answer.get("wait")
        if wait != self._wait:
            self._wait = wait
            self._wait_changed.set()
        return answer, len(batch) >= self.batch_size

    @staticmethod
    def _settled(answer: dict[str, Any]) -> set[tuple[str, int]]:
        settled: set[tuple[str, int]] = set()
        for item in answer.get("acked", []):
            settled.add((str(item[0]), int(item[1])))
        for item in answer.get("rejected", []):
            lease_id, seq = item.get("lease_id"), item.get("seq")
            log.warning("service rejected report %s seq %s: %s", lease_id, seq, item.get("error"))
            if isinstance(item.get("seq"), int):  # a rejection naming no seq matches no spooled report
                settled.add((str(item.get("lease_id")), item["seq"]))
        return settled

    def _next_wait_s(self) -> float:
        return self.interval_s * random.uniform(1 - JITTER, 1 + JITTER)

    def run(self) -> None:
        """Sync until stopped: at the interval, at once when woken, with backoff while failing."""
        backoff_s = 0.0
        failing = False
        while not self.stop_event.is_set():
            self._wake.clear()
            try:
                _, more = self.sync_once()
                if failing:
                    log.info("sync: the service answers again")
                failing, backoff_s = False, 0.0
            except ServiceError as exc:
                body = exc.body if isinstance(exc.body, dict) else {}
                if exc.status_code == 409 and body.get("code") == NOT_REGISTERED:
                    # The service lost or reset this server's registration (a server re-created in the
                    # admin, a database restored): register again (retried until it answers), then sync.
                    log.warning("sync refused: the service asks this agent to register again")
                    self.reregister()
                    self.stop_event.wait(0.5)  # never a tight loop, whatever the service answers
                    continue
                # Connection refused, 5xx, or a refusal (4xx) an operator must fix: the reports stay
                # spooled and the jobs keep running; retried with exponential backoff.
                # A refusal (a revoked token, an unknown server) needs an operator: said at ERROR.
                status = exc.status_code
                refused = status is not None and 400 <= status < 500 and status != 429
                level = logging.ERROR if refused else logging.WARNING
                log.log(logging.DEBUG if failing and not refused else level, "sync failed: %s", exc)
                failing = True
                backoff_s = min(self.max_backoff_s, max(0.5, backoff_s * 2))
                self.stop_event.wait(backoff_s)
                continue
            except Exception:  # never let the loop die: the spool keeps the reports
                log.exception("sync failed")
                failing = True
                self.stop_event.wait(1.0)
                continue
            if more:
                continue  # catching up after an outage: the next batch at once
            self._wake.wait(self._next_wait_s())

    def _wait_loop(self) -> None:
        """Long-poll the service between syncs; a woken answer triggers a sync at once."""
        while not self.stop_event.is_set():
            offer = self._wait
            if not offer:
                self._wait_changed.wait(1.0)
                self._wait_changed.clear()
                continue
            self._wait_changed.clear()
            try:
                answer = self.client.wait(
                    offer["url"], ticket=offer["ticket"], generation=int(offer["generation"]),
                    timeout_s=float(offer["timeout_s"]),
                )  # fmt: skip
            except ServiceError as exc:
                # An older service, a proxy without the path, Redis down: syncs at the interval still
                # carry everything, so this is only slower. Try again a little later.
                log.debug("wait failed: %s", exc)
                self.stop_event.wait(WAIT_RETRY_S)
                continue
            if answer.get("woken"):
                # Wait for the sync it triggers to bring a new generation, not to spin on the old one:
                # cleared first, as a sync made while this wait was held left it set with an offer that
                # still names the old generation (a second wait on it is woken at once: a second sync).
                self._wait_changed.clear()
                self._wake.set()
                self._wait_changed.wait(self.interval_s)
            elif self._wait is offer and offer is not None:
                offer["generation"] = max(int(offer["generation"]), int(answer.get("generation") or 0))

    def start(self) -> None:
        for name, target in (("sync", self.run), ("wait", self._wait_loop)):
            thread = threading.Thread(target=target, name=name, daemon=True)
            thread.start()
            self._threads.append(thread)

    def join(self, timeout_s: float | None = None) -> None:
        """Wait for the sync thread to end (once stop_event is set). Not for the wait thread: a long-poll
        the service holds ends only at its timeout (30 s by default), and that thread merely sets events,
        so the agent's exit (and the SIGTERMs of stop_leases_on_exit) must not wait it out."""
        self._wake.set()
        self._wait_changed.set()
        for thread in self._threads:
            if thread.name != "wait":
                thread.join(timeout_s)
