"""Ships spooled reports to the service in batches; forgets only what the service acknowledged or rejected."""

from __future__ import annotations

import logging
import threading

from agent.client import ServiceClient, ServiceError, call_with_retry
from agent.spool import Spool

log = logging.getLogger(__name__)


class ReportSender:
    """Drains the spool: POST /reports in batches, delete the acked and rejected ones, retry the rest.

    Delivery is at-least-once: a report is deleted only after the service answered for it, so a crash
    between the service's commit and our delete re-sends it, and the service's (lease_id, seq)
    idempotency turns that into a no-op.
    """

    def __init__(
        self,
        spool: Spool,
        client: ServiceClient,
        *,
        batch_size: int = 100,
        idle_wait_s: float = 1.0,
        max_backoff_s: float = 30.0,
        stop_event: threading.Event | None = None,
    ) -> None:
        self.spool = spool
        self.client = client
        self.batch_size = batch_size
        self.idle_wait_s = idle_wait_s
        self.max_backoff_s = max_backoff_s
        self.stop_event = stop_event or threading.Event()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None

    def notify(self) -> None:
        """A report was spooled: send soon rather than after the idle wait."""
        self._wake.set()

    def send_batch(self) -> int:
        """Send one batch (retrying retryable failures until stopped); returns how many reports were settled.

        Raises ServiceError when the service refuses the whole batch (4xx) or the agent is stopping.
        """
        batch = self.spool.pending(self.batch_size)
        if not batch:
            return 0
        answer = call_with_retry(
            lambda: self.client.send_reports([r.as_json() for r in batch]),
            stop_event=self.stop_event,
            max_backoff_s=self.max_backoff_s,
            what=f"sending {len(batch)} reports",
        )
        settled: set[tuple[str, int]] = set()
        for item in answer.get("acked", []):
            settled.add((str(item[0]), int(item[1])))
        for item in answer.get("rejected", []):
            log.warning(
                "service rejected report %s seq %s: %s",
                item.get("lease_id"),
                item.get("seq"),
                item.get("error"),
            )
            if isinstance(item.get("seq"), int):  # a rejection naming no seq matches no spooled report
                settled.add((str(item.get("lease_id")), item["seq"]))
        return self.spool.remove(settled)

    def flush(self) -> None:
        """Send until the spool is empty or a batch settles nothing (the service ignored it)."""
        while not self.stop_event.is_set():
            if self.send_batch() == 0:
                return

    def run(self) -> None:
        refused_backoff_s = 1.0
        while not self.stop_event.is_set():
            try:
                settled = self.send_batch()
            except ServiceError as exc:
                if self.stop_event.is_set():
                    return
                # A 4xx for a whole batch (bad token, unknown server) will not fix itself soon: keep the
                # reports and try again slowly, so that nothing is lost once an operator fixes it.
                log.error("service refused a report batch: %s (retrying in %.0fs)", exc, refused_backoff_s)
                self.stop_event.wait(refused_backoff_s)
                refused_backoff_s = min(refused_backoff_s * 2, self.max_backoff_s)
                continue
            except Exception:  # never let the sender thread die: the spool keeps the reports
                log.exception("report sender failed; retrying")
                self.stop_event.wait(self.idle_wait_s)
                continue
            refused_backoff_s = 1.0
            if settled == 0:
                self._wake.wait(self.idle_wait_s)
                self._wake.clear()

    def start(self) -> None:
        self._thread = threading.Thread(target=self.run, name="report-sender", daemon=True)
        self._thread.start()

    def join(self, timeout_s: float | None = None) -> None:
        if self._thread is not None:
            self._wake.set()
            self._thread.join(timeout_s)
