"""The worker's refresh in parts (services/forecast_cycle.py): the whole forecast, stored as it settles."""

from collections.abc import Iterator

import pytest
from django.test import override_settings
from django.utils import timezone

from scheduler_app.models import Job, JobForecast, JobState
from scheduler_app.services import forecast_cycle
from scheduler_app.services.forecast_cycle import refresh_cycle_drop, refresh_part
from scheduler_app.services.forecasts import job_forecasts_refresh_estimates
from scheduler_app.services.rounds import scheduling_round_run
from scheduler_app.simulator.forecast import ForecastRun
from tests.api.helpers import make_server, submit, workload

pytestmark = pytest.mark.django_db


@pytest.fixture
def queue(settings, user):
    """Two 4-GPU servers running 1- to 2-GPU jobs of different lengths, a dozen more waiting: their
    finishes come one by one over many rounds."""
    settings.ATTUNE_SCHEDULER = {**settings.ATTUNE_SCHEDULER, "policy": "fifo", "allocator": "tune"}
    workload("res18")
    workload("res50")
    for name in ("gpu01", "gpu02"):
        make_server(name, gpus=4, cpus=12, mem_gb=250)
    jobs = [
        submit(user, gpus=1 + (i % 3 == 0), iters=400 * (1 + i % 5), name=f"j{i}", workload=workload(model))
        for i, model in enumerate(["res18", "res50"] * 9)
    ]
    scheduling_round_run()
    return jobs


@pytest.fixture
def client(live_redis):
    keys = (forecast_cycle.LOCK_KEY, forecast_cycle.ASKED_KEY)
    live_redis.delete(*keys)
    refresh_cycle_drop(live_redis)
    yield live_redis
    live_redis.delete(*keys)
    refresh_cycle_drop(live_redis)


def stored_rows() -> dict[int, tuple]:
    return {f.job_id: (f.start_at, f.finish_at, f.detail, f.position) for f in JobForecast.objects.all()}


def play_parts(client, now, *, other_process: bool) -> Iterator[forecast_cycle.Part]:
    """Parts of no CPU budget (each plays the one round a part must) until the cycle is done."""
    for _ in range(500):
        if other_process:
            forecast_cycle.refresh_cycle_forget()  # read back from Redis, as on the other process
        part = refresh_part(client, cpu_s=0.0, now=now)
        yield part
        if part.done:
            return
    pytest.fail("the cycle never ended")


@pytest.mark.parametrize("other_process", [True, False], ids=["read back from Redis", "kept in memory"])
def test_the_parts_store_what_one_whole_refresh_stores(queue, client, other_process):
    now = timezone.now()
    whole = job_forecasts_refresh_estimates(now=now)
    expected = stored_rows()
    assert sum(e.finish_at is not None for e in whole.values()) == len(queue)  # a whole forecast
    JobForecast.objects.all().delete()

    parts = list(play_parts(client, now, other_process=other_process))

    assert len(parts) > 3 and parts[0].started and not any(p.started for p in parts[1:])
    assert parts[-1].estimates == whole
    assert stored_rows() == expected  # positions too, rows created by the parts included
    assert client.get(forecast_cycle.TOKEN_KEY) is None  # the cycle ended: nothing kept


def test_a_process_whose_copy_is_behind_goes_on_from_the_checkpoint(queue, client, monkeypatch):
    """Parts kept in memory write no pickle until CHECKPOINT_CPU_S of CPU is played; a part on another
    process goes on from the checkpoint (playing again what was played since), and the process that
    played before, its copy now behind, reads back the newer checkpoint: the whole forecast still."""
    monkeypatch.setattr(forecast_cycle, "CHECKPOINT_CPU_S", 1e9)  # none but the forced ones
    now = timezone.now()
    whole = job_forecasts_refresh_estimates(now=now)
    first = refresh_part(client, cpu_s=0.0, now=now)
    checkpoint = client.get(forecast_cycle.STATE_KEY)
    assert first.started and checkpoint is not None  # a cycle's start is checkpointed
    refresh_part(client, cpu_s=0.0, now=now)
    refresh_part(client, cpu_s=0.0, now=now)
    assert client.get(forecast_cycle.STATE_KEY) == checkpoint  # kept in memory: nothing written
    ahead = forecast_cycle._local
    played = ahead.ready.run.k
    forecast_cycle.refresh_cycle_forget()  # the next part on another process: from the checkpoint
    other = refresh_part(client, cpu_s=0.0, now=now)
    assert not other.started and forecast_cycle._local.ready.run.k < played
    assert client.get(forecast_cycle.STATE_KEY) != checkpoint  # it went on from Redis: checkpointed
    forecast_cycle._local = ahead  # back on the first process, whose copy is now behind the token
    parts = list(play_parts(client, now, other_process=False))
    assert not any(p.started for p in parts)
    assert forecast_cycle._local is not ahead
    assert parts[-1].estimates == whole


