"""The forecast refresh after rounds: a debounced task on the `forecasts` queue, not part of the round."""

import time

import pytest
from celery import current_app

from scheduler_app import tasks
from scheduler_app.models import JobForecast
from scheduler_app.services import forecast_cycle, forecast_refresh, forecasts
from scheduler_app.services.rounds import scheduling_round_run
from tests.api.helpers import make_server, submit, workload
from tests.fake_redis import FakeRedis

pytestmark = pytest.mark.django_db

INTERVAL_S = 10.0


@pytest.fixture
def worker_mode(settings, monkeypatch):
    """Rounds and forecasts on Celery workers (not inline), a fake Redis and a recorded broker."""
    settings.ATTUNE_SCHEDULER = {
        **settings.ATTUNE_SCHEDULER,
        "policy": "fifo",
        "allocator": "tune",
        "inline_rounds": False,
        "forecast_refresh_min_interval_s": INTERVAL_S,
    }
    settings.CELERY_TASK_ALWAYS_EAGER = False
    fake = FakeRedis()
    monkeypatch.setattr(forecast_refresh, "_redis", lambda url: fake)
    monkeypatch.setattr(
        "scheduler_app.services.round_requests.scheduling_round_request", lambda *, trigger: None
    )
    sent: list[dict] = []
    monkeypatch.setattr(
        current_app, "send_task", lambda name, **options: sent.append({"name": name, **options})
    )
    return fake, sent


@pytest.fixture
def queue(user):
    """One 4-GPU server and six 1-GPU jobs: four run after a round, two wait."""
    make_server("gpu01", gpus=4)
    workload("res18")
    return [submit(user, name=f"j{i}") for i in range(6)]


def test_rounds_queue_one_debounced_refresh_instead_of_forecasting_inline(
    worker_mode, queue, monkeypatch, django_capture_on_commit_callbacks
):
    fake, sent = worker_mode

    def not_here(**kwargs):
        raise AssertionError("a round forecast the queue itself")

    monkeypatch.setattr(forecasts, "job_forecasts_refresh_estimates", not_here)
    monkeypatch.setattr(forecast_refresh, "job_forecasts_refresh_estimates", not_here)
    monkeypatch.setattr(forecast_refresh, "refresh_part", not_here)

    # A burst of rounds (the early rounds after a burst of submissions): one refresh queued, at once.
    for _ in range(5):
        with django_capture_on_commit_callbacks(execute=True):
            assert scheduling_round_run(trigger="submit") is not None
    assert [(s["name"], s["countdown"]) for s in sent] == [(forecast_refresh.REFRESH_TASK, 0.0)]
    assert not JobForecast.objects.exists()

    # The refresh starts (on the forecasts worker); rounds committed meanwhile queue the next one, when
    # the interval since that start is over, and only one.
    forecast_refresh.job_forecasts_refresh_started()
    fake.now += 3.0
    for _ in range(3):
        with django_capture_on_commit_callbacks(execute=True):
            scheduling_round_run(trigger="job_end")
    assert len(sent) == 2
    assert sent[1]["countdown"] == pytest.approx(INTERVAL_S - 3.0, abs=0.01)
    assert sent[1]["expires"] > sent[1]["countdown"]  # a message that waited too long is dropped


def test_a_rolled_back_round_queues_no_refresh(
    worker_mode, queue, monkeypatch, django_capture_on_commit_callbacks
):
    _, sent = worker_mode

    def fail(trigger):
        raise RuntimeError("the round failed")

    monkeypatch.setattr("scheduler_app.services.rounds._round", fail)
    with django_capture_on_commit_callbacks(execute=True), pytest.raises(RuntimeError):
        scheduling_round_run()
    assert sent == []


