"""Whether a submission's admission forecast runs in its request: at most N live jobs, counted exactly."""

import pytest

from scheduler_app.models import JobState
from scheduler_app.services.admission import _short_queue
from tests.factories import JobFactory

pytestmark = pytest.mark.django_db


def test_the_queue_is_short_up_to_its_limit_and_counts_only_live_jobs():
    assert _short_queue(3)  # none
    JobFactory.create_batch(2)  # PENDING
    JobFactory(state=JobState.COMPLETED)
    assert _short_queue(3) and _short_queue(2) and not _short_queue(1)
    JobFactory(state=JobState.RUNNING)
    assert _short_queue(3) and not _short_queue(2)
    JobFactory()
    assert not _short_queue(3) and _short_queue(4)


def test_no_limit_means_never_short():
    assert not _short_queue(0)


def test_by_default_a_worker_forecasts_every_submission_whatever_the_queue_and_pair(
    settings, user, gpu01_res18, monkeypatch, django_capture_on_commit_callbacks
):
    """The shipped default (`admission_in_request_max_jobs` 0, swaf + genie): with a worker, a
    submission to an empty queue plays nothing forward in its request; its prediction is pending and
    the worker asked once, after commit. Without a worker (the embedded demo) it is forecast there."""
    from dataclasses import replace

    from scheduler_app.models import AdmissionPrediction
    from scheduler_app.services import admission, admission_worker
    from scheduler_app.services.jobs import JobRequest, job_submit
    from tests.api.helpers import workload

    raw = {k: v for k, v in settings.ATTUNE_SCHEDULER.items() if k != "admission_in_request_max_jobs"}
    settings.ATTUNE_SCHEDULER = {**raw, "policy": "swaf", "allocator": "genie", "inline_rounds": False}
    assert admission.scheduler_conf().admission_in_request_max_jobs == 0
    asked = []
    monkeypatch.setattr(admission, "admission_forecast_request", lambda: asked.append(1))

    def not_here(**kwargs):
        raise AssertionError("the request forecast with a worker")

    monkeypatch.setattr(admission, "live_forecast", not_here)
    request = JobRequest(name="first", num_gpus=1, total_iters=1000, workload=workload("res18"))
    with django_capture_on_commit_callbacks(execute=True):
        (job,) = job_submit(owner=user, request=request)
        assert not asked  # after commit
    assert AdmissionPrediction.objects.get(job=job).detail == admission_worker.FORECAST_PENDING
    assert asked == [1]

    monkeypatch.undo()
    settings.ATTUNE_SCHEDULER = {**settings.ATTUNE_SCHEDULER, "inline_rounds": True}
    (job,) = job_submit(owner=user, request=replace(request, name="demo"))
    prediction = AdmissionPrediction.objects.get(job=job)
    assert (
        prediction.detail != admission_worker.FORECAST_PENDING and prediction.predicted_finish_at is not None
    )
