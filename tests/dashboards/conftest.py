"""Fixtures of the dashboard tests: staff and plain clients, a fixed window start, small builders."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from django.core.cache import cache
from django.test import Client

from scheduler_app.models import Job, JobState
from tests.factories import JobFactory, UserFactory

# A bucket boundary for every ladder width up to a week (a Monday, 00:00 UTC).
T0 = datetime(2026, 11, 2, tzinfo=UTC)


def at(hours: float) -> datetime:
    return T0 + timedelta(hours=hours)


@pytest.fixture
def staff_client(db) -> Client:
    client = Client()
    client.force_login(UserFactory(is_staff=True))
    return client


@pytest.fixture
def plain_client(db) -> Client:
    client = Client()
    client.force_login(UserFactory())
    return client


@pytest.fixture(autouse=True)
def empty_bucket_cache():
    """Closed buckets are cached (Redis in CI, CACHE_URL): each test starts from the database alone."""
    cache.clear()
    yield
    cache.clear()


@pytest.fixture(autouse=True)
def configured_scheduler(settings):
    """A known configured policy/allocator; no early rounds queued on Redis by anything here."""
    settings.ATTUNE_SCHEDULER = {
        **settings.ATTUNE_SCHEDULER,
        "policy": "las",
        "allocator": "greedy",
        "inline_rounds": False,
    }


def completed_job(*, submitted_h: float, finished_h: float, **kwargs) -> Job:
    return JobFactory(
        state=JobState.COMPLETED,
        submitted_at=at(submitted_h),
        started_at=at(submitted_h),
        finished_at=at(finished_h),
        **kwargs,
    )
