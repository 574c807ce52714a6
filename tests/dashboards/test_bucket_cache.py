"""The closed-bucket cache: settled buckets come from the cache, the open ones from the database."""

from __future__ import annotations

from datetime import timedelta

from scheduler_app.dashboards.bucket_cache import REFRESH_S, SETTLE_S, bucket_values
from scheduler_app.dashboards.buckets import Window
from tests.dashboards.conftest import T0


class FakeSource:
    """fetch(start, end): one value per hour bucket, its epoch index x 10; records each call."""

    def __init__(self):
        self.calls = []

    def __call__(self, start, end):
        self.calls.append((start, end))
        first, last = int(start.timestamp()) // 3600, int(end.timestamp() - 1) // 3600
        return {i: i * 10 for i in range(first, last + 1) if i % 5 != 0}  # every 5th bucket empty


def window(end_h: float) -> Window:
    return Window(start=T0, end=T0 + timedelta(hours=end_h), bucket_s=3600)


def test_the_second_read_asks_the_database_only_for_the_open_bucket():
    source, now = FakeSource(), (T0 + timedelta(hours=10)).timestamp()
    first = bucket_values("s", window(9.5), source, clock=lambda: now)
    again = bucket_values("s", window(9.5), source, clock=lambda: now)
    assert first == again
    assert len(first) == 10 - sum(1 for i in range(10) if (window(9.5).first_index + i) % 5 == 0)
    assert source.calls[0][0] == T0
    # Hours 0..8 ended more than SETTLE_S before the end: only hour 9 (still open) is read again.
    assert source.calls[1] == (T0 + timedelta(hours=9), T0 + timedelta(hours=9.5))


def test_a_bucket_that_just_ended_is_not_settled_yet():
    source, now = FakeSource(), T0.timestamp()
    end_h = 9 + (SETTLE_S / 2) / 3600  # hour 8 ended SETTLE_S / 2 ago
    bucket_values("s", window(end_h), source, clock=lambda: now)
    bucket_values("s", window(end_h), source, clock=lambda: now)
    assert source.calls[1][0] == T0 + timedelta(hours=8)


def test_cached_buckets_are_read_again_after_the_refresh_period():
    source, now = FakeSource(), T0.timestamp()
    bucket_values("s", window(5.5), source, clock=lambda: now)
    bucket_values("s", window(5.5), source, clock=lambda: now + REFRESH_S + 1)
    assert source.calls[1][0] == T0


def test_series_and_widths_do_not_share_entries():
    source, now = FakeSource(), T0.timestamp()
    bucket_values("a", window(3.5), source, clock=lambda: now)
    bucket_values("b", window(3.5), source, clock=lambda: now)
    assert [c[0] for c in source.calls] == [T0, T0]
