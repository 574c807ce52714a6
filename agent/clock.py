"""Wall-clock helpers: ISO 8601 UTC timestamps as the service expects them."""

from __future__ import annotations

import time
from datetime import UTC, datetime


def utc_iso(ts_s: float | None = None) -> str:
    """`ts_s` (default: now) as an ISO 8601 UTC string with milliseconds, e.g. 2026-11-21T12:00:05.123Z."""
    moment = datetime.fromtimestamp(time.time() if ts_s is None else ts_s, tz=UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{moment.microsecond // 1000:03d}Z"
