"""`make test`'s parallel workers each get Redis databases of their own (tests/xdist_services.py)."""

import pytest

from tests.xdist_services import worker_urls

ENVIRON = {"REDIS_URL": "redis://127.0.0.1:6379/15", "CACHE_URL": "redis://127.0.0.1:6379/13"}


def test_the_first_worker_keeps_the_given_databases():
    assert worker_urls("gw0", ENVIRON) == {}


def test_each_other_worker_takes_databases_no_one_else_has():
    taken = {"15", "13"}
    for number in range(1, 7):
        urls = worker_urls(f"gw{number}", ENVIRON)
        assert set(urls) == {"REDIS_URL", "CACHE_URL"}
        databases = {url.rsplit("/", 1)[1] for url in urls.values()}
        assert len(databases) == 2 and not databases & taken and "0" not in databases
        assert all(url.startswith("redis://127.0.0.1:6379/") for url in urls.values())
        taken |= databases
    assert worker_urls("gw1", ENVIRON) == {
        "CACHE_URL": "redis://127.0.0.1:6379/14",
        "REDIS_URL": "redis://127.0.0.1:6379/12",
    }


def test_a_cache_outside_redis_stays_and_redis_without_a_database_moves_off_0():
    environ = {"REDIS_URL": "redis://:secret@redis.lab:6380", "CACHE_URL": "locmemcache://"}
    assert worker_urls("gw1", environ) == {"REDIS_URL": "redis://:secret@redis.lab:6380/15"}


def test_too_many_workers_is_an_error_that_says_so():
    with pytest.raises(RuntimeError, match="no Redis databases left"):
        worker_urls("gw8", ENVIRON)