def test_the_refresh_task_refreshes_and_lets_the_next_round_queue_another(
    worker_mode, queue, django_capture_on_commit_callbacks
):
    fake, sent = worker_mode
    with django_capture_on_commit_callbacks(execute=True):
        scheduling_round_run()
    assert len(sent) == 1 and fake.pttl(forecast_refresh.QUEUED_KEY) > 0

    stored = tasks.forecast_refresh_task.apply().get()

    assert stored == 6
    rows = {f.job_id: f for f in JobForecast.objects.all()}
    assert set(rows) == {j.pk for j in queue}
    waiting = [rows[j.pk] for j in queue[4:]]
    assert all(f.start_at is not None and f.finish_at is not None for f in waiting)
    assert sorted(f.position for f in waiting) == [1, 2]
    # It cleared the queued key as it started and marked its start for the interval.
    assert fake.pttl(forecast_refresh.QUEUED_KEY) == -2
    assert 0 < fake.pttl(forecast_refresh.LAST_START_KEY) <= INTERVAL_S * 1000


@pytest.fixture
def refresh_taking(worker_mode, monkeypatch):
    """The refresh task with a refresh (one part that ends its cycle) that takes `seconds` on a clock
    the test owns; returns a function that runs the task that way and the list of refreshes done."""
    fake, _ = worker_mode
    clock = [0.0]
    done = []
    monkeypatch.setattr(forecast_refresh.time, "perf_counter", lambda: clock[0])

    monkeypatch.setattr(forecast_refresh.time, "time", lambda: fake.now)  # the round intervals' clock

    def run(
        seconds: float,
        *,
        cycle_done: bool = True,
        started: bool = True,
        asked: bool = False,
        part_cpu_s: float = 0.1,
        budgets: list | None = None,
    ) -> int:
        def part(client, *, cpu_s: float, must_play: bool = True, limit_s: float | None = None):
            if budgets is not None:
                budgets.append((cpu_s, must_play, limit_s))
            clock[0] += seconds
            fake.now += seconds
            done.append(seconds)
            if cycle_done:  # as refresh_part keeps the cycle in progress: its token
                fake.delete(forecast_cycle.TOKEN_KEY)
            else:
                fake.set(forecast_cycle.TOKEN_KEY, "cycle:part")
            stored = dict.fromkeys((1, 2, 3))  # three estimates
            estimates = stored if cycle_done else None
            return forecast_cycle.Part(stored, estimates, cycle_done, asked, part_cpu_s, started, rounds=1)

        monkeypatch.setattr(forecast_refresh, "refresh_part", part)
        return tasks.forecast_refresh_task.apply().get()

    return run, done


def test_a_long_refresh_spaces_out_the_next_one(worker_mode, refresh_taking):
    """A refresh slowed by a loaded host is followed by one at most 4x its duration later (the
    pacing), not by one at the minimum interval after its start."""
    fake, sent = worker_mode
    run, _ = refresh_taking
    assert run(5.0) == 3
    assert fake.pttl(forecast_refresh.LAST_START_KEY) == 20_000
    forecast_refresh.job_forecasts_refresh_request(trigger="job_end")
    assert sent[-1]["countdown"] == pytest.approx(20.0)

    # A short one keeps the minimum interval since its start.
    fake.now += 20.0
    fake.delete(forecast_refresh.QUEUED_KEY)
    assert run(1.0) == 3
    assert fake.pttl(forecast_refresh.LAST_START_KEY) == (INTERVAL_S - 1.0) * 1000


def test_a_part_that_leaves_its_cycle_unfinished_queues_the_next_part_at_its_pace(
    worker_mode, refresh_taking
):
    """The parts of one forecast follow each other at their pace (4 x the last one's duration), not at
    the minimum interval, which spaces out the cycles' starts (their reads of the queue)."""
    fake, sent = worker_mode
    run, done = refresh_taking
    assert run(1.0, cycle_done=False) == 3  # the cycle's first part: the minimum interval holds
    assert fake.pttl(forecast_refresh.LAST_START_KEY) == (INTERVAL_S - 1.0) * 1000
    assert [(s["name"], s["countdown"]) for s in sent] == [(forecast_refresh.REFRESH_TASK, INTERVAL_S - 1.0)]
    fake.now += INTERVAL_S - 1.0
    assert run(1.5, cycle_done=False, started=False) == 3  # a part that went on: its pace alone
    assert fake.pttl(forecast_refresh.LAST_START_KEY) == 6_000
    assert sent[-1]["countdown"] == pytest.approx(6.0)
    fake.now += 6.0
    assert run(0.5, started=False) == 3  # the last part: nothing asked meanwhile, nothing queued
    assert len(sent) == 2 and done == [1.0, 1.5, 0.5]


