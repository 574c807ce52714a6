"""Time windows cut into a bounded number of equal buckets, and the SQL expression that bins a timestamp."""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from django.db.models import Func, IntegerField

# JSON stays small: never more than this many points per series (the JCT CDF, the bucket cache).
MAX_POINTS = 500
# A chart over time shows at most this many buckets: enough to see a shape, few enough that a bucket
# holds more than one round or sample (1 h: 1 min; 6 h: 5 min; 24 h: 15 min; 7 d: 2 h; 30 d: 6 h).
TARGET_POINTS = 150
# Bucket widths tried in order; the first that cuts the window into <= TARGET_POINTS buckets is used.
BUCKET_LADDER_S = (60, 300, 900, 1800, 3600, 2 * 3600, 3 * 3600, 6 * 3600, 86400, 7 * 86400)
MAX_DAYS = 366

# The windows the dashboards offer, as they appear in their URLs (`?window=6h`), and the default.
WINDOW_CHOICES = ("1h", "6h", "24h", "7d", "30d")
DEFAULT_WINDOW = "24h"
_WINDOW_RE = re.compile(r"(\d{1,6}(?:\.\d{1,6})?)([hd])")
_UNIT_S = {"h": 3600, "d": 86400}
_UNIT_WORDS = {"h": ("hour", "hours"), "d": ("day", "days")}


def window_span_s(text: str) -> float:
    """Seconds of a window written `<number>h` or `<number>d` (`6h`, `7d`, `0.5h`), at most MAX_DAYS.

    Raises ValueError for anything else, so that a view can answer 400.
    """
    match = _WINDOW_RE.fullmatch(text.strip())
    if match is None:
        raise ValueError(f"window must look like 1h, 6h, 24h, 7d or 30d, not {text[:20]!r}")
    span_s = float(match.group(1)) * _UNIT_S[match.group(2)]
    if not 0 < span_s <= MAX_DAYS * 86400:
        raise ValueError(f"window must be longer than 0 and at most {MAX_DAYS}d")
    return span_s


def window_label(text: str) -> str:
    """`6h` -> "6 hours", `1d` -> "1 day": how the window selector names a window."""
    match = _WINDOW_RE.fullmatch(text.strip())
    if match is None:
        return text
    number, unit = match.groups()
    singular, plural = _UNIT_WORDS[unit]
    return f"{number} {singular if number == '1' else plural}"


def window_options(current: str) -> list[tuple[str, str]]:
    """(value, label) of each offered window; a valid window from a shared link that the selector does
    not offer (`?window=12h`) is added after them, so that the page shows what the link asked for."""
    options = [(w, window_label(w)) for w in WINDOW_CHOICES]
    if current not in WINDOW_CHOICES:
        options.append((current, window_label(current)))
    return options


@dataclass(frozen=True)
class Window:
    """[start, end) cut into buckets of `bucket_s` seconds; `start` sits on a bucket boundary (UTC epoch)."""

    start: datetime
    end: datetime
    bucket_s: int

    @property
    def first_index(self) -> int:
        return int(self.start.timestamp()) // self.bucket_s

    @property
    def num_buckets(self) -> int:
        return max(1, math.ceil((self.end - self.start).total_seconds() / self.bucket_s))

    def bucket_start(self, index: int) -> datetime:
        """The start of the bucket whose epoch index (floor(epoch / bucket_s)) is `index`."""
        return datetime.fromtimestamp(index * self.bucket_s, tz=UTC)

    def bucket_starts(self) -> list[datetime]:
        return [self.bucket_start(self.first_index + i) for i in range(self.num_buckets)]

    def bucket_span_s(self, position: int) -> float:
        """Seconds of bucket `position` (0-based) that lie inside the window: the last one may be partial."""
        start = self.start + timedelta(seconds=position * self.bucket_s)
        end = min(start + timedelta(seconds=self.bucket_s), self.end)
        return max(0.0, (end - start).total_seconds())

    def as_json(self) -> dict[str, Any]:
        return {"start": self.start.isoformat(), "end": self.end.isoformat(), "bucket_s": self.bucket_s}


def window_spanning(*, span_s: float, now: datetime, max_points: int = TARGET_POINTS) -> Window:
    """The last `span_s` seconds up to `now`, cut into at most `max_points` buckets of a ladder width."""
    # One bucket is kept for the alignment below, which can add a partial one at the start.
    bucket_s = next((w for w in BUCKET_LADDER_S if span_s / w <= max_points - 1), BUCKET_LADDER_S[-1])
    # Align the start down to a bucket boundary so that buckets agree with the SQL binning below.
    start_epoch = (int((now - timedelta(seconds=span_s)).timestamp()) // bucket_s) * bucket_s
    return Window(start=datetime.fromtimestamp(start_epoch, tz=UTC), end=now, bucket_s=bucket_s)


def window_from_query(query: Mapping[str, str], *, now: datetime) -> Window:
    """The window a JSON endpoint was asked for: `window=6h` (window_span_s), else the older `days=N`
    (a number, 0 < N <= MAX_DAYS), else DEFAULT_WINDOW. Raises ValueError saying what is wrong."""
    if "window" in query:
        return window_spanning(span_s=window_span_s(query["window"]), now=now)
    if "days" in query:
        try:
            days = float(query["days"])
        except ValueError:
            days = -1.0
        if not 0 < days <= MAX_DAYS:  # also refuses nan and inf
            raise ValueError(f"days must be a number in (0, {MAX_DAYS}]")
        return window_for(days=days, now=now)
    return window_spanning(span_s=window_span_s(DEFAULT_WINDOW), now=now)


def window_for(*, days: float, now: datetime, max_points: int = TARGET_POINTS) -> Window:
    """The last `days` days up to `now` (window_spanning in days)."""
    return window_spanning(span_s=days * 86400, now=now, max_points=max_points)


class EpochBucket(Func):
    """floor(epoch seconds of a timestamp / width): the bucket index, grouped on in SQL.

    Works on PostgreSQL (the service) and SQLite (the embedded demo); the width is a validated int
    written into the SQL text, so that GROUP BY sees the very same expression as SELECT.
    """

    output_field = IntegerField()

    def __init__(self, expression: Any, width_s: int) -> None:
        super().__init__(expression)
        self.width_s = int(width_s)
        if self.width_s <= 0:
            raise ValueError("bucket width must be positive")

    def as_postgresql(self, compiler, connection, **extra):  # type: ignore[no-untyped-def]
        # date_part gives a double; EXTRACT gives a numeric since PostgreSQL 14, about 1.5x slower here.
        template = f"FLOOR(date_part('epoch', %(expressions)s) / {self.width_s})::bigint"
        return self.as_sql(compiler, connection, template=template, **extra)

    def as_sqlite(self, compiler, connection, **extra):  # type: ignore[no-untyped-def]
        # '%%%%s': the template's own formatting and then the SQLite cursor's each halve the percents.
        template = f"(CAST(strftime('%%%%s', %(expressions)s) AS INTEGER) / {self.width_s})"
        return self.as_sql(compiler, connection, template=template, **extra)
