"""The agents' long-poll, `GET /api/v1/agent/wait`: an ASGI handler that holds a request until the
agent's server has new commands (its wake generation passed the one the agent saw) or a timeout.

It runs beside Django in the same ASGI server (config/asgi.py) but without Django's request cycle:
no database, no thread. A wait costs one Redis GET and an asyncio event; one Redis subscription per
process wakes every waiter of that process (cluster_app/agent_wake.py publishes on commit). The
credential is the signed ticket the sync call handed out, not the agent's token, so no query is
needed to check it. Answers: 200 `{"generation": n, "woken": bool}` (woken: the generation moved;
false: the timeout passed), 400 for a malformed query, 401 for a bad or expired ticket, 503 while Redis
does not answer (the agent then syncs at its interval).

Redis outages, any number of them: the subscription is retried with backoff on a client and pool of its
own, closed with it after each loss, so that nothing a lost subscription held stays checked out (each
outage used to leave one connection of the waiters' pool behind, until after a few outages every wait
answered 503 for good). A Redis restarted empty starts the generations again from 0: a wait that saw a
higher one than Redis now holds is answered as woken, so that its agent syncs and learns the new one.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import random
from collections import defaultdict
from typing import Any
from urllib.parse import parse_qs

import redis.asyncio as aioredis
from django.conf import settings
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from cluster_app.agent_wake import (
    AGENT_WAIT_MAX_S,
    AGENT_WAIT_PATH,
    GENERATION_KEY,
    WAKE_CHANNEL,
    wait_ticket_server,
    wake_message_parse,
)

logger = logging.getLogger(__name__)

WAIT_PATH = AGENT_WAIT_PATH
MAX_WAIT_S = AGENT_WAIT_MAX_S
# A ticket is handed out by every sync; one older than this many sync intervals is refused.
TICKET_MAX_AGE_S = 3600.0
# The subscription's retries after a loss: RECONNECT_MIN_S, doubling up to RECONNECT_MAX_S, each drawn
# between half and all of it (the web processes do not all reconnect in the same instant); back to the
# minimum once subscribed again.
RECONNECT_MIN_S = 0.5
RECONNECT_MAX_S = 5.0
# A quiet subscription is pinged after this long, and given up when nothing (not even the pong) came for
# twice as long: a connection that died without being closed (a host gone, a partition) reads nothing
# forever rather than failing.
PING_S = 10.0
# How long close() waits for the listener to end after cancelling it, then after closing its connection.
CLOSE_WAIT_S = 2.0
# Connections of one process to Redis for the waiters' generation reads (the subscription has its own).
REDIS_CONNECTIONS = 16
REDIS_POOL_WAIT_S = 10.0


class WakeHub:
    """One process's waiters by server id, woken by one Redis subscription."""

    def __init__(self, url: str) -> None:
        self._url = url
        self._waiters: dict[int, set[asyncio.Event]] = defaultdict(set)
        self._listener: asyncio.Task | None = None
        self._redis: aioredis.Redis | None = None
        self.subscriptions = 0  # how many times the listener subscribed (1 + reconnections)
        self._subscription: tuple[Any, aioredis.Redis] | None = None  # (pubsub, its client) now
        self._closed = False

    def _client(self) -> aioredis.Redis:
        if self._redis is None:
            # A bounded pool that makes a caller wait for a free connection: a wake of every waiter
            # (a resubscription, a round that placed work on hundreds of servers) would otherwise open
            # one connection per waiter at once, and under load their connects time out (503s).
            pool = aioredis.BlockingConnectionPool.from_url(
                self._url,
                max_connections=REDIS_CONNECTIONS,
                timeout=REDIS_POOL_WAIT_S,
                socket_connect_timeout=2,
                # Once on a new connection: after Redis restarted, each pooled connection fails its next
                # command ("Connection closed by server"), which would be a 503 per pooled connection.
                retry=Retry(NoBackoff(), 1),
            )
            self._redis = aioredis.Redis.from_pool(pool)  # closes the pool with it
        return self._redis

    def _ensure_listening(self) -> None:
        if self._listener is None or self._listener.done():
            self._listener = asyncio.get_running_loop().create_task(self._listen())

    async def _listen(self) -> None:
        delay_s = RECONNECT_MIN_S
        while not self._closed:
            # A client and pool of the subscription's own, new for each attempt and closed after it: a
            # lost subscription's connection can never stay checked out of the waiters' bounded pool (as
            # an unclosed pubsub's did, one per outage, until none was left), nor can a burst of waiters
            # keep the subscription from reconnecting.
            client = aioredis.Redis.from_url(self._url, socket_connect_timeout=2)
            pubsub = client.pubsub(ignore_subscribe_messages=True)
            self._subscription = (pubsub, client)
            try:
                await pubsub.subscribe(WAKE_CHANNEL)
                self.subscriptions += 1
                delay_s = RECONNECT_MIN_S
                # Subscribed (again): anything published while we were not is unknown, so every waiter
                # re-reads its generation.
                self._wake_all()
                await self._receive(pubsub)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # Redis restarting: waiters time out or are woken on reconnect
                logger.warning("agent wake subscription lost (%s); reconnecting in %.1f s", exc, delay_s)
            finally:
                self._subscription = None
                await _close_quietly(pubsub, client)
            if self._closed:
                return
            await asyncio.sleep(delay_s * random.uniform(0.5, 1.0))
            delay_s = min(RECONNECT_MAX_S, delay_s * 2)

    async def _receive(self, pubsub: Any) -> None:
        """Wake the waiters of each message until the subscription fails (raises)."""
        loop = asyncio.get_running_loop()
        heard_at = pinged_at = loop.time()
        while not self._closed:
            message = await pubsub.get_message(ignore_subscribe_messages=True, timeout=PING_S / 2)
            now = loop.time()
            if message is not None:
                heard_at = now
                if message.get("type") == "message":
                    self._wake(message.get("data", b""))
            elif now - heard_at > 2 * PING_S:
                raise ConnectionError(f"no answer from Redis for {now - heard_at:.0f} s, a ping included")
            elif now - max(heard_at, pinged_at) >= PING_S:
                await pubsub.ping()
                pinged_at = now

    def connections_in_use(self) -> int:
        """Connections of the waiters' pool checked out now (0 when no wait is reading): for tests and
        diagnosis of a leak."""
        if self._redis is None:
            return 0
        return len(getattr(self._redis.connection_pool, "_in_use_connections", ()))

    def _wake(self, data: bytes | str) -> None:
        """Wake the waiters of the message's servers, the n-th server's n spacings from now (see
        cluster_app/agent_wake.py): a timer per server, none per waiter that is not there."""
        spacing_s, server_ids = wake_message_parse(data)
        loop = asyncio.get_running_loop()
        for position, server_id in enumerate(server_ids):
            events = self._waiters.get(server_id)
            if not events:
                continue
            if position == 0 or spacing_s <= 0:
                for event in events:
                    event.set()
            else:
                loop.call_later(position * spacing_s, _set_all, list(events))

    def _wake_all(self) -> None:
        for events in self._waiters.values():
            for event in events:
                event.set()

    async def generation(self, server_id: int) -> int:
        return int(await self._client().get(GENERATION_KEY.format(server_id=server_id)) or 0)

    async def wait(self, server_id: int, seen: int, timeout_s: float) -> tuple[int, bool]:
        """(current generation, woken): returns at once when it already passed `seen`."""
        self._ensure_listening()
        event = asyncio.Event()
        self._waiters[server_id].add(event)
        try:
            loop = asyncio.get_running_loop()
            deadline = loop.time() + timeout_s
            while True:
                # Cleared before the read, not after: a wake that lands while the read is in flight
                # (the bump came after Redis answered it) stays set, and the loop reads again.
                event.clear()
                current = await self.generation(server_id)
                left = deadline - loop.time()
                # Below `seen`: Redis lost its keys (restarted empty) and counts from 0 again. Woken, so
                # that the agent syncs and waits on the new count rather than until it passes the old one.
                if current != seen or left <= 0:
                    return current, current != seen
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(event.wait(), timeout=left)
        finally:
            self._waiters[server_id].discard(event)
            if not self._waiters[server_id]:
                del self._waiters[server_id]

    async def close(self) -> None:
        self._closed = True
        listener = self._listener
        if listener is not None:
            listener.cancel()
            # redis-py's timed reads can take a cancellation for their own timeout and read on (seen on
            # Python 3.11): closing the subscription's connection ends the read whatever became of it.
            done, _ = await asyncio.wait({listener}, timeout=CLOSE_WAIT_S)
            if not done and self._subscription is not None:
                await _close_quietly(*self._subscription)
                await asyncio.wait({listener}, timeout=CLOSE_WAIT_S)
            if listener.done() and not listener.cancelled():
                listener.exception()  # retrieved: an error of a closed listener is of no interest
        if self._redis is not None:
            await self._redis.aclose()


