"""services/pacing.py: the one debounce (first request of a burst sends, the key's life bounds a lost run)."""

from __future__ import annotations

import pytest

from scheduler_app.services.pacing import debounced_send
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
