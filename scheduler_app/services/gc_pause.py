"""The garbage collector held off for a burst of allocations whose garbage is not cyclic (a round).

A live round at a thousand servers builds some hundred thousand small objects (job rows, views,
placements, the core's states) and frees nearly all of them by reference counting as it ends. Meanwhile
every 700 net allocations start a collection, and every tenth of those walks the older objects again:
about 345 passes a round, 2 or 3 of them full, 150 to 190 ms of wall time; held off, the round's CPU
went from 580 / 718 / 596 to 497 / 527 / 626 ms, alternated in one run with the worker's start-up
objects frozen (bench.round_cost, 1,000 servers, 6,000 jobs, 2026-11-29, on a machine at load 5). It
resumes after the round, and its next pass finds whatever cycles the round left.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def gc_paused() -> Iterator[None]:
    """No automatic collection within; the collector's state is back as it was after (also on error).
    Nested pauses, or one where the collector was already off, leave it off for the outer one."""
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()