def test_a_part_without_must_play_plays_no_round_past_its_budget(queue, client):
    now = timezone.now()
    refresh_part(client, cpu_s=0.0, now=now)
    k = forecast_cycle._local.ready.run.k
    # No round played yet: its cost is unknown, so whatever the interval has left none is played.
    assert refresh_part(client, cpu_s=0.0, now=now, must_play=False, limit_s=60.0).rounds == 0
    part = refresh_part(client, cpu_s=0.0, now=now, must_play=False)
    assert not part.done and forecast_cycle._local.ready.run.k == k
    refresh_part(client, cpu_s=0.0, now=now)
    assert forecast_cycle._local.ready.run.k > k
    # What the round interval has left (limit_s) lets its first round pass the part's budget: one round.
    played = len(forecast_cycle._local.ready.run.recent_round_cpu_s)
    assert played < forecast_cycle._local.ready.run.recent_round_cpu_s.maxlen
    part = refresh_part(client, cpu_s=0.0, now=now, must_play=False, limit_s=60.0)
    assert part.rounds >= 1 and len(forecast_cycle._local.ready.run.recent_round_cpu_s) == played + 1


def test_a_part_stores_only_the_estimates_settled_so_far(queue, client):
    now = timezone.now()
    whole = job_forecasts_refresh_estimates(now=now)
    JobForecast.objects.update(detail="before")
    seen: set[int] = set()
    for part in play_parts(client, now, other_process=True):
        assert not seen & part.stored.keys()  # each estimate stored once
        seen |= part.stored.keys()
        changed = {job_id for job_id, row in stored_rows().items() if row[2] != "before"}
        assert changed == seen
        assert all(whole[job_id] == e for job_id, e in part.stored.items())  # final when stored
    assert seen == whole.keys()


def test_a_job_that_ends_while_the_cycle_plays_gets_no_row(queue, client):
    now = timezone.now()
    first = refresh_part(client, cpu_s=0.0, now=now)
    assert first.started and not first.done
    gone = queue[-1]
    Job.objects.filter(pk=gone.pk).update(state=JobState.CANCELLED)
    parts = [first, *play_parts(client, now, other_process=True)]
    assert gone.pk in parts[-1].estimates  # the cycle's forecast read it while it was live
    assert not JobForecast.objects.filter(job=gone).exists()


def test_a_round_committed_while_the_cycle_plays_asks_for_the_next_cycle(queue, client):
    now = timezone.now()
    assert not list(play_parts(client, now, other_process=False))[-1].asked
    first = refresh_part(client, cpu_s=0.0, now=now)
    client.set(forecast_cycle.ASKED_KEY, "job_end")  # what a round's refresh request marks
    parts = [first, *play_parts(client, now, other_process=False)]
    assert parts[-1].done and parts[-1].asked


def test_a_second_task_leaves_a_part_in_progress_alone(queue, client):
    client.set(forecast_cycle.LOCK_KEY, "another process")
    assert refresh_part(client, cpu_s=1.0) is None
    assert not JobForecast.objects.exists()


def test_a_cycle_left_in_another_releases_format_is_started_again(queue, client):
    now = timezone.now()
    refresh_part(client, cpu_s=0.0, now=now)
    client.set(forecast_cycle.STATE_KEY, b"not a pickle")
    forecast_cycle.refresh_cycle_forget()
    part = refresh_part(client, cpu_s=0.0, now=now)
    assert part.started


def test_a_state_not_signed_by_the_service_is_never_unpickled(queue, client, monkeypatch):
    """Whoever can write to Redis cannot make the worker unpickle what they wrote: a valid pickle
    without the service's signature (or under another SECRET_KEY) starts a new cycle."""
    now = timezone.now()
    refresh_part(client, cpu_s=0.0, now=now)
    signed = client.get(forecast_cycle.STATE_KEY)
    unpickled = []
    monkeypatch.setattr(forecast_cycle.pickle, "loads", lambda data: unpickled.append(data))
    for forged in (
        signed[forecast_cycle.SIGNATURE_BYTES :],
        bytes(32) + signed[forecast_cycle.SIGNATURE_BYTES :],
    ):
        client.set(forecast_cycle.STATE_KEY, forged)
        forecast_cycle.refresh_cycle_forget()
        assert forecast_cycle._load(client) == (None, False)
    with override_settings(SECRET_KEY="another-service-key-" + "x" * 40):
        client.set(forecast_cycle.STATE_KEY, signed)
        forecast_cycle.refresh_cycle_forget()
        assert forecast_cycle._load(client) == (None, False)
    assert unpickled == []
    monkeypatch.undo()
    client.set(forecast_cycle.STATE_KEY, signed)  # the service's own state still reads back
    assert forecast_cycle._load(client)[0] is not None


def test_a_part_that_fails_gives_up_its_cycle_and_its_lock(queue, client, monkeypatch):
    now = timezone.now()
    refresh_part(client, cpu_s=0.0, now=now)
    assert client.get(forecast_cycle.TOKEN_KEY) is not None

    def broken(self, stop=None):
        raise RuntimeError("a bug in a round")

    monkeypatch.setattr(ForecastRun, "play", broken)
    with pytest.raises(RuntimeError, match="a bug"):
        refresh_part(client, cpu_s=0.0, now=now)
    assert client.get(forecast_cycle.TOKEN_KEY) is None  # the next part starts from the queue
    assert client.get(forecast_cycle.LOCK_KEY) is None
    monkeypatch.undo()
    assert refresh_part(client, cpu_s=0.0, now=now).started
