"""Waking agents between syncs: a per-server generation in Redis, bumped and published on a change.

An agent syncs every `sync_interval_s` (docs/agent-protocol.md). In between it long-polls the wait
endpoint (config/agent_wait.py), which answers as soon as the server's generation passes the one the
agent last saw. Whatever changes a server's commands (a round that starts or ends its leases, a cancel,
a drain) calls `agents_wake_on_commit`, so the agent syncs within moments of the commit instead of at
its next interval. Redis is the only shared state: the wait endpoint needs no database, and a wait
ticket (signed, like a session cookie) stands for the agent's token there.

Without Redis (the embedded demo) waking is off and agents sync at their interval; a Redis that does
not answer costs a warning, never a failed round: the interval is the fallback.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

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


def wake_enabled() -> bool:
    return bool(settings.ATTUNE_AGENT_WAKE)


def _redis(url: str) -> redis.Redis:
    return redis_client(url, REDIS_TIMEOUT_S)


def wake_redis() -> redis.Redis:
    return _redis(settings.REDIS_URL)


def agents_wake(server_ids: Iterable[int]) -> None:
    """Bump each server's generation and tell the wait endpoints (one round trip)."""
    ids = sorted({int(i) for i in server_ids})
    if not ids or not wake_enabled():
        return
    try:
        pipe = wake_redis().pipeline(transaction=False)
        for server_id in ids:
            pipe.incr(GENERATION_KEY.format(server_id=server_id))
        pipe.publish(WAKE_CHANNEL, ",".join(map(str, ids)))
        pipe.execute()
    except redis.RedisError as exc:
        logger.warning("could not wake the agents of servers %s (they sync at their interval): %s", ids, exc)


def agents_wake_on_commit(server_ids: Iterable[int]) -> None:
    """Wake the servers' agents once the current transaction commits (at once outside one)."""
    ids = set(server_ids)
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