def test_a_cycle_that_ends_after_a_round_asked_queues_the_next_cycle(worker_mode, refresh_taking):
    _, sent = worker_mode
    run, _ = refresh_taking
    assert run(0.5, started=False, asked=True) == 3
    assert [(s["name"], s["countdown"]) for s in sent] == [(forecast_refresh.REFRESH_TASK, 2.0)]


def test_a_refresh_queued_during_a_long_one_is_put_off_until_its_pace_ends(worker_mode, refresh_taking):
    fake, sent = worker_mode
    run, done = refresh_taking
    forecast_refresh.job_forecasts_refresh_started()  # a refresh starts ...
    fake.now += 3.0
    forecast_refresh.job_forecasts_refresh_request(trigger="job_end")  # ... a round asks meanwhile ...
    assert sent[-1]["countdown"] == pytest.approx(INTERVAL_S - 3.0)
    fake.now += 5.0
    forecast_refresh._pace(8.0)  # ... and it ends after 8 s: the next one waits 32 s from now
    fake.now += INTERVAL_S - 8.0  # the queued task's countdown is over

    assert run(1.0) == 0
    assert done == []
    assert sent[-1]["countdown"] == pytest.approx(32.0 - 2.0)
    assert fake.pttl(forecast_refresh.QUEUED_KEY) > 0  # requests meanwhile still find it queued
    forecast_refresh.job_forecasts_refresh_request(trigger="job_end")
    assert len(sent) == 2

    fake.now += 30.0
    assert run(1.0) == 3
    assert done == [1.0]


def test_the_parts_spend_at_most_the_cpu_per_round_and_go_on_in_the_next_interval(
    settings, worker_mode, refresh_taking
):
    """1 s of CPU per 60 s round interval: parts of 0.45 s each, two fit an interval; the next is
    queued for the next interval, where a part has its whole budget again."""
    fake, sent = worker_mode
    settings.ATTUNE_SCHEDULER = {**settings.ATTUNE_SCHEDULER, "round_s": 60.0, "forecast_refresh_pacing": 0}
    run, _ = refresh_taking
    fake.now = 6000.0  # an interval's start (windows on the clock: k x 60 s)
    budgets: list = []
    assert run(1.0, cycle_done=False, part_cpu_s=0.45, budgets=budgets) == 3
    fake.now += INTERVAL_S - 1.0  # the minimum interval since the cycle's start
    assert run(1.0, cycle_done=False, started=False, part_cpu_s=0.45, budgets=budgets) == 3
    # The interval's first part must play a round; the next plays those that fit the 0.55 s left less
    # half a part's budget (a round may cost more than the last ones did).
    assert budgets == [(0.4, True, 1.0), (pytest.approx(0.35), False, pytest.approx(0.35))]
    # 0.9 s spent at 6011: the next part waits for 6060.
    assert sent[-1]["countdown"] == pytest.approx(60.0 - 11.0)
    fake.delete(forecast_refresh.QUEUED_KEY)
    assert run(1.0, cycle_done=False, started=False, budgets=budgets) == 0  # queued early: put off
    assert sent[-1]["countdown"] == pytest.approx(60.0 - 11.0)
    assert len(budgets) == 2
    fake.now = 6060.0
    assert run(1.0, started=False, budgets=budgets) == 3
    assert budgets[-1] == (0.4, True, 1.0)


