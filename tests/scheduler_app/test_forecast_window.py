"""The bounded forecast: the running jobs and the first `forecast_window_jobs` pending ones are played
forward, those behind are told so; the refresh writes only the estimates that changed."""

import pytest
from django.contrib.auth import get_user_model
from django.test import TestCase
from django.utils.html import escape

from scheduler_app.models import AdmissionPrediction, JobForecast
from scheduler_app.services import admission_window, admission_worker, forecast_store, forecasts
from scheduler_app.services.admission_worker import FORECAST_PENDING, admission_forecasts_run
from scheduler_app.services.forecasts import job_forecasts_refresh_estimates
from scheduler_app.services.job_control import job_cancel, job_hold, job_release
from scheduler_app.services.jobs import JobRequest, job_submit
from scheduler_app.services.rounds import scheduling_round_run
from tests.api.helpers import submit, workload

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("fifo_proportional_minute_rounds")]


def window(settings, jobs: int, **more) -> None:
    settings.ATTUNE_SCHEDULER = {**settings.ATTUNE_SCHEDULER, "forecast_window_jobs": jobs, **more}


@pytest.fixture
def queue(user, gpu01_res18):
    """gpu01's 4 GPUs held by a running job; four 4-GPU jobs waiting, one after the other."""
    running = submit(user, gpus=4, iters=1000, name="running")
    waiting = [submit(user, gpus=4, iters=1000 * (n + 1), name=f"w{n}") for n in range(4)]
    scheduling_round_run()
    return running, waiting


def test_the_window_plays_its_jobs_as_the_whole_queue_does_and_tells_those_behind(settings, queue):
    running, waiting = queue
    window(settings, 1000)
    whole = job_forecasts_refresh_estimates()
    window(settings, 2)
    bounded = job_forecasts_refresh_estimates()
    for job in (running, *waiting[:2]):
        assert bounded[job.pk] == whole[job.pk]  # the window's jobs: as if the queue were played whole
        assert whole[job.pk].finish_at is not None
    last_start = whole[waiting[1].pk].start_at
    for job in waiting[2:]:
        estimate = bounded[job.pk]
        assert estimate.start_at is None and estimate.finish_at is None
        assert estimate.detail.startswith("queued behind the 2 jobs the forecast plays forward")
        assert f"{forecasts.timezone.localtime(last_start):%Y-%m-%d %H:%M}" in estimate.detail
        assert whole[job.pk].start_at >= last_start  # what the whole queue says agrees
    stored = JobForecast.objects.get(job=waiting[3])
    assert stored.start_at is None and stored.position == 4 and stored.detail == bounded[waiting[3].pk].detail


@pytest.mark.parametrize("postgresql", [True, False], ids=["postgresql", "portable (the demo's SQLite)"])
def test_a_refresh_writes_only_the_estimates_that_changed(settings, queue, monkeypatch, postgresql):
    if not postgresql:
        monkeypatch.setattr(forecast_store, "is_postgresql", lambda: False)
    running, _ = queue
    now = forecasts.timezone.now()
    estimates = job_forecasts_refresh_estimates(now=now)
    computed = dict(JobForecast.objects.values_list("job_id", "computed_at"))
    assert forecasts.job_forecasts_store(estimates, now=now) == 0  # nothing changed
    assert dict(JobForecast.objects.values_list("job_id", "computed_at")) == computed
    moved = {**estimates, running.pk: forecasts.Estimate(None, None, "moved")}
    assert forecasts.job_forecasts_store(moved, now=now) == 1
    assert JobForecast.objects.get(job=running).detail == "moved"


