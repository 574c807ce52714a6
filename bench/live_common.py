"""Helpers for the live-service benches: a throwaway PostgreSQL database with Django set up on it."""

from __future__ import annotations

import fcntl
import logging
import os
import re
import statistics
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import psycopg2

logger = logging.getLogger("bench")

# The PostgreSQL server the benches create their databases on (the local dev one unless told).
DEFAULT_PG_URL = os.environ.get("BENCH_PG_URL", "postgres://postgres@127.0.0.1:5432")
_NAME = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")


def logging_setup() -> None:
    """INFO for the bench's own logger; Django's settings replace the root handler once set up."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per request otherwise
    logging.getLogger("environ").setLevel(logging.WARNING)  # ".env not found" is expected here


def _admin_connection(pg_url: str):
    conn = psycopg2.connect(f"{pg_url.rstrip('/')}/postgres")
    conn.autocommit = True
    return conn


def database_drop(pg_url: str, name: str) -> None:
    """DROP DATABASE IF EXISTS ... WITH (FORCE): also ends connections a crashed run left behind."""
    conn = _admin_connection(pg_url)
    try:
        with conn.cursor() as cursor:
            cursor.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    finally:
        conn.close()


@contextmanager
def bench_database(name: str, *, pg_url: str = DEFAULT_PG_URL, keep: bool = False) -> Iterator[str]:
    """Create database `name` afresh (dropped first if it exists); yield its URL; drop it at the end.

    One bench at a time per database: a second run of the same bench would drop the first's database
    under its running processes (they answer 500s), so it stops at once instead, saying why."""
    if not _NAME.match(name):
        raise ValueError(f"not a plain database name: {name!r}")
    with _exclusive(name):
        yield from _fresh_database(name, pg_url=pg_url, keep=keep)


@contextmanager
def _exclusive(name: str) -> Iterator[None]:
    path = os.path.join(tempfile.gettempdir(), f"{name}.lock")
    with open(path, "w") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise SystemExit(
                f"another bench is using database {name} ({path} is locked): wait for it to end"
            ) from None
        yield


def _fresh_database(name: str, *, pg_url: str, keep: bool) -> Iterator[str]:
    database_drop(pg_url, name)
    conn = _admin_connection(pg_url)
    try:
        with conn.cursor() as cursor:
            cursor.execute(f'CREATE DATABASE "{name}"')
    finally:
        conn.close()
    logger.info("created database %s", name)
    try:
        yield f"{pg_url.rstrip('/')}/{name}"
    finally:
        try:
            from django.db import connections

            connections.close_all()
        except Exception:  # Django may not be set up yet
            pass
        if keep:
            logger.info("kept database %s", name)
        else:
            database_drop(pg_url, name)
            logger.info("dropped database %s", name)


@contextmanager
def database_copy(source: str, name: str, *, pg_url: str = DEFAULT_PG_URL) -> Iterator[None]:
    """Copy database `source` to `name` (CREATE DATABASE ... TEMPLATE) and point this process's Django
    at the copy; back at `source` and the copy dropped at the end. For benches that repeat a scenario
    which changes the data, each time from the same start."""
    from django.db import connections

    if not _NAME.match(name):
        raise ValueError(f"not a plain database name: {name!r}")
    connections.close_all()  # a template must have no open sessions
    database_drop(pg_url, name)
    conn = _admin_connection(pg_url)
    try:
        with conn.cursor() as cursor:
            cursor.execute(f'CREATE DATABASE "{name}" TEMPLATE "{source}"')
    finally:
        conn.close()
    settings = connections["default"].settings_dict
    settings["NAME"] = name
    try:
        yield
    finally:
        connections.close_all()
        settings["NAME"] = source
        database_drop(pg_url, name)


def django_setup(database_url: str, **env: str) -> None:
    """Point this process's Django at `database_url` (plus `env`), set it up and migrate quietly.

    Early rounds run inline (ATTUNE_INLINE_ROUNDS=1) unless `env` says otherwise, so that nothing is
    queued on the shared Redis by a bench; the project's own loggers are quietened to WARNING.
    """
    os.environ["DJANGO_SETTINGS_MODULE"] = "config.settings"
    os.environ["DATABASE_URL"] = database_url
    os.environ.setdefault("DEBUG", "0")
    os.environ["ATTUNE_INLINE_ROUNDS"] = "1"
    os.environ.update(env)
    import django
    from django.core.management import call_command

    django.setup()
    for name in ("scheduler_app", "cluster_app", "profiles_app", "django"):
        logging.getLogger(name).setLevel(logging.WARNING)
    start = time.perf_counter()
    call_command("migrate", verbosity=0, interactive=False)
    logger.info("migrated in %.1f s", time.perf_counter() - start)


def percentile(samples: Sequence[float], q: float) -> float:
    """The q-th percentile (0..100) of `samples`, interpolated; NaN when there are none."""
    if not samples:
        return float("nan")
    if len(samples) == 1:
        return float(samples[0])
    return statistics.quantiles(samples, n=100, method="inclusive")[max(0, min(98, round(q) - 1))]


def servers_create(num_servers: int, *, uuid_tag: str) -> list:
    """`num_servers` testbed-shaped servers (8 V100, 24 cores, 500 GB) through the cluster service."""
    from cluster_app.services import GpuSpec, server_create

    return [
        server_create(
            name=f"gpu{i:03d}",
            num_cpus=24,
            mem_gb=500.0,
            gpus=[GpuSpec(index=g, uuid=f"GPU-{uuid_tag}-{i:03d}-{g}", model="V100") for g in range(8)],
            gpu_model="V100",
        )
        for i in range(num_servers)
    ]