def test_a_part_that_finds_less_than_its_budget_left_plays_only_what_is_left(worker_mode, refresh_taking):
    fake, _ = worker_mode
    run, _ = refresh_taking
    fake.now = 6000.0
    fake.set(forecast_refresh.CPU_WINDOW_KEY, "100:0.45")  # 0.45 s spent in this interval (6000 / 60)
    fake.set(forecast_cycle.TOKEN_KEY, "cycle:part")  # a cycle in progress
    budgets: list = []
    assert run(0.5, started=False, budgets=budgets) == 3
    assert budgets == [(pytest.approx(0.35), False, pytest.approx(0.35))]  # no round past 0.55 - 0.2
    fake.set(forecast_refresh.CPU_WINDOW_KEY, "100:0.65")  # 0.35 left, 0.15 past the reserve: none
    assert run(0.5, started=False, budgets=budgets) == 0
    assert len(budgets) == 1


def test_a_cycle_starts_where_what_the_last_start_cost_fits_what_is_left(worker_mode, refresh_taking):
    """A part that starts a cycle reads the live queue whatever its budget: 0.45 s left less the
    reserve (0.2) holds a start that cost 0.1 s, not one that cost 0.3 s."""
    fake, sent = worker_mode
    run, _ = refresh_taking
    fake.now = 6000.0
    budgets: list = []
    fake.set(forecast_refresh.START_CPU_KEY, "0.3")
    fake.set(forecast_refresh.CPU_WINDOW_KEY, "100:0.55")
    assert run(0.5, cycle_done=False, budgets=budgets) == 0
    assert budgets == [] and sent[-1]["countdown"] == pytest.approx(60.0)  # the next interval
    fake.delete(forecast_refresh.QUEUED_KEY)
    fake.delete(forecast_refresh.LAST_START_KEY)  # (that wait's pace)
    fake.set(forecast_refresh.START_CPU_KEY, "0.1")
    assert run(0.5, cycle_done=False, part_cpu_s=0.12, budgets=budgets) == 3
    assert budgets == [(pytest.approx(0.25), False, pytest.approx(0.25))]
    assert float(fake.get(forecast_refresh.START_CPU_KEY)) == pytest.approx(0.12)  # this start's


def test_a_part_that_played_no_round_leaves_the_rest_of_the_interval(worker_mode, monkeypatch):
    """Its budget was less than the next round's predicted cost: trying again on what is left would
    not play one either, so the next part waits for the next interval."""
    fake, sent = worker_mode
    monkeypatch.setattr(forecast_refresh.time, "time", lambda: fake.now)
    fake.now = 6000.0
    fake.set(forecast_refresh.CPU_WINDOW_KEY, "100:0.3")  # 0.7 s left
    fake.set(forecast_cycle.TOKEN_KEY, "cycle:part")
    budgets: list = []

    def no_round(client, *, cpu_s, must_play=True, limit_s=None):
        budgets.append((cpu_s, must_play))
        fake.now += 0.5
        return forecast_cycle.Part({}, None, False, False, 0.01, False, rounds=0)

    monkeypatch.setattr(forecast_refresh, "refresh_part", no_round)
    assert tasks.forecast_refresh_task.apply().get() == 0
    assert budgets == [(0.4, False)]
    assert sent[-1]["countdown"] == pytest.approx(60.0 - 0.5)


def test_no_cpu_per_round_bound_when_it_is_0(settings, worker_mode, refresh_taking):
    fake, _ = worker_mode
    settings.ATTUNE_SCHEDULER = {
        **settings.ATTUNE_SCHEDULER,
        "forecast_refresh_cpu_per_round_s": 0.0,
        "forecast_refresh_pacing": 0,
    }
    run, _ = refresh_taking
    budgets: list = []
    fake.now = 6000.0
    for _ in range(4):
        fake.now += INTERVAL_S
        assert run(1.0, cycle_done=False, started=False, part_cpu_s=0.9, budgets=budgets) == 3
    assert budgets == [(0.4, True, 0.4)] * 4
    assert fake.get(forecast_refresh.CPU_WINDOW_KEY) is None


