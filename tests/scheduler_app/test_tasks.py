"""Celery tasks, the beat schedule and the debounced early round."""

from types import SimpleNamespace

import pytest
from django.conf import settings as django_settings

from scheduler_app import tasks
from scheduler_app.models import JobState, SchedulingRound
from scheduler_app.services import round_requests, rounds
from scheduler_app.services.jobs import JobRequest, job_submit
from scheduler_app.task_names import SCHEDULING_ROUND_TASK
from tests.api.helpers import make_server, workload
from tests.fake_redis import FakeRedis

pytestmark = pytest.mark.django_db


def test_the_beat_schedule_runs_rounds_sweeps_and_rollups():
    schedule = django_settings.CELERY_BEAT_SCHEDULE
    tasks_by_name = {entry["task"] for entry in schedule.values()}
    assert tasks_by_name == {
        "scheduler_app.tasks.scheduling_round_task",
        "scheduler_app.tasks.node_liveness_sweep_task",
        "scheduler_app.tasks.agent_reports_apply_task",
        "scheduler_app.tasks.usage_rollup_task",
    }
    assert schedule["scheduling-round"]["schedule"] == float(django_settings.ATTUNE_SCHEDULER["round_s"])
    assert schedule["node-liveness-sweep"]["schedule"] <= 10
    # Stored progress is applied within seconds, and a run queued behind a busy worker expires.
    apply = schedule["agent-reports-apply"]
    assert 0 < apply["schedule"] <= 10 and apply["options"]["expires"] == apply["schedule"]


def test_tasks_call_their_services(user, settings):
    settings.ATTUNE_SCHEDULER = {**settings.ATTUNE_SCHEDULER, "inline_rounds": True}
    make_server("gpu01")
    round_id = tasks.scheduling_round_task.apply(kwargs={"trigger": "beat"}).get()
    assert SchedulingRound.objects.get(pk=round_id).trigger == "beat"
    assert tasks.node_liveness_sweep_task.apply().get() == {"not_responding": [], "down": [], "timed_out": []}
    assert tasks.agent_reports_apply_task.apply().get() == 0
    assert tasks.usage_rollup_task.apply().get() == {
        "usage_rows_removed": 0,
        "agent_reports_removed": 0,
        "round_decisions_removed": 0,
        "idempotency_keys_removed": 0,
    }


def test_inline_mode_runs_the_early_round_after_commit(user, settings, django_capture_on_commit_callbacks):
    settings.ATTUNE_SCHEDULER = {**settings.ATTUNE_SCHEDULER, "inline_rounds": True}
    make_server("gpu01")
    with django_capture_on_commit_callbacks(execute=True):
        (job,) = job_submit(
            owner=user, request=JobRequest(name="a", num_gpus=1, total_iters=10, workload=workload())
        )
    job.refresh_from_db()
    assert job.state == JobState.RUNNING
    assert SchedulingRound.objects.get().trigger == "submit"


@pytest.fixture
def fake_redis(settings, monkeypatch) -> FakeRedis:
    """Early rounds through Celery (not inline), 2 s after their request and paced at 2x the last
    round's duration, on a fake Redis."""
    settings.ATTUNE_SCHEDULER = {
        **settings.ATTUNE_SCHEDULER,
        "inline_rounds": False,
        "early_round_delay_s": 2,
        "round_pacing": 2,
    }
    settings.CELERY_TASK_ALWAYS_EAGER = False
    fake = FakeRedis()
    monkeypatch.setattr(round_requests, "_redis", lambda url: fake)
    return fake


@pytest.fixture
def queued_rounds(fake_redis, monkeypatch) -> list[dict]:
    """With fake_redis: returns the list that the round tasks sent (by name) go to."""
    return _sends_captured(monkeypatch)


def _sends_captured(monkeypatch) -> list[dict]:
    queued = []

    def send(name, *, kwargs, countdown_s):
        assert name == SCHEDULING_ROUND_TASK == tasks.scheduling_round_task.name
        queued.append({"kwargs": kwargs, "countdown": countdown_s})

    monkeypatch.setattr(round_requests, "task_send", send)
    return queued


def test_a_burst_of_requests_queues_one_delayed_round(queued_rounds, monkeypatch):
    queued = queued_rounds
    for _ in range(5):
        round_requests.scheduling_round_request(trigger="submit")
    assert queued == [{"kwargs": {"trigger": "submit"}, "countdown": 2.0}]

    # The task clears the key as it starts; the next request queues the next round.
    monkeypatch.setattr(tasks, "scheduling_round_run", lambda *, trigger: SimpleNamespace(pk=1))
    tasks.scheduling_round_task(trigger="submit")
    round_requests.scheduling_round_request(trigger="job_end")
    assert len(queued) == 2 and queued[1]["kwargs"] == {"trigger": "job_end"}


def test_an_early_round_skipped_by_a_running_round_asks_again(queued_rounds, monkeypatch):
    """Another worker's round held the lock, and may have read the queue before the change that asked
    for this round: the request is queued again, not left to the next beat round."""
    queued = queued_rounds
    monkeypatch.setattr(tasks, "scheduling_round_run", lambda *, trigger: None)  # the lock is taken

    assert tasks.scheduling_round_task(trigger="job_end") is None
    assert queued == [{"kwargs": {"trigger": "job_end"}, "countdown": 2.0}]
    tasks.scheduling_round_task(trigger="beat")  # a beat round comes again anyway
    assert len(queued) == 1


