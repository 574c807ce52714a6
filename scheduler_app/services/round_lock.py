"""The round lock: one scheduling round (or profiling dispatch) at a time, across processes."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

from django.db import connection, transaction

from infra.vendor import is_postgresql

# Key of the PostgreSQL advisory lock that makes rounds single-flight ("Attune01" as an integer).
ROUND_LOCK_KEY = int.from_bytes(b"Attune01", "big") & 0x7FFF_FFFF_FFFF_FFFF
# SQLite (the embedded demo) has no advisory locks; one process serves it, so a process-local lock
# gives the same single-flight guarantee there.
_local_round_lock = threading.Lock()


@contextmanager
def round_lock_single_flight() -> Iterator[bool]:
    """Open the round's transaction and try to take the round lock; yields whether it was taken.

    PostgreSQL: pg_try_advisory_xact_lock, released by the database itself when the transaction ends
    (commit, rollback or a dead worker's dropped connection), so a crashed round can never wedge the
    scheduler. Elsewhere: a non-blocking process-local lock.
    """
    if is_postgresql():
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute("SELECT pg_try_advisory_xact_lock(%s)", [ROUND_LOCK_KEY])
            yield bool(cursor.fetchone()[0])
        return
    acquired = _local_round_lock.acquire(blocking=False)
    try:
        with transaction.atomic():
            yield acquired
    finally:
        if acquired:
            _local_round_lock.release()
