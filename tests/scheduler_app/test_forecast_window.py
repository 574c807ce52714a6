"""The bounded forecast: the running jobs and the first `forecast_window_jobs` pending ones are played
forward, those behind are told so; the refresh writes only the estimates that changed."""

import pytest
from django.utils.html import escape

from scheduler_app.models import AdmissionPrediction, JobForecast
from scheduler_app.services import admission, forecasts
from scheduler_app.services.admission import FORECAST_PENDING, admission_forecasts_run
from scheduler_app.services.forecasts import job_forecasts_refresh_estimates
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
        monkeypatch.setattr(forecasts, "is_postgresql", lambda: False)
    running, _ = queue
    now = forecasts.timezone.now()
    estimates = job_forecasts_refresh_estimates(now=now)
    computed = dict(JobForecast.objects.values_list("job_id", "computed_at"))
    assert forecasts.job_forecasts_store(estimates, now=now) == 0  # nothing changed
    assert dict(JobForecast.objects.values_list("job_id", "computed_at")) == computed
    moved = {**estimates, running.pk: forecasts.Estimate(None, None, "moved")}
    assert forecasts.job_forecasts_store(moved, now=now) == 1
    assert JobForecast.objects.get(job=running).detail == "moved"


def test_a_submission_behind_the_window_is_answered_without_playing_anything_forward(
    settings, queue, user, live_redis, monkeypatch
):
    window(settings, 2, admission_in_request_max_jobs=0)
    live_redis.delete(admission.QUEUED_KEY, admission.PACE_KEY, admission.SECONDS_KEY)
    monkeypatch.setattr(admission, "task_send", lambda name, **kwargs: None)
    job_forecasts_refresh_estimates()  # the last refresh: the window's estimates are stored
    request = JobRequest(name="late", num_gpus=4, total_iters=1000, workload=workload("res18"))
    (job,) = job_submit(owner=user, request=request)
    assert AdmissionPrediction.objects.get(job=job).detail == FORECAST_PENDING

    def not_here(*args, **kwargs):
        raise AssertionError("a job behind the window was played forward")

    monkeypatch.setattr(forecasts, "forecast", not_here)
    assert admission_forecasts_run() == 1
    prediction = AdmissionPrediction.objects.get(job=job)
    assert prediction.predicted_start_at is None and prediction.attainable is None
    assert prediction.detail.startswith(
        "queued behind the 2 jobs the forecast plays forward (the last of them"
    )
    live_redis.delete(admission.QUEUED_KEY, admission.PACE_KEY, admission.SECONDS_KEY)


def test_the_job_page_says_a_pending_forecast_is_coming_and_its_target_not_known_yet(
    settings, user, gpu01_res18, client, live_redis, monkeypatch
):
    window(settings, 1000, admission_in_request_max_jobs=0)
    live_redis.delete(admission.QUEUED_KEY, admission.PACE_KEY, admission.SECONDS_KEY)
    monkeypatch.setattr(admission, "task_send", lambda name, **kwargs: None)
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
    live_redis.delete(admission.QUEUED_KEY, admission.PACE_KEY, admission.SECONDS_KEY)