def test_an_early_round_waits_for_the_last_rounds_pace(fake_redis, queued_rounds):
    """A long round (a large cluster under churn) holds the next early round for twice its duration
    after its end; a short one leaves it to the usual 2 s debounce."""
    round_requests.scheduling_round_pace(3.0)
    round_requests.scheduling_round_request(trigger="job_end")
    assert queued_rounds == [{"kwargs": {"trigger": "job_end"}, "countdown": 6.0}]

    fake_redis.delete(round_requests.EARLY_ROUND_KEY)
    fake_redis.now += 10.0
    round_requests.scheduling_round_pace(0.05)
    round_requests.scheduling_round_request(trigger="job_end")
    assert queued_rounds[1] == {"kwargs": {"trigger": "job_end"}, "countdown": 2.0}


def test_an_early_round_asked_for_during_a_round_is_put_off_until_that_rounds_pace_ends(
    fake_redis, queued_rounds, monkeypatch
):
    ran = []
    monkeypatch.setattr(tasks, "scheduling_round_run", lambda *, trigger: ran.append(trigger))
    # Asked for while a round ran (no pace yet): queued 2 s later. That round then ends after 4 s.
    round_requests.scheduling_round_request(trigger="job_end")
    round_requests.scheduling_round_pace(4.0)
    fake_redis.now += 2.0

    assert tasks.scheduling_round_task(trigger="job_end") is None
    assert ran == []
    assert queued_rounds[1] == {"kwargs": {"trigger": "job_end"}, "countdown": 6.0}
    round_requests.scheduling_round_request(trigger="submit")  # still debounced by the put-off round
    assert len(queued_rounds) == 2

    fake_redis.now += 6.0
    tasks.scheduling_round_task(trigger="job_end")
    assert ran == ["job_end"]
    round_requests.scheduling_round_request(trigger="submit")  # it started: the next request queues another
    assert len(queued_rounds) == 3


def test_a_round_paces_the_next_early_round_after_its_commit(
    fake_redis, monkeypatch, django_capture_on_commit_callbacks
):
    monkeypatch.setattr(rounds, "job_forecasts_refresh_request_on_commit", lambda *, trigger: None)
    make_server("gpu01")
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        sround = rounds.scheduling_round_run(trigger="job_end")
    assert fake_redis.pttl(round_requests.ROUND_PACE_KEY) == -2  # not before the commit
    for callback in callbacks:
        callback()
    assert fake_redis.pttl(round_requests.ROUND_PACE_KEY) == pytest.approx(2 * sround.duration_ms, abs=2)


def test_inline_rounds_are_not_paced(settings, monkeypatch):
    settings.ATTUNE_SCHEDULER = {**settings.ATTUNE_SCHEDULER, "inline_rounds": True}
    monkeypatch.setattr(round_requests, "_redis", lambda url: pytest.fail("the embedded mode has no Redis"))
    round_requests.scheduling_round_pace(3.0)
    assert tasks.scheduling_round_task.apply(kwargs={"trigger": "job_end"}).get() is not None


def test_a_broker_outage_does_not_fail_the_request(settings, monkeypatch):
    settings.ATTUNE_SCHEDULER = {**settings.ATTUNE_SCHEDULER, "inline_rounds": False}
    settings.CELERY_TASK_ALWAYS_EAGER = False

    class Down:
        def pttl(self, *args, **kwargs):
            raise ConnectionError("redis is down")

        set = pttl

    monkeypatch.setattr(round_requests, "_redis", lambda url: Down())
    round_requests.scheduling_round_request(trigger="submit")  # logs a warning, raises nothing


def test_the_debounce_uses_a_real_redis_set_nx(settings, monkeypatch, live_redis):
    settings.ATTUNE_SCHEDULER = {**settings.ATTUNE_SCHEDULER, "inline_rounds": False}
    settings.CELERY_TASK_ALWAYS_EAGER = False
    client = live_redis
    client.delete(round_requests.EARLY_ROUND_KEY)
    queued = _sends_captured(monkeypatch)
    try:
        round_requests.scheduling_round_request(trigger="submit")
        round_requests.scheduling_round_request(trigger="submit")
        assert len(queued) == 1
        # A lost task cannot block early rounds for long.
        assert 0 < client.ttl(round_requests.EARLY_ROUND_KEY) <= 62
        round_requests.scheduling_round_request_clear()
        round_requests.scheduling_round_request(trigger="job_end")
        assert len(queued) == 2
    finally:
        client.delete(round_requests.EARLY_ROUND_KEY)


def test_inline_rounds_re_decide_skipped_jobs_once_not_in_a_chain(settings, monkeypatch):
    """Embedded mode: a round that skipped jobs runs the next one inline after its commit; if that one
    skips again (jobs still changing), it does not start a third inside the second, and so on."""
    settings.ATTUNE_SCHEDULER = {**settings.ATTUNE_SCHEDULER, "inline_rounds": True}
    triggers = []

    def round_that_always_skips(*, trigger):
        triggers.append(trigger)
        round_requests.scheduling_round_request(trigger="skipped")  # as its on_commit would
        return None

    monkeypatch.setattr(round_requests, "_inline_round_run", round_that_always_skips)
    round_requests.scheduling_round_request(trigger="job_end")
    assert triggers == ["job_end", "skipped"]
    round_requests.scheduling_round_request(trigger="skipped")  # the flag was reset: a later skip runs again
    assert triggers == ["job_end", "skipped", "skipped"]
