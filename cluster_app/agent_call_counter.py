"""Counts of agent calls by kind, kept in Django's cache so every web worker adds to the same figures."""

from __future__ import annotations

import logging
import re
from functools import lru_cache

import redis
from django.core.cache import cache, caches
from django.core.cache.backends.redis import RedisCache

logger = logging.getLogger(__name__)

KEY_PREFIX = "attune:agent-calls"
# The cache cannot list its keys, so the kinds seen are written into numbered slots, each claimed with
# add() (set-if-absent, atomic in Redis and in local memory): two workers seeing two new kinds at
# once take two different slots, where a read-modify-write list would lose one of them.
MAX_KINDS = 16
# A kind becomes a Prometheus label value: keep it a short identifier, and the set small.
KIND_PATTERN = re.compile(r"[a-z][a-z0-9_]{0,31}")


def _counter_key(kind: str) -> str:
    return f"{KEY_PREFIX}:count:{kind}"


def _slot_key(slot: int) -> str:
    return f"{KEY_PREFIX}:kind:{slot}"


def count_agent_call(kind: str) -> None:
    """Add one call of `kind` (e.g. "register", "sync"); a lowercase identifier of up to 32 characters.

    Counters never expire; a flushed or evicted cache starts them again from zero, which Prometheus
    reads as a counter reset.
    """
    if not KIND_PATTERN.fullmatch(kind):
        raise ValueError(f"agent call kind must match {KIND_PATTERN.pattern}: {kind!r}")
    key = _counter_key(kind)
    try:
        backend = caches["default"]  # `cache` is a proxy: isinstance() needs the backend itself
        if isinstance(backend, RedisCache):
            if _redis_incr(backend, key) == 1:  # created by this call: the kind is registered once
                _register(kind)
            return
        try:
            cache.incr(key)
        except ValueError:
            # Not there yet (or evicted): add() is true only for the call that creates the counter,
            # the one time the kind is registered.
            if cache.add(key, 0, timeout=None):
                _register(kind)
            cache.incr(key)
    except Exception as exc:
        # A counter must never cost an agent its sync: with the cache (Redis) down the call goes on
        # uncounted (found by tests/faults/test_redis_restarted.py: every sync answered 500).
        logger.warning("agent call not counted (cache unavailable): %s", exc)


def _redis_incr(backend: RedisCache, key: str) -> int:
    """INCR on the cache's own Redis key, one round trip: RedisCache.incr() asks EXISTS first (it must
    raise for a missing key), a second round trip on every agent sync. Redis creates a missing counter
    at 1, and the cache stores integers as plain numbers, so cache.get() reads what INCR wrote."""
    redis_key = backend.make_and_validate_key(key)
    return _client_on(backend._cache._get_connection_pool(write=True)).incr(redis_key)


@lru_cache(maxsize=8)
def _client_on(pool: redis.ConnectionPool) -> redis.Redis:
    """One client per connection pool (config/redis_pool.py shares the pool in the process). The cache's
    get_client() builds a new redis.Redis on every call, and its constructor fills a table of about a
    hundred response callbacks: half the CPU of the sync's INCR (152 against 72 us, measured by hand,
    3,000 INCRs each). Clients are thread-safe; the pool hands each command its own connection."""
    return redis.Redis(connection_pool=pool)


def _register(kind: str) -> None:
    for slot in range(MAX_KINDS):
        if cache.add(_slot_key(slot), kind, timeout=None) or cache.get(_slot_key(slot)) == kind:
            return
    logger.warning("agent call kind %r not exposed: all %d slots are taken", kind, MAX_KINDS)


def agent_calls() -> dict[str, int]:
    """Kind -> calls counted so far, for every kind registered (two cache reads)."""
    slots = cache.get_many([_slot_key(slot) for slot in range(MAX_KINDS)])
    kinds = sorted(set(slots.values()))
    counts = cache.get_many([_counter_key(kind) for kind in kinds])
    return {kind: int(counts.get(_counter_key(kind), 0)) for kind in kinds}


def agent_calls_forget() -> None:
    """Delete every counter and slot (tests; a fresh start)."""
    slots = cache.get_many([_slot_key(slot) for slot in range(MAX_KINDS)])
    cache.delete_many([_counter_key(kind) for kind in set(slots.values())])
    cache.delete_many([_slot_key(slot) for slot in range(MAX_KINDS)])
