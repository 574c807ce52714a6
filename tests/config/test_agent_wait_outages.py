"""The long-poll's wake hub (config/agent_wait.py) through Redis outages, on a private redis-server that
the tests stop and start (empty) again: no connection leaks, the subscription comes back each time."""

from __future__ import annotations

import asyncio
import random
import shutil
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from cluster_app.agent_wake import GENERATION_KEY, WAKE_CHANNEL
from config import agent_wait
from config.agent_wait import WakeHub
from tests.faults.private_services import PrivateRedis

pytestmark = pytest.mark.skipif(shutil.which("redis-server") is None, reason="no redis-server on PATH")

SERVER_ID = 7
KEY = GENERATION_KEY.format(server_id=SERVER_ID)


@pytest.fixture
def private_redis(tmp_path: Path) -> Iterator[PrivateRedis]:
    """A redis-server of this test's own (no persistence: a restart empties it)."""
    server = PrivateRedis(tmp_path)
    yield server
    server.stop()


def run_in_own_loop(coroutine):
    """asyncio.run on a thread of its own: the main thread may already run an event loop (playwright's
    sync API, used by the browser tests earlier in the suite, leaves one there)."""
    result: dict = {}

    def target() -> None:
        try:
            result["value"] = asyncio.run(coroutine)
        except BaseException as exc:
            result["error"] = exc

    thread = threading.Thread(target=target)
    thread.start()
    thread.join()
    if "error" in result:
        raise result["error"]
    return result["value"]