def test_the_worker_answers_a_job_behind_the_window_without_playing_anything_forward(
    settings, queue, user, live_redis, monkeypatch
):
    window(settings, 10, admission_in_request_max_jobs=0)
    live_redis.delete(admission_worker.QUEUED_KEY, admission_worker.PACE_KEY, admission_worker.SECONDS_KEY)
    monkeypatch.setattr(admission_worker, "task_send", lambda name, **kwargs: None)
    request = JobRequest(name="late", num_gpus=4, total_iters=1000, workload=workload("res18"))
    (job,) = job_submit(owner=user, request=request)  # inside a window of 10: the worker's
    assert AdmissionPrediction.objects.get(job=job).detail == FORECAST_PENDING
    window(settings, 2)
    job_forecasts_refresh_estimates()  # the last refresh: the window's estimates are stored

    def not_here(*args, **kwargs):
        raise AssertionError("a job behind the window was played forward")

    monkeypatch.setattr(forecasts, "ForecastRun", not_here)
    assert admission_forecasts_run() == 1
    prediction = AdmissionPrediction.objects.get(job=job)
    assert prediction.predicted_start_at is None and prediction.attainable is None
    assert prediction.detail.startswith(
        "queued behind the 2 jobs the forecast plays forward (the last of them"
    )
    live_redis.delete(admission_worker.QUEUED_KEY, admission_worker.PACE_KEY, admission_worker.SECONDS_KEY)


@pytest.fixture
def worker_asked(settings, live_redis, monkeypatch):
    """A service with a worker, a deep queue's settings; the admission forecasts asked of it."""
    window(settings, 2, admission_in_request_max_jobs=0)
    settings.ATTUNE_SCHEDULER = {**settings.ATTUNE_SCHEDULER, "inline_rounds": False}
    live_redis.delete(admission_worker.QUEUED_KEY, admission_worker.PACE_KEY, admission_worker.SECONDS_KEY)
    asked = []
    monkeypatch.setattr(admission_worker, "task_send", lambda name, **kwargs: asked.append(name))
    admission_window.window_last_start_forget()
    yield asked
    admission_window.window_last_start_forget()
    live_redis.delete(admission_worker.QUEUED_KEY, admission_worker.PACE_KEY, admission_worker.SECONDS_KEY)


def submit_late(user, **more):
    request = JobRequest(name="late", num_gpus=4, total_iters=1000, workload=workload("res18"), **more)
    with TestCase.captureOnCommitCallbacks(execute=True):
        return job_submit(owner=user, request=request)


def test_a_submission_behind_the_window_is_answered_in_its_request_as_the_worker_would(
    queue, user, worker_asked, monkeypatch
):
    estimates = job_forecasts_refresh_estimates()  # the last refresh: the window's estimates are stored
    (job,) = submit_late(user)
    assert worker_asked == []  # nothing asked of the worker, nothing to wait for
    prediction = AdmissionPrediction.objects.get(job=job)
    assert prediction.detail != FORECAST_PENDING and admission_worker.admission_pending(job) is False
    assert prediction.predicted_start_at is None and prediction.attainable is None
    last_start = max(e.start_at for e in estimates.values() if e.start_at is not None)
    stored = JobForecast.objects.get(job=job)
    assert stored.detail == prediction.detail and stored.start_at is None and stored.position is None
    # What the worker's forecast says of the same job, word for word.
    prediction.detail = FORECAST_PENDING
    prediction.save()
    monkeypatch.setattr(forecasts, "ForecastRun", lambda *a, **k: pytest.fail("played forward"))
    assert admission_forecasts_run() == 1
    assert AdmissionPrediction.objects.get(job=job).detail == stored.detail
    assert f"{forecasts.timezone.localtime(last_start):%Y-%m-%d %H:%M}" in stored.detail


def test_an_array_behind_the_window_is_answered_task_by_task_in_its_request(queue, user, worker_asked):
    job_forecasts_refresh_estimates()
    jobs = submit_late(user, array="0-2")
    assert worker_asked == []
    details = set(AdmissionPrediction.objects.filter(job__in=jobs).values_list("detail", flat=True))
    assert len(details) == 1 and details.pop().startswith("queued behind the 2 jobs")


