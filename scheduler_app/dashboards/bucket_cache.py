"""Per-bucket aggregates of the per-minute usage sums, kept in Django's cache once a bucket has closed.

The measured utilisation reads ClusterUsageMinute, one row per minute: a cold week is tens of ms, but
a year is half a million rows (about a second on the 2-core dev machine), on every 30-second refresh
of every open dashboard. A bucket that ended a while ago no longer changes, so each series keeps its
closed buckets (one cache entry per series and bucket width, a dict index -> value) and asks the
database only for the buckets it lacks, which after the first request is the open one at the end:
an index range scan over a few minutes.

Two things may still change a closed bucket: an agent that was cut off sends its spooled samples
late, and the hourly roll-up folds raw samples older than the retention period into per-minute
averages (and recomputes those minutes' sums). Hence a bucket counts as closed only SETTLE_S after
its end, and a cached value is read again from the database after REFRESH_S.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

from django.core.cache import cache

from scheduler_app.dashboards.buckets import Window

SETTLE_S = 300
REFRESH_S = 3600
KEY_PREFIX = "attune:dashboards:buckets"


def bucket_values(
    series: str,
    window: Window,
    fetch: Callable[[datetime, datetime], dict[int, Any]],
    *,
    clock: Callable[[], float] = time.time,
) -> dict[int, Any]:
    """Bucket position (0-based in `window`) -> value, for every bucket with data.

    `fetch(start, end)` aggregates the database rows in [start, end) and returns epoch bucket index
    (floor(epoch / bucket_s)) -> value; it is called at most once, from the first bucket not cached.
    """
    key = f"{KEY_PREFIX}:{series}:{window.bucket_s}"
    first, n, width = window.first_index, window.num_buckets, window.bucket_s
    now_s = clock()
    closed_until = window.end.timestamp() - SETTLE_S  # buckets ending before this are settled
    stored: dict[int, tuple[float, Any]] = cache.get(key) or {}
    values: dict[int, Any] = {}
    missing_from: int | None = None
    for pos in range(n):
        entry = stored.get(first + pos)
        if entry is not None and now_s - entry[0] < REFRESH_S:
            if entry[1] is not None:
                values[pos] = entry[1]
        else:
            missing_from = pos
            break
    if missing_from is None:
        return values
    start = window.start + timedelta(seconds=missing_from * width)
    fresh = fetch(start, window.end)
    for pos in range(missing_from, n):
        value = fresh.get(first + pos)
        if value is not None:
            values[pos] = value
        if (first + pos + 1) * width <= closed_until:
            # Empty closed buckets are cached too (None), so a gap in the data costs nothing later.
            stored[first + pos] = (now_s, value)
    # Keep only what a window of the same width can still show (at most MAX_POINTS buckets back).
    oldest = first + n - 2 * max(n, 500)
    cache.set(key, {i: v for i, v in stored.items() if i >= oldest}, timeout=None)
    return values
