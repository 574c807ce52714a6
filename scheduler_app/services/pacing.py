"""Debounce and pacing of background work (early rounds, forecast refreshes, the reports' applier)."""

from __future__ import annotations

import math
from collections.abc import Callable

import redis

# A queued run that finds its pace this far from its end or more is put off until then; less is the
# countdown's own rounding, not worth another message.
PACE_SLACK_S = 0.1


def pace_left_s(client: redis.Redis, key: str) -> float:
    """Seconds until `key`'s pace ends (0: no pace)."""
    return max(0, client.pttl(key)) / 1000.0  # -2: no key, -1: no expiry


def pace_extend(client: redis.Redis, key: str, pace_s: float) -> None:
    """Make the pace `key` last at least `pace_s` from now (a longer pace it has already is kept)."""
    pace_ms = int(pace_s * 1000)
    if pace_ms > 0 and pace_ms > client.pttl(key):
        client.set(key, "1", px=pace_ms)


def put_off_for_pace(
    client: redis.Redis,
    *,
    pace_key: str,
    queued_key: str,
    queued_value: str,
    queued_slack_s: int,
    requeue: Callable[[float], None],
) -> bool:
    """Whether a queued run must wait for a pace set after it was queued; if so `requeue(wait_s)` queues
    it again for the pace's end and its debounce key (`queued_key`) is kept alive until then plus
    `queued_slack_s`, so that the requests meanwhile still find it queued."""
    wait_s = pace_left_s(client, pace_key)
    if wait_s < PACE_SLACK_S:
        return False
    client.set(queued_key, queued_value, ex=max(1, math.ceil(wait_s) + queued_slack_s))
    requeue(wait_s)
    return True


def debounced_send(
    client: redis.Redis,
    *,
    key: str,
    value: str,
    countdown_s: float,
    slack_s: int,
    send: Callable[[], None],
) -> bool:
    """The one debounce: the first request of a burst takes `key` (SET NX EX) and calls `send()`, which
    queues a run `countdown_s` from now; the others find the key taken and return False. The key lives
    `slack_s` past the countdown, so that a run lost with its broker holds back the next one that long
    at most; the run deletes the key as it starts, so a request during the run queues the next one."""
    if not client.set(key, value, nx=True, ex=max(1, math.ceil(countdown_s) + slack_s)):
        return False
    send()
    return True


def debounced_send_after_pace(
    client: redis.Redis,
    *,
    key: str,
    value: str,
    pace_key: str,
    min_countdown_s: float,
    slack_s: int,
    send: Callable[[float], None],
) -> bool:
    """debounced_send of a run that waits `min_countdown_s`, or until the pace `pace_key` ends if that
    is later: `send(countdown_s)` queues it. The pace is read by the request that takes the key only,
    so the others of a burst (every submission's but the first) cost Redis one command, not two; the
    key then lives `slack_s` past the countdown, as debounced_send's."""
    if not client.set(key, value, nx=True, ex=max(1, math.ceil(min_countdown_s) + slack_s)):
        return False
    countdown_s = max(min_countdown_s, pace_left_s(client, pace_key))
    if math.ceil(countdown_s) > math.ceil(min_countdown_s):
        client.set(key, value, ex=math.ceil(countdown_s) + slack_s)  # ours: it outlives the longer wait
    send(countdown_s)
    return True


def cpu_window_left_s(
    stored: str | bytes | None, *, now_s: float, cap_s: float, window_s: float
) -> tuple[float, float]:
    """CPU seconds left in the current window of a budget of `cap_s` per `window_s` (windows aligned
    on the clock: k x window_s), from `stored` (cpu_window_charged's value; None: nothing spent), and
    the seconds until the next window. What a window's last task spent past the cap is taken off the
    next window's, so that over windows the mean stays within the cap."""
    index = math.floor(now_s / window_s)
    spent_s = 0.0
    if stored is not None:
        text = stored.decode() if isinstance(stored, bytes) else stored
        stored_index_text, _, spent_text = text.partition(":")
        stored_index, stored_spent_s = int(stored_index_text), float(spent_text)
        if stored_index == index:
            spent_s = stored_spent_s
        elif stored_index == index - 1:
            spent_s = max(0.0, stored_spent_s - cap_s)  # the overrun carried over
    return cap_s - spent_s, (index + 1) * window_s - now_s


def cpu_window_charged(
    stored: str | bytes | None, *, now_s: float, cap_s: float, window_s: float, cpu_s: float
) -> str:
    """The value to store once a task that started at `now_s` has spent `cpu_s` (its window's)."""
    left_s, _ = cpu_window_left_s(stored, now_s=now_s, cap_s=cap_s, window_s=window_s)
    return f"{math.floor(now_s / window_s)}:{cap_s - left_s + cpu_s:.6f}"
