"""services/pacing.py: the one debounce (first request of a burst sends, the key's life bounds a lost run)."""

from __future__ import annotations

import pytest

from scheduler_app.services.pacing import (
    cpu_window_charged,
    cpu_window_left_s,
    debounced_send,
    debounced_send_after_pace,
    pace_extend,
)
from tests.fake_redis import FakeRedis


def test_the_first_request_of_a_burst_sends_and_the_others_find_the_key():
    client, sent = FakeRedis(), []
    for i in range(4):
        debounced_send(
            client, key="k", value=f"r{i}", countdown_s=2.5, slack_s=60, send=lambda: sent.append(1)
        )
    assert sent == [1]
    assert client.pttl("k") == 63_000  # the countdown rounded up, then the slack: a lost run blocks that long
    client.delete("k")  # the run starts
    assert debounced_send(
        client, key="k", value="next", countdown_s=0, slack_s=1, send=lambda: sent.append(2)
    )
    assert sent == [1, 2] and client.pttl("k") == 1_000


def test_a_send_that_fails_leaves_the_key_and_raises_to_the_caller():
    """The callers catch it (a broker outage must not fail their request) and the key expires."""
    client = FakeRedis()

    def down() -> None:
        raise ConnectionError("broker down")

    with pytest.raises(ConnectionError):
        debounced_send(client, key="k", value="v", countdown_s=0, slack_s=5, send=down)
    assert client.pttl("k") == 5_000


class CountingRedis(FakeRedis):
    """FakeRedis that counts its commands."""

    def __init__(self) -> None:
        super().__init__()
        self.commands = 0

    def set(self, *args, **kwargs):
        self.commands += 1
        return super().set(*args, **kwargs)

    def pttl(self, key) -> int:
        self.commands += 1
        return super().pttl(key)


def test_a_paced_debounce_waits_for_the_pace_and_costs_the_rest_of_a_burst_one_command():
    client, sent = CountingRedis(), []

    def ask(i: int) -> bool:
        return debounced_send_after_pace(
            client, key="k", value=f"r{i}", pace_key="pace", min_countdown_s=2.0, slack_s=60, send=sent.append
        )

    assert ask(0) and sent == [2.0] and client.pttl("k") == 62_000  # no pace: the minimum
    client.commands = 0
    assert not any(ask(i) for i in range(1, 5))
    assert sent == [2.0] and client.commands == 4  # one SET NX each
    client.delete("k")
    pace_extend(client, "pace", 7.5)
    assert ask(5) and sent == [2.0, 7.5]
    assert client.pttl("k") == 68_000  # the key outlives the pace's end by the slack


def test_a_cpu_window_counts_the_cpu_spent_in_its_interval_on_the_clock():
    window = {"cap_s": 1.0, "window_s": 60.0}
    assert cpu_window_left_s(None, now_s=6010.0, **window) == (1.0, 50.0)  # nothing spent: the cap
    stored = cpu_window_charged(None, now_s=6010.0, cpu_s=0.35, **window)
    stored = cpu_window_charged(stored, now_s=6030.0, cpu_s=0.4, **window)
    left_s, next_s = cpu_window_left_s(stored, now_s=6059.0, **window)
    assert left_s == pytest.approx(0.25) and next_s == pytest.approx(1.0)
    assert cpu_window_left_s(stored, now_s=6060.0, **window)[0] == 1.0  # the next interval: the cap
    assert cpu_window_left_s(stored, now_s=6200.0, **window)[0] == 1.0


def test_what_a_window_spent_past_its_cap_is_taken_off_the_next():
    window = {"cap_s": 1.0, "window_s": 60.0}
    stored = cpu_window_charged(None, now_s=6000.0, cpu_s=0.7, **window)
    stored = cpu_window_charged(stored, now_s=6050.0, cpu_s=0.6, **window)  # 1.3 s: 0.3 over
    assert cpu_window_left_s(stored, now_s=6070.0, **window)[0] == pytest.approx(0.7)
    assert cpu_window_left_s(stored, now_s=6130.0, **window)[0] == 1.0  # only into the next one
    stored = cpu_window_charged(stored, now_s=6070.0, cpu_s=0.2, **window)
    assert cpu_window_left_s(stored, now_s=6100.0, **window)[0] == pytest.approx(0.5)
