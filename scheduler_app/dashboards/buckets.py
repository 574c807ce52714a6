"""Time windows cut into a bounded number of equal buckets, and the SQL expression that bins a timestamp."""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from django.db.models import Func, IntegerField

# Charts stay readable and JSON stays small: never more than this many points per series.
MAX_POINTS = 500
# Bucket widths tried in order; the first that cuts the window into <= MAX_POINTS buckets is used.
BUCKET_LADDER_S = (60, 300, 900, 1800, 3600, 3 * 3600, 6 * 3600, 86400, 7 * 86400)
MAX_DAYS = 366


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


def window_for(*, days: float, now: datetime, max_points: int = MAX_POINTS) -> Window:
    """The last `days` days up to `now`, cut into at most `max_points` buckets of a ladder width."""
    span_s = days * 86400
    bucket_s = next((w for w in BUCKET_LADDER_S if span_s / w <= max_points - 1), BUCKET_LADDER_S[-1])
    # Align the start down to a bucket boundary so that buckets agree with the SQL binning below.
    start_epoch = (int((now - timedelta(days=days)).timestamp()) // bucket_s) * bucket_s
    return Window(start=datetime.fromtimestamp(start_epoch, tz=UTC), end=now, bucket_s=bucket_s)


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