def test_forecasts_still_refresh_after_each_round_in_the_embedded_mode(
    settings, queue, monkeypatch, django_capture_on_commit_callbacks
):
    """No worker (the demo, eager Celery): the round's commit refreshes the forecasts in the process."""
    settings.ATTUNE_SCHEDULER = {**settings.ATTUNE_SCHEDULER, "inline_rounds": True}
    monkeypatch.setattr(current_app, "send_task", lambda *a, **k: pytest.fail("nothing goes to a broker"))
    with django_capture_on_commit_callbacks(execute=True):
        scheduling_round_run()
    assert JobForecast.objects.filter(job__in=queue).count() == 6


def test_a_broker_outage_does_not_fail_the_round(
    worker_mode, queue, monkeypatch, django_capture_on_commit_callbacks
):
    class Down:
        def pttl(self, key):
            raise ConnectionError("redis is down")

    monkeypatch.setattr(forecast_refresh, "_redis", lambda url: Down())
    with django_capture_on_commit_callbacks(execute=True):
        assert scheduling_round_run() is not None  # logs a warning; the next round asks again


def test_forecast_tasks_go_to_the_forecasts_queue_and_rounds_stay_on_the_default_one():
    def queue_of(name: str) -> str:
        return current_app.amqp.router.route({}, name)["queue"].name

    for name in (
        forecast_refresh.REFRESH_TASK,
        tasks.admission_forecast_task.name,
        tasks.simulation_run_task.name,
    ):
        assert queue_of(name) == "forecasts", name
    default = current_app.conf.task_default_queue
    for name in (
        tasks.scheduling_round_task.name,
        tasks.node_liveness_sweep_task.name,
        tasks.workload_profile_task.name,
    ):
        assert queue_of(name) == default, name
    assert tasks.forecast_refresh_task.name == forecast_refresh.REFRESH_TASK


def test_the_debounce_uses_real_redis_keys(settings, monkeypatch, live_redis):
    settings.ATTUNE_SCHEDULER = {
        **settings.ATTUNE_SCHEDULER,
        "inline_rounds": False,
        "forecast_refresh_min_interval_s": INTERVAL_S,
    }
    settings.CELERY_TASK_ALWAYS_EAGER = False
    client = live_redis
    keys = (forecast_refresh.QUEUED_KEY, forecast_refresh.LAST_START_KEY, forecast_refresh.ASKED_KEY)
    client.delete(*keys)
    sent: list[dict] = []
    monkeypatch.setattr(current_app, "send_task", lambda name, **options: sent.append(options))
    try:
        forecast_refresh.job_forecasts_refresh_request(trigger="beat")
        forecast_refresh.job_forecasts_refresh_request(trigger="beat")
        assert [s["countdown"] for s in sent] == [0.0]
        # A lost task cannot block refreshes for long.
        assert 0 < client.ttl(forecast_refresh.QUEUED_KEY) <= forecast_refresh.QUEUED_SLACK_S + 1
        forecast_refresh.job_forecasts_refresh_started()
        time.sleep(0.05)
        forecast_refresh.job_forecasts_refresh_request(trigger="submit")
        assert len(sent) == 2 and INTERVAL_S - 1 < sent[1]["countdown"] < INTERVAL_S
    finally:
        client.delete(*keys)


def test_the_cpu_per_round_setting_defaults_to_1_s_and_is_read_from_the_settings(settings):
    from scheduler_app.conf import scheduler_conf

    assert (
        settings.ATTUNE_SCHEDULER["forecast_refresh_cpu_per_round_s"] == 1.0
    )  # config/settings.py's default
    assert scheduler_conf().forecast_refresh_cpu_per_round_s == 1.0
    settings.ATTUNE_SCHEDULER = {**settings.ATTUNE_SCHEDULER, "forecast_refresh_cpu_per_round_s": 2.5}
    assert scheduler_conf().forecast_refresh_cpu_per_round_s == 2.5
