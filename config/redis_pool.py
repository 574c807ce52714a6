"""One Redis connection pool per process (Django's cache, whatever instance asks) and the services' client.

Django's RedisCache keeps its connection pool on the cache instance, and Django hands each request
its own instance when requests run on a2wsgi's threads (the cache handler's storage is per context,
not per thread): every request opened a new TCP connection to Redis, and name resolution with it
(py-spy on the fleet bench: about 4 % of a web worker's time, for one INCR). This pool class hands
every instance the same pool for the same URL and options; redis-py's pools are thread-safe.
"""

from __future__ import annotations

import threading
from functools import lru_cache
from typing import Any

import redis

_pools: dict[tuple[str, tuple], redis.ConnectionPool] = {}
_lock = threading.Lock()


class SharedConnectionPool(redis.ConnectionPool):
    """`from_url` answers the process's pool for that URL and those options (created on first use)."""

    @classmethod
    def from_url(cls, url: str, **kwargs: Any) -> redis.ConnectionPool:
        key = (url, tuple(sorted((k, repr(v)) for k, v in kwargs.items())))
        with _lock:
            pool = _pools.get(key)
            if pool is None:
                pool = _pools[key] = redis.ConnectionPool.from_url(url, **kwargs)
            return pool


@lru_cache(maxsize=8)
def redis_client(url: str, timeout_s: float = 2.0) -> redis.Redis:
    """The process's client for `url` (thread-safe, one pool), failing after `timeout_s` rather than
    hanging the request or round that uses it: the services' debounce and wake keys, which all have a
    fallback when Redis is away."""
    return redis.Redis.from_url(url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s)