async def _until(predicate, *, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, f"timed out after {timeout_s:g} s waiting for {what}"
        await asyncio.sleep(0.02)


async def _outage(hub: WakeHub, server: PrivateRedis, *, down_s: float) -> None:
    """Stop Redis for `down_s`, start it again (empty) and wait until the hub has subscribed again."""
    subscribed = hub.subscriptions
    await asyncio.to_thread(server.stop)
    await asyncio.sleep(down_s)
    await asyncio.to_thread(server.start)
    await _until(lambda: hub.subscriptions > subscribed, timeout_s=10, what="a resubscription")


async def _woken_within_s(hub: WakeHub, sync: redis.Redis, *, timeout_s: float = 10.0) -> float:
    """Hold a wait at the current generation, bump it and publish a wake; returns how long the wait took
    to answer after the publish (it fails if the wait was not woken)."""
    seen = int(sync.get(KEY) or 0)
    waiting = asyncio.create_task(hub.wait(SERVER_ID, seen, timeout_s))
    await asyncio.sleep(0.2)
    assert not waiting.done(), waiting.result()
    t0 = time.monotonic()
    await asyncio.to_thread(sync.incr, KEY)
    await asyncio.to_thread(sync.publish, WAKE_CHANNEL, f"0;{SERVER_ID}")
    assert await waiting == (seen + 1, True)
    return time.monotonic() - t0


def test_the_long_poll_recovers_after_a_dozen_outages_and_leaks_no_connection(private_redis, monkeypatch):
    """Twelve outages of 0.2-0.6 s with waiters reading all along: after each one the hub subscribes
    again (with its backoff), a wait is woken through the new subscription, no connection of the
    waiters' pool stays checked out, and Redis sees one subscription from us, not one per outage."""
    monkeypatch.setattr(agent_wait, "RECONNECT_MIN_S", 0.1)  # the backoff's shape, in test time
    monkeypatch.setattr(agent_wait, "RECONNECT_MAX_S", 0.5)
    url = private_redis.url(0)
    rng = random.Random(34)

    async def scenario() -> dict[str, object]:
        hub = WakeHub(url)
        sync = redis.Redis.from_url(url, socket_timeout=2)
        stop = asyncio.Event()
        answers = {"ok": 0, "failed": 0}

        async def reader() -> None:  # the agents' waits, through the outages: 503s, never a hang
            while not stop.is_set():
                try:
                    await hub.wait(SERVER_ID, 10**6, timeout_s=0.2)
                    answers["ok"] += 1
                except Exception:
                    answers["failed"] += 1
                    await asyncio.sleep(0.05)

        readers = [asyncio.create_task(reader()) for _ in range(4)]
        try:
            await _until(lambda: hub.subscriptions == 1, timeout_s=5, what="the first subscription")
            woken_s = [await _woken_within_s(hub, sync)]
            for _ in range(12):
                await _outage(hub, private_redis, down_s=rng.uniform(0.2, 0.6))
                woken_s.append(await _woken_within_s(hub, sync))
            stop.set()
            await asyncio.gather(*readers)
            clients = await asyncio.to_thread(sync.client_list)
            return {
                "woken_s": woken_s,
                "in_use": hub.connections_in_use(),
                "pool_size": len(hub._client().connection_pool._available_connections),
                "subscribers": sum(c["sub"] != "0" for c in clients),
                "subscriptions": hub.subscriptions,
                "answers": answers,
            }
        finally:
            stop.set()
            await hub.close()
            sync.close()

    figures = run_in_own_loop(scenario())
    assert figures["subscriptions"] == 13, figures
    assert max(figures["woken_s"]) < 1.0, figures
    assert figures["in_use"] == 0, figures  # every wait gave its connection back
    assert figures["pool_size"] <= agent_wait.REDIS_CONNECTIONS, figures
    assert figures["subscribers"] == 1, figures  # the old subscriptions were closed, not left behind
    assert figures["answers"]["ok"] > 0 and figures["answers"]["failed"] > 0, figures


def test_the_wait_pool_survives_more_outages_than_it_has_connections(private_redis, monkeypatch):
    """The failure found from outside: after about 7 outages every wait answered 503 for good (`No
    connection available.`). With a pool of 2 connections and 6 outages, waits still answer."""
    monkeypatch.setattr(agent_wait, "REDIS_CONNECTIONS", 2)
    monkeypatch.setattr(agent_wait, "REDIS_POOL_WAIT_S", 1.0)
    monkeypatch.setattr(agent_wait, "RECONNECT_MIN_S", 0.1)
    monkeypatch.setattr(agent_wait, "RECONNECT_MAX_S", 0.5)
    url = private_redis.url(0)

    async def scenario() -> tuple[int, int]:
        hub = WakeHub(url)
        sync = redis.Redis.from_url(url, socket_timeout=2)
        try:
            await hub.wait(SERVER_ID, 0, timeout_s=0)
            for _ in range(6):
                await _outage(hub, private_redis, down_s=0.3)
            await _woken_within_s(hub, sync)
            return await hub.wait(SERVER_ID, 1, timeout_s=0)
        finally:
            await hub.close()
            sync.close()

    assert run_in_own_loop(scenario()) == (1, False)


def test_a_wait_that_saw_more_than_an_emptied_redis_holds_is_answered_woken_at_once(private_redis):
    """Redis restarted empty counts each server's generation from 0 again: an agent that saw 57 would
    otherwise wait out every timeout until the count passes 57; answered woken, it syncs and learns 0."""
    url = private_redis.url(0)

    async def scenario() -> tuple[tuple[int, bool], float]:
        hub = WakeHub(url)
        try:
            t0 = time.monotonic()
            answer = await hub.wait(SERVER_ID, 57, timeout_s=5)
            return answer, time.monotonic() - t0
        finally:
            await hub.close()

    answer, took_s = run_in_own_loop(scenario())
    assert answer == (0, True) and took_s < 1.0


def test_a_subscription_that_hears_nothing_is_given_up_and_renewed(private_redis, monkeypatch):
    """A connection that died without closing reads nothing forever: the hub pings a quiet subscription
    and renews it when not even the pong came. Here Redis answers no one for 1.5 s (CLIENT PAUSE)."""
    monkeypatch.setattr(agent_wait, "PING_S", 0.2)
    url = private_redis.url(0)

    async def scenario() -> int:
        hub = WakeHub(url)
        sync = redis.Redis.from_url(url, socket_timeout=5)
        try:
            await hub.wait(SERVER_ID, 0, timeout_s=0)
            await _until(lambda: hub.subscriptions == 1, timeout_s=5, what="the first subscription")
            await asyncio.sleep(1.0)  # quiet, but the pongs come: still the first subscription
            assert hub.subscriptions == 1
            await asyncio.to_thread(sync.execute_command, "CLIENT", "PAUSE", 1500, "ALL")
            await _until(lambda: hub.subscriptions >= 2, timeout_s=10, what="a renewed subscription")
            await _woken_within_s(hub, sync)
            return hub.subscriptions
        finally:
            await hub.close()
            sync.close()

    assert run_in_own_loop(scenario()) >= 2