@pytest.mark.parametrize(
    "case", ["inside the window", "held", "a dependency to wait for", "ahead by priority"]
)
def test_a_submission_that_may_be_inside_the_window_is_the_workers(settings, queue, user, worker_asked, case):
    _, waiting = queue
    more: dict = {}
    owner = user
    if case == "inside the window":
        window(settings, 10)
    elif case == "held":
        more["hold"] = True
    elif case == "a dependency to wait for":
        more["depends_on"] = (waiting[0].pk,)
    else:  # one job ahead of it: the others come after a higher priority
        owner = get_user_model().objects.create_user("boss", is_staff=True)
        more["priority"] = 10
        waiting[0].priority = 20
        waiting[0].save(update_fields=["priority"])
    (job,) = submit_late(owner, **more)
    assert AdmissionPrediction.objects.get(job=job).detail == FORECAST_PENDING
    assert worker_asked and admission_worker.admission_pending(job)


@pytest.mark.parametrize("postgresql", [True, False], ids=["postgresql", "portable (the ORM's)"])
def test_jobs_that_the_forecast_leaves_out_are_not_counted_ahead(
    queue, user, worker_asked, live_redis, monkeypatch, postgresql
):
    """Ahead of a new job: two held, one cancelled, one after the cancelled one (never starts), one the
    forecast orders; in a window of 2 it is inside, so the worker's."""
    if not postgresql:
        monkeypatch.setattr(admission_window, "is_postgresql", lambda: False)
    _, waiting = queue
    after = submit_late(user, depends_on=(waiting[0].pk,))[0]
    worker_asked.clear()
    live_redis.delete(admission_worker.QUEUED_KEY, admission_worker.PACE_KEY)
    for job in waiting[1:3]:
        job_hold(job=job, by=user)
    job_cancel(job=waiting[0], by=user)
    assert admission_window.pending_ahead_at_least(after, 1)  # waiting[3]
    assert not admission_window.pending_ahead_at_least(after, 2)
    (job,) = submit_late(user)
    assert not admission_window.pending_ahead_at_least(job, 2)  # `after` never starts: not in the window
    assert AdmissionPrediction.objects.get(job=job).detail == FORECAST_PENDING
    assert worker_asked


def test_the_job_page_says_a_pending_forecast_is_coming_and_its_target_not_known_yet(
    settings, user, gpu01_res18, client, live_redis, monkeypatch
):
    window(settings, 1000, admission_in_request_max_jobs=0)
    live_redis.delete(admission_worker.QUEUED_KEY, admission_worker.PACE_KEY, admission_worker.SECONDS_KEY)
    monkeypatch.setattr(admission_worker, "task_send", lambda name, **kwargs: None)
    request = JobRequest(
        name="qos", num_gpus=1, total_iters=1000, workload=workload("res18"), qos_max_latency_s=3600
    )
    (job,) = job_submit(owner=user, request=request)
    client.force_login(user)
    html = client.get(f"/jobs/{job.pk}/").content.decode()
    assert escape(FORECAST_PENDING) in html
    assert '<dd id="qos-attainable">not known' in html
    admission_forecasts_run()
    html = client.get(f"/jobs/{job.pk}/").content.decode()
    assert (
        escape(FORECAST_PENDING) not in html and '<dd id="qos-attainable"><span class="ok">attainable' in html
    )
    live_redis.delete(admission_worker.QUEUED_KEY, admission_worker.PACE_KEY, admission_worker.SECONDS_KEY)


def test_a_held_job_released_behind_the_window_is_answered_over_its_stored_estimate(
    queue, user, worker_asked
):
    """Submitted held, its estimate stored by a refresh; released behind the window, it is told so in
    the release's request, its stored estimate replaced and its queue position kept."""
    (job,) = submit_late(user, hold=True)
    admission_forecasts_run()  # the worker's answer: held
    assert AdmissionPrediction.objects.get(job=job).detail == forecasts.HELD
    job_forecasts_refresh_estimates()
    stored = JobForecast.objects.get(job=job)
    assert stored.detail == forecasts.HELD and stored.position is not None
    worker_asked.clear()
    job_release(job=job, by=user)
    prediction = AdmissionPrediction.objects.get(job=job)
    assert prediction.detail.startswith("queued behind the 2 jobs the forecast plays forward")
    after = JobForecast.objects.get(job=job)
    assert after.detail == prediction.detail and after.position == stored.position
    assert worker_asked == []
