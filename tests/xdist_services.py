"""Each pytest-xdist worker's own Redis databases, set before Django reads its settings.

`make test` loads this plugin with `-p tests.xdist_services` (pytest-django reads the settings before
any conftest.py, so a conftest would be too late for the Celery app's broker). The first worker (gw0)
keeps REDIS_URL and CACHE_URL as given; worker gwN takes the Nth pair of the databases 15 down to 1
that neither names (database 0 is the demo's default), so one worker's FLUSHDB or `cache.clear()`
never empties another's. PostgreSQL needs nothing here: pytest-django suffixes each worker's test
database (test_attune_gw0, test_attune_gw1 ...).
"""

from __future__ import annotations

import os
from urllib.parse import urlsplit, urlunsplit

NUM_REDIS_DATABASES = 16


def redis_database(url: str) -> int | None:
    """The database index a redis:// URL names (0 when it names none); None for another scheme."""
    parts = urlsplit(url)
    if parts.scheme not in ("redis", "rediss"):
        return None
    path = parts.path.strip("/")
    return int(path) if path else 0


def with_database(url: str, database: int) -> str:
    parts = urlsplit(url)
    return urlunsplit(parts._replace(path=f"/{database}"))


def worker_urls(worker_id: str, environ: dict[str, str]) -> dict[str, str]:
    """The REDIS_URL and CACHE_URL worker `worker_id` (gw0, gw1 ...) uses: those of `environ` moved to
    databases of its own; {} for gw0 and for URLs that are not Redis's."""
    number = int(worker_id.removeprefix("gw"))
    moved = {
        name: (environ[name], db)
        for name in ("CACHE_URL", "REDIS_URL")
        if name in environ and (db := redis_database(environ[name])) is not None
    }
    if number == 0 or not moved:
        return {}
    taken = {db for _, db in moved.values()}
    spare = [db for db in range(NUM_REDIS_DATABASES - 1, 0, -1) if db not in taken]
    start = (number - 1) * len(moved)
    if start + len(moved) > len(spare):
        raise RuntimeError(
            f"pytest-xdist worker {worker_id}: no Redis databases left for it ({len(spare)} spare); "
            "use fewer workers (TEST_WORKERS)"
        )
    return {name: with_database(url, spare[start + i]) for i, (name, (url, _)) in enumerate(moved.items())}


_worker = os.environ.get("PYTEST_XDIST_WORKER")
if _worker:
    os.environ.update(worker_urls(_worker, dict(os.environ)))
