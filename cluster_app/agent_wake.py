"""Waking agents between syncs: a per-server generation in Redis, bumped and published on a change.

An agent syncs every `sync_interval_s` (docs/agent-protocol.md). In between it long-polls the wait
endpoint (config/agent_wait.py), which answers as soon as the server's generation passes the one the
agent last saw. Whatever changes a server's commands (a round that starts or ends its leases, a cancel,
a drain) calls `agents_wake_on_commit`, so the agent syncs within moments of the commit instead of at
its next interval. Redis is the only shared state: the wait endpoint needs no database, and a wait
ticket (signed, like a session cookie) stands for the agent's token there.

A commit that wakes many servers at once (a round that placed work on a hundred of them) would have
their agents sync in the same instant: a burst that queues every other agent's sync behind it on the
web tier. So the message names the servers in a random order with a spacing, and the wait endpoints
answer the n-th of them n spacings later (`wake_spacing_s`): a hundred woken agents arrive over a
second rather than at once, and one woken agent at once.

Without Redis (the embedded demo) waking is off and agents sync at their interval; a Redis that does
not answer costs a warning, never a failed round: the interval is the fallback.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar

import redis
from django.conf import settings
from django.core import signing
from django.db import transaction

from config.redis_pool import redis_client

logger = logging.getLogger(__name__)

AGENT_WAIT_PATH = "/api/v1/agent/wait"  # served by config/agent_wait.py, beside Django
AGENT_WAIT_MAX_S = 60.0  # the longest wait the endpoint holds
GENERATION_KEY = "attune:agent-wake:gen:{server_id}"
WAKE_CHANNEL = "attune:agent-wake"
TICKET_SALT = "attune.agent-wait"
REDIS_TIMEOUT_S = 0.5


# The server whose agent's sync runs in this context (`syncing_server`): what the sync changes is not
# woken there, as its commands follow in that sync's answer.
_syncing_server: ContextVar[int | None] = ContextVar("attune_syncing_server", default=None)


def wake_enabled() -> bool:
    return bool(settings.ATTUNE_AGENT_WAKE)


@contextmanager
def syncing_server(server_id: int) -> Iterator[None]:
    """Within it, `agents_wake_on_commit` leaves out `server_id`: its agent's sync is running, and the
    commands it computes after its reports already answer what they changed (an exit ends its lease).
    Woken, the agent's long-poll in flight during the sync would answer at once: one more sync for
    nothing per job end."""
    token = _syncing_server.set(server_id)
    try:
        yield
    finally:
        _syncing_server.reset(token)


def _redis(url: str) -> redis.Redis:
    return redis_client(url, REDIS_TIMEOUT_S)


def wake_redis() -> redis.Redis:
    return _redis(settings.REDIS_URL)


def wake_spacing_s(count: int) -> float:
    """Seconds between the answers of `count` agents woken by one commit: ATTUNE_AGENT_WAKE_SPACING_MS,
    less when `count` of them would take longer than ATTUNE_AGENT_WAKE_SPREAD_MAX_MS (the commands'
    delivery must stay within a couple of seconds of the commit)."""
    if count < 2:
        return 0.0
    spacing_s = max(0.0, float(settings.ATTUNE_AGENT_WAKE_SPACING_MS)) / 1000.0
    spread_max_s = max(0.0, float(settings.ATTUNE_AGENT_WAKE_SPREAD_MAX_MS)) / 1000.0
    return min(spacing_s, spread_max_s / (count - 1))


def wake_message(server_ids: Iterable[int], spacing_s: float) -> str:
    """The wake channel's message: "<spacing ms>;<id>,<id>,...", the n-th id answered n spacings later."""
    return f"{spacing_s * 1000.0:g};" + ",".join(map(str, server_ids))


def wake_message_parse(data: bytes | str) -> tuple[float, list[int]]:
    """(spacing s, server ids in their order) of a wake message; malformed parts are left out, and a
    message without a spacing (an older publisher's) wakes them all at once."""
    text = data.decode() if isinstance(data, bytes) else str(data)
    head, separator, body = text.partition(";")
    spacing_s = 0.0
    if separator:
        try:
            # Bounded by the longest wait: a wake is never held past the waits it answers.
            spacing_s = min(max(0.0, float(head)) / 1000.0, AGENT_WAIT_MAX_S)
        except ValueError:
            spacing_s = 0.0
    else:
        body = head
    return spacing_s, [int(part) for part in body.split(",") if part.strip().isdigit()]


def agents_wake(server_ids: Iterable[int]) -> None:
    """Bump each server's generation and tell the wait endpoints (one round trip), the servers in a
    random order and spaced (`wake_spacing_s`): no server's agent is always the last one answered."""
    ids = sorted({int(i) for i in server_ids})
    if not ids or not wake_enabled():
        return
    order = random.sample(ids, len(ids))
    try:
        pipe = wake_redis().pipeline(transaction=False)
        for server_id in ids:  # in id order: the same order in every publisher
            pipe.incr(GENERATION_KEY.format(server_id=server_id))
        pipe.publish(WAKE_CHANNEL, wake_message(order, wake_spacing_s(len(order))))
        pipe.execute()
    except redis.RedisError as exc:
        logger.warning("could not wake the agents of servers %s (they sync at their interval): %s", ids, exc)


def agents_wake_on_commit(server_ids: Iterable[int]) -> None:
    """Wake the servers' agents once the current transaction commits (at once outside one), but the
    one whose sync is running here (`syncing_server`)."""
    ids = set(server_ids)
    ids.discard(_syncing_server.get())
    if ids and wake_enabled():
        transaction.on_commit(lambda: agents_wake(ids))


def wake_generation(server_id: int) -> int:
    """The server's current generation (0: never bumped, or Redis not answering)."""
    if not wake_enabled():
        return 0
    try:
        return int(wake_redis().get(GENERATION_KEY.format(server_id=server_id)) or 0)
    except (redis.RedisError, ValueError) as exc:
        logger.warning("agent wake generation of server %s unavailable: %s", server_id, exc)
        return 0


def wait_ticket(server_id: int) -> str:
    """A signed, dated token naming the server: the wait endpoint's credential (no database there)."""
    return signing.TimestampSigner(salt=TICKET_SALT).sign(str(server_id))


def wait_ticket_server(ticket: str, *, max_age_s: float) -> int | None:
    """The server a ticket names, or None when it is forged, malformed or older than `max_age_s`."""
    try:
        return int(signing.TimestampSigner(salt=TICKET_SALT).unsign(ticket, max_age=max_age_s))
    except (signing.BadSignature, ValueError):
        return None
