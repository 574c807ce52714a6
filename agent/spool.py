"""The agent's on-disk spool (SQLite): unacknowledged reports, per-lease sequence numbers, lease records."""

from __future__ import annotations

import fcntl
import json
import sqlite3
import threading
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agent.clock import utc_iso

SCHEMA = """
CREATE TABLE IF NOT EXISTS reports (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    lease_id TEXT NOT NULL,
    seq INTEGER NOT NULL,
    kind TEXT NOT NULL,
    at TEXT NOT NULL,
    data TEXT NOT NULL,
    UNIQUE (lease_id, seq)
);
CREATE TABLE IF NOT EXISTS lease_seq (lease_id TEXT PRIMARY KEY, last_seq INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS leases (lease_id TEXT PRIMARY KEY, record TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS finished (lease_id TEXT PRIMARY KEY, finished_at_s REAL NOT NULL);
"""

# Finished-lease markers (and their seq counters) are kept this long so that a start command repeated
# by a service that has not yet processed the `exited` report never runs a finished lease again.
FINISHED_RETENTION_S = 7 * 24 * 3600.0


@dataclass(frozen=True, slots=True)
class Report:
    """One report about a lease; (lease_id, seq) is its idempotency key on the service."""

    lease_id: str
    seq: int
    kind: str
    at: str
    data: dict[str, Any]

    def as_json(self) -> dict[str, Any]:
        return {
            "lease_id": self.lease_id,
            "seq": self.seq,
            "kind": self.kind,
            "at": self.at,
            "data": self.data,
        }


class SpoolLockedError(RuntimeError):
    """Another agent process is using this spool."""


class Spool:
    """Durable agent state in one SQLite file. Thread-safe: one connection behind a lock.

    Every write commits before the call returns (WAL with synchronous=FULL fsyncs the log on commit),
    so a report handed to the syncer has already survived a crash of the agent or of the machine.
    """

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        # Two agents on one spool would both adopt the same leases and interleave their seqs: refuse.
        # flock is released by the kernel when the process dies, so a crash leaves no stale lock.
        self._lock_file = open(path.with_name(path.name + ".lock"), "w")  # noqa: SIM115 - held until close()
        try:
            fcntl.flock(self._lock_file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self._lock_file.close()
            raise SpoolLockedError(f"another agent is using the spool {path}") from None
        self._lock = threading.Lock()
        # check_same_thread=False: the sync and supervisor threads share it under _lock.
        self._db = sqlite3.connect(str(path), check_same_thread=False, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=FULL")
        self._db.executescript(SCHEMA)
        self.prune_finished()

    @contextmanager
    def _transaction(self) -> Iterator[sqlite3.Connection]:
        """The lock held and one SQLite transaction: every statement inside commits together or not at
        all. The connection is in autocommit mode (isolation_level=None), where `with connection:`
        opens no transaction, so a crash between two statements would keep the first (a seq handed
        out with no report stored): BEGIN IMMEDIATE says it."""
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                yield self._db
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")

    def close(self) -> None:
        with self._lock:
            self._db.close()
            self._lock_file.close()  # releases the flock

    # -- reports -------------------------------------------------------------------------------

    def _append_locked(self, lease_id: str, kind: str, data: dict[str, Any], at: str | None) -> Report:
        row = self._db.execute("SELECT last_seq FROM lease_seq WHERE lease_id = ?", (lease_id,)).fetchone()
        seq = (row[0] if row else 0) + 1
        self._db.execute(
            "INSERT INTO lease_seq (lease_id, last_seq) VALUES (?, ?) "
            "ON CONFLICT (lease_id) DO UPDATE SET last_seq = excluded.last_seq",
            (lease_id, seq),
        )
        report = Report(lease_id, seq, kind, at or utc_iso(), data)
        self._db.execute(
            "INSERT INTO reports (lease_id, seq, kind, at, data) VALUES (?, ?, ?, ?, ?)",
            (lease_id, seq, kind, report.at, json.dumps(data)),
        )
        return report

    def append(self, lease_id: str, kind: str, data: dict[str, Any], at: str | None = None) -> Report:
        """Store a new report with the lease's next seq (1, 2, ...; never reused, even after a restart)."""
        with self._transaction():
            return self._append_locked(lease_id, kind, data, at)

    def pending(self, limit: int = 100) -> list[Report]:
        """The oldest unacknowledged reports, in the order they were written."""
        with self._lock:
            rows = self._db.execute(
                "SELECT lease_id, seq, kind, at, data FROM reports ORDER BY id LIMIT ?", (limit,)
            ).fetchall()
        return [Report(r[0], r[1], r[2], r[3], json.loads(r[4])) for r in rows]

    def remove(self, keys: Iterable[tuple[str, int]]) -> int:
        """Forget reports the service acknowledged or rejected (both are final); returns how many."""
        keys = list(keys)
        with self._transaction():
            before = self._db.total_changes
            self._db.executemany("DELETE FROM reports WHERE lease_id = ? AND seq = ?", keys)
            return self._db.total_changes - before

    def pending_count(self) -> int:
        with self._lock:
            return self._db.execute("SELECT COUNT(*) FROM reports").fetchone()[0]

    # -- lease records -------------------------------------------------------------------------

    def lease_started(self, lease_id: str, record: dict[str, Any], started_data: dict[str, Any]) -> Report:
        """Atomically remember a launched lease and queue its `started` report."""
        with self._transaction():
            self._db.execute(
                "INSERT OR REPLACE INTO leases (lease_id, record) VALUES (?, ?)",
                (lease_id, json.dumps(record)),
            )
            return self._append_locked(lease_id, "started", started_data, None)

    def lease_update(self, lease_id: str, record: dict[str, Any]) -> None:
        with self._transaction():
            self._db.execute(
                "UPDATE leases SET record = ? WHERE lease_id = ?", (json.dumps(record), lease_id)
            )

    def lease_finished(self, lease_id: str, exited_data: dict[str, Any]) -> Report:
        """Atomically queue the `exited` report, mark the lease finished and drop its record.

        One transaction, so a crash leaves either a running lease to adopt or a finished one, never a
        lease that is forgotten without an `exited` report or one reported twice.
        """
        with self._transaction():
            report = self._append_locked(lease_id, "exited", exited_data, None)
            self._db.execute(
                "INSERT OR REPLACE INTO finished (lease_id, finished_at_s) VALUES (?, ?)",
                (lease_id, time.time()),
            )
            self._db.execute("DELETE FROM leases WHERE lease_id = ?", (lease_id,))
            return report

    def leases(self) -> dict[str, dict[str, Any]]:
        """Records of the leases that were running when the agent last stopped."""
        with self._lock:
            rows = self._db.execute("SELECT lease_id, record FROM leases").fetchall()
        return {r[0]: json.loads(r[1]) for r in rows}

    def is_finished(self, lease_id: str) -> bool:
        with self._lock:
            return (
                self._db.execute("SELECT 1 FROM finished WHERE lease_id = ?", (lease_id,)).fetchone()
                is not None
            )

    def prune_finished(self, older_than_s: float = FINISHED_RETENTION_S) -> None:
        cutoff = time.time() - older_than_s
        with self._transaction():
            self._db.execute(
                "DELETE FROM lease_seq WHERE lease_id IN "
                "(SELECT lease_id FROM finished WHERE finished_at_s < ?) "
                "AND lease_id NOT IN (SELECT lease_id FROM reports)",
                (cutoff,),
            )
            self._db.execute(
                "DELETE FROM finished WHERE finished_at_s < ? "
                "AND lease_id NOT IN (SELECT lease_id FROM lease_seq)",
                (cutoff,),
            )