async def _close_quietly(pubsub: Any, client: aioredis.Redis) -> None:
    """Close a subscription and its client (which closes its pool and every connection of it), ignoring
    the errors of a connection that is already dead; shielded, so that a cancellation (the process
    stopping) does not leave it half closed."""
    for close in (pubsub.aclose, client.aclose):
        with contextlib.suppress(Exception):
            await asyncio.shield(close())


def _set_all(events: list[asyncio.Event]) -> None:
    # A waiter that timed out meanwhile left its event behind: setting it costs nothing.
    for event in events:
        event.set()


_hub: WakeHub | None = None


def wake_hub() -> WakeHub:
    global _hub
    if _hub is None:
        _hub = WakeHub(settings.REDIS_URL)
    return _hub


async def _answer(send: Any, status: int, body: dict[str, Any]) -> None:
    payload = json.dumps(body).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode())]
    if status == 401:
        headers.append((b"www-authenticate", b'Ticket realm="agent-wait"'))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": payload})


def _parse(query: bytes) -> tuple[str, int, float]:
    """(ticket, generation seen, timeout s) from the query string; ValueError naming what is wrong."""
    params = parse_qs(query.decode("latin-1"))
    ticket = (params.get("ticket") or [""])[0]
    if not ticket:
        raise ValueError("ticket: required (the sync answer's wait.ticket)")
    try:
        seen = int((params.get("generation") or ["0"])[0])
        timeout_s = float((params.get("timeout_s") or ["30"])[0])
    except ValueError as exc:
        raise ValueError("generation must be an integer and timeout_s a number") from exc
    if seen < 0 or not 0 <= timeout_s <= MAX_WAIT_S:
        raise ValueError(f"generation must be >= 0 and timeout_s within 0..{MAX_WAIT_S:g}")
    return ticket, seen, timeout_s


async def agent_wait_app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """The ASGI handler of WAIT_PATH (GET only)."""
    if scope["method"] != "GET":
        await _answer(send, 405, {"detail": "GET only"})
        return
    try:
        ticket, seen, timeout_s = _parse(scope.get("query_string", b""))
    except ValueError as exc:
        await _answer(send, 400, {"detail": str(exc)})
        return
    server_id = wait_ticket_server(ticket, max_age_s=TICKET_MAX_AGE_S)
    if server_id is None:
        await _answer(send, 401, {"detail": "bad or expired ticket: sync again for a new one"})
        return
    try:
        generation, woken = await wake_hub().wait(server_id, seen, timeout_s)
    except Exception as exc:  # Redis down: the agent falls back to its sync interval
        logger.warning("agent wait for server %s failed: %s", server_id, exc)
        await _answer(send, 503, {"detail": "waking is unavailable; sync at the interval"})
        return
    await _answer(send, 200, {"generation": generation, "woken": woken})
