"""The admission task's serving of forecasts: one process at a time, back to back while submissions wait,
a task that finds another forecasting leaving its submissions to it, and a hand-over after SERVE_MAX_S."""

import time

import pytest
from django.test import TestCase

from scheduler_app.models import AdmissionPrediction
from scheduler_app.services import admission_worker
from scheduler_app.services.admission_worker import (
    FORECAST_PENDING,
    admission_forecasts_run,
    admission_forecasts_serve,
)
from scheduler_app.services.jobs import JobRequest, job_submit
from tests.api.helpers import workload

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("fifo_proportional_minute_rounds")]

KEYS = (
    admission_worker.QUEUED_KEY,
    admission_worker.PACE_KEY,
    admission_worker.SECONDS_KEY,
    admission_worker.RUNNING_KEY,
)


@pytest.fixture
def asked(settings, live_redis, monkeypatch, gpu01_res18):
    """A service with a worker; the admission tasks asked of it (not run)."""
    settings.ATTUNE_SCHEDULER = {
        **settings.ATTUNE_SCHEDULER,
        "admission_in_request_max_jobs": 0,
        "admission_forecast_min_interval_s": 0.0,
    }
    live_redis.delete(*KEYS)
    sent = []
    monkeypatch.setattr(admission_worker, "task_send", lambda name, **kwargs: sent.append(name))
    yield sent
    live_redis.delete(*KEYS)


def submit(user, name: str):
    request = JobRequest(name=name, num_gpus=1, total_iters=1000, workload=workload("res18"))
    with TestCase.captureOnCommitCallbacks(execute=True):
        (job,) = job_submit(owner=user, request=request)
    return job


def pending(*jobs) -> int:
    return AdmissionPrediction.objects.filter(job__in=jobs, detail=FORECAST_PENDING).count()


def test_a_forecast_leaves_the_submissions_to_the_process_already_forecasting(user, asked, live_redis):
    job = submit(user, "a")
    holder = live_redis.lock(admission_worker.RUNNING_KEY, timeout=10, blocking=False)
    assert holder.acquire()  # another process's forecast in progress
    assert admission_forecasts_serve() == 0
    assert admission_forecasts_run() == 0  # the refresh's run first, too
    assert pending(job) == 1
    # The run in progress forecasts again after it lets go; the key is cleared, so that the next
    # submission's request queues a task even if that run had read this one already.
    assert not live_redis.exists(admission_worker.QUEUED_KEY)
    holder.release()
    assert admission_forecasts_serve() == 1
    assert pending(job) == 0
    assert not live_redis.exists(admission_worker.RUNNING_KEY)


def test_submissions_during_a_forecast_are_answered_by_the_same_task_right_after(
    user, asked, live_redis, monkeypatch
):
    first = submit(user, "a")
    later = []
    real = admission_worker._forecast_of

    def with_a_submission_meanwhile(pending_predictions):
        estimates = real(pending_predictions)
        if not later:  # committed while the first forecast runs: its task finds that one forecasting
            later.append(submit(user, "b"))
            assert admission_forecasts_serve() == 0
        return estimates

    monkeypatch.setattr(admission_worker, "_forecast_of", with_a_submission_meanwhile)
    assert admission_forecasts_serve() == 2
    assert pending(first, *later) == 0
    assert AdmissionPrediction.objects.get(job=later[0]).predicted_start_at is not None


def test_a_task_hands_over_after_serving_its_time(user, asked, live_redis, monkeypatch):
    first = submit(user, "a")
    asked.clear()
    real = admission_worker._forecast_of

    def with_a_submission_meanwhile(pending_predictions):
        estimates = real(pending_predictions)
        if not asked:
            submit(user, "b")  # its request queues a task (the key taken), which left
        return estimates

    monkeypatch.setattr(admission_worker, "SERVE_MAX_S", 0.0)
    monkeypatch.setattr(admission_worker, "_forecast_of", with_a_submission_meanwhile)
    assert admission_forecasts_serve() == 1
    assert pending(first) == 0
    # The second's task was sent, found nothing to do here (not run: asked only): the hand-over sends
    # another past the debounce key it left.
    assert len(asked) == 2
    assert AdmissionPrediction.objects.filter(detail=FORECAST_PENDING).count() == 1


def test_the_refreshs_single_run_hands_the_submissions_that_came_meanwhile_to_a_task(
    user, asked, live_redis, monkeypatch
):
    first = submit(user, "a")
    asked.clear()
    real = admission_worker._forecast_of

    def with_a_submission_meanwhile(pending_predictions):
        estimates = real(pending_predictions)
        if not asked:
            submit(user, "b")  # its task would find this run in progress and leave
        return estimates

    monkeypatch.setattr(admission_worker, "_forecast_of", with_a_submission_meanwhile)
    assert admission_forecasts_run() == 1
    assert pending(first) == 0
    assert len(asked) == 2  # the second's own task, then the hand-over's past its debounce key
    monkeypatch.setattr(admission_worker, "_forecast_of", real)
    assert admission_forecasts_run() == 1  # that task's run
    assert AdmissionPrediction.objects.filter(detail=FORECAST_PENDING).count() == 0
    assert len(asked) == 2  # nothing waits: nothing more asked


def test_a_costly_forecast_does_not_hold_the_next_one_back_past_the_minimum_interval(
    user, asked, live_redis, monkeypatch, settings
):
    settings.ATTUNE_SCHEDULER = {**settings.ATTUNE_SCHEDULER, "admission_forecast_min_interval_s": 0.1}
    submit(user, "a")
    real = admission_worker._forecast_of

    def costly(pending_predictions):
        until = time.process_time() + 0.3  # CPU, which the next forecast no longer waits out
        while time.process_time() < until:
            pass
        return real(pending_predictions)

    monkeypatch.setattr(admission_worker, "_forecast_of", costly)
    assert admission_forecasts_serve() == 1
    assert live_redis.pttl(admission_worker.PACE_KEY) <= 100  # the interval from its start, at most


def test_a_submission_after_a_run_that_read_the_last_tasks_own_still_queues_a_task(
    user, asked, live_redis, monkeypatch
):
    first = submit(user, "a")
    real = admission_worker._forecast_of

    def its_request_late(pending_predictions):
        # The first's request queued its task after this run cleared the key and before it read the
        # queue (the run answers it); the task comes while the run goes on, and leaves.
        live_redis.set(admission_worker.QUEUED_KEY, "submit", ex=60)
        assert admission_forecasts_serve() == 0
        return real(pending_predictions)

    monkeypatch.setattr(admission_worker, "_forecast_of", its_request_late)
    assert admission_forecasts_serve() == 1
    assert pending(first) == 0
    asked.clear()
    second = submit(user, "b")
    assert asked == [admission_worker.ADMISSION_FORECAST_TASK]  # not held back by the first's key
    assert pending(second) == 1
