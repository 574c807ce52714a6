"""As of when an estimate holds (services/forecast_as_of.py): a finished refresh cycle confirms its
start for every estimate, one given up confirms nothing, and no unchanged row is rewritten for it."""

from collections.abc import Iterator
from datetime import timedelta

import pytest
from django.utils import timezone

from scheduler_app.models import JobForecast
from scheduler_app.services import forecast_cycle
from scheduler_app.services.forecast_as_of import (
    estimate_as_of,
    forecast_confirm,
    forecast_confirmed_at,
    job_estimate_as_of,
)
from scheduler_app.services.forecast_cycle import refresh_cycle_drop, refresh_part
from scheduler_app.services.forecasts import HELD, job_forecasts_refresh
from scheduler_app.services.rounds import scheduling_round_run
from tests.api.helpers import make_server, submit, workload

pytestmark = pytest.mark.django_db


@pytest.fixture
def queue(settings, user):
    """Two 4-GPU servers, jobs of different lengths running and waiting (a cycle of several parts),
    and a held job, whose estimate ("held") no forecast changes: returns the held job."""
    settings.ATTUNE_SCHEDULER = {**settings.ATTUNE_SCHEDULER, "policy": "fifo", "allocator": "tune"}
    workload("res18")
    for name in ("gpu01", "gpu02"):
        make_server(name, gpus=4, cpus=12, mem_gb=250)
    for i in range(12):
        submit(user, gpus=1 + (i % 3 == 0), iters=400 * (1 + i % 5), name=f"j{i}")
    held = submit(user, name="held", hold=True)
    scheduling_round_run()
    return held


@pytest.fixture
def client(live_redis):
    keys = (forecast_cycle.LOCK_KEY, forecast_cycle.ASKED_KEY)
    live_redis.delete(*keys)
    refresh_cycle_drop(live_redis)
    yield live_redis
    live_redis.delete(*keys)
    refresh_cycle_drop(live_redis)


def cycle(client, now, *, restart: bool = False) -> Iterator[forecast_cycle.Part]:
    """A cycle's parts (each the one round a part must play), started at `now`; with `restart`, each
    part after a worker restart (the cycle read back from Redis's checkpoint)."""
    for _ in range(500):
        if restart:
            forecast_cycle.refresh_cycle_forget()
        part = refresh_part(client, cpu_s=0.0, now=now)
        yield part
        if part.done:
            return
    pytest.fail("the cycle never ended")


def as_of(job) -> object:
    job.refresh_from_db()
    return job_estimate_as_of(job)


def test_a_finished_cycle_confirms_its_start_for_every_estimate_without_rewriting_them(queue, client):
    first = timezone.now().replace(microsecond=0) - timedelta(minutes=30)
    parts = list(cycle(client, first))
    assert len(parts) > 2 and parts[-1].done
    assert forecast_confirmed_at() == first
    held_row = JobForecast.objects.get(job=queue)
    assert held_row.detail == HELD and held_row.computed_at == first and as_of(queue) == first

    second = first + timedelta(minutes=10)
    list(cycle(client, second))
    assert forecast_confirmed_at() == second
    held_row.refresh_from_db()
    assert held_row.computed_at == first  # unchanged: not rewritten
    assert as_of(queue) == second  # but confirmed by the cycle that finished
    # Every live job's estimate holds as of that cycle's start or later: none older.
    assert all(estimate_as_of(row, second) >= second for row in JobForecast.objects.all())


def test_a_cycle_given_up_midway_confirms_nothing(queue, client):
    first = timezone.now().replace(microsecond=0) - timedelta(minutes=30)
    list(cycle(client, first))
    later = first + timedelta(minutes=10)
    part = refresh_part(client, cpu_s=0.0, now=later)
    assert part.started and not part.done
    refresh_cycle_drop(client)  # given up (its state expired, or an error)
    assert forecast_confirmed_at() == first
    assert as_of(queue) == first
    # What its first part did store says its own time: true of those rows.
    for job_id in part.stored:
        assert JobForecast.objects.get(job_id=job_id).computed_at == later


def test_a_cycle_resumed_after_a_worker_restart_confirms_its_own_start(queue, client):
    first = timezone.now().replace(microsecond=0) - timedelta(minutes=30)
    list(cycle(client, first))
    started = first + timedelta(minutes=10)
    assert not refresh_part(client, cpu_s=0.0, now=started).done
    assert forecast_confirmed_at() == first  # in progress: nothing confirmed yet
    # The worker restarts: the next parts read the cycle back from Redis (a later `now` is not read).
    parts = list(cycle(client, started + timedelta(minutes=5), restart=True))
    assert parts[-1].done and not any(p.started for p in parts)
    assert forecast_confirmed_at() == started
    assert as_of(queue) == started


def test_the_inline_refresh_confirms_its_forecasts_time(queue):
    at = timezone.now().replace(microsecond=0) - timedelta(minutes=2)
    job_forecasts_refresh(now=at)
    assert forecast_confirmed_at() == at and as_of(queue) == at


def test_a_job_forecast_since_the_last_cycle_holds_as_of_its_own_forecast(queue, user):
    confirmed = timezone.now().replace(microsecond=0) - timedelta(minutes=30)
    forecast_confirm(confirmed)
    newer = submit(user, name="newer")
    JobForecast.objects.create(job=newer, detail="x", computed_at=confirmed + timedelta(minutes=20))
    assert as_of(newer) == confirmed + timedelta(minutes=20)
    assert as_of(submit(user, name="not forecast yet")) is None


def test_the_confirmation_never_moves_back():
    at = timezone.now().replace(microsecond=0)
    assert forecast_confirmed_at() is None
    forecast_confirm(at)
    forecast_confirm(at - timedelta(minutes=5))  # a refresh that started earlier, ended later
    assert forecast_confirmed_at() == at
    forecast_confirm(at + timedelta(minutes=1))
    assert forecast_confirmed_at() == at + timedelta(minutes=1)


def test_the_portable_read_gives_what_postgresqls_gives(monkeypatch):
    """The embedded demo's SQLite reads the row through the ORM; PostgreSQL in one plain statement."""
    at = timezone.now().replace(microsecond=0)
    forecast_confirm(at)
    assert forecast_confirmed_at() == at
    monkeypatch.setattr("scheduler_app.services.forecast_as_of.is_postgresql", lambda: False)
    assert forecast_confirmed_at() == at
