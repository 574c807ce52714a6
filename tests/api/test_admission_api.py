"""Admission feedback: a submission is told its predicted start and finish and whether its QoS holds."""

from datetime import datetime, timedelta

import pytest
from rest_framework.test import APIClient

from scheduler_app.models import AdmissionPrediction, Job, JobState
from scheduler_app.services import admission_worker
from scheduler_app.services.admission_worker import FORECAST_PENDING, admission_forecasts_run
from scheduler_app.services.job_control import job_finish
from tests.api.helpers import make_server, workload

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("fifo_proportional_minute_rounds")]

JOBS = "/api/v1/jobs/"


@pytest.fixture(autouse=True)
def worker_answers_in_time(request, monkeypatch):
    """The forecasts worker fills the prediction while the answer waits for it (as it does when the
    queue is short); tests that ask for `no_worker` see the answer that did not wait."""
    if "no_worker" in request.fixturenames:
        return
    monkeypatch.setattr(
        "scheduler_app.api.views.admission_answer_wait", lambda job_ids: admission_forecasts_run()
    )


@pytest.fixture
def client(user):
    make_server("gpu01", gpus=4, cpus=12, mem_gb=250)
    workload("res18")
    api = APIClient()
    api.force_authenticate(user)
    return api


def post(client: APIClient, **body) -> dict:
    response = client.post(JOBS, {"name": "j", "workload": "res18", **body}, format="json")
    return {"status": response.status_code, **response.json()}


def at(value: str) -> datetime:
    return datetime.fromisoformat(value.replace("Z", "+00:00"))


def test_an_idle_cluster_starts_now_and_finishes_after_the_work(client):
    iter_s = workload("res18").iter_time_s
    body = post(client, num_gpus=2, total_iters=20000, qos_max_latency_s=3 * 3600)
    assert body["status"] == 201, body
    admission = body["admission"]
    work_s = 20000 * iter_s
    start, finish = at(admission["predicted_start_at"]), at(admission["predicted_finish_at"])
    submitted = at(body["submitted_at"])
    assert abs((start - submitted).total_seconds()) < 5  # no round yet: the next one is now
    # Its start-up first (docs/restarts.md), then the work.
    assert (finish - start).total_seconds() == pytest.approx(workload("res18").startup_s + work_s)
    assert at(admission["deadline_at"]) == submitted + timedelta(hours=3)
    assert admission["attainable"] is (work_s <= 3 * 3600)
    assert admission["policy"] == "fifo" and admission["allocator"] == "proportional"
    assert admission["actual_finish_at"] is None and admission["finish_error_s"] is None


def test_a_job_behind_a_long_one_is_told_its_target_cannot_be_met(client):
    iter_s = workload("res18").iter_time_s
    blocker = post(client, num_gpus=4, total_iters=int(4 * 3600 / iter_s))  # 4 h on every GPU
    assert blocker["admission"]["attainable"] is None  # no QoS target
    body = post(client, num_gpus=1, total_iters=1000, qos_max_latency_s=3600)
    assert body["status"] == 201, body
    admission = body["admission"]
    start, finish = at(admission["predicted_start_at"]), at(admission["predicted_finish_at"])
    blocker_finish = at(blocker["admission"]["predicted_finish_at"])
    assert blocker_finish <= start <= blocker_finish + timedelta(seconds=60)  # the next round after it
    assert finish > at(admission["deadline_at"])
    assert admission["attainable"] is False
    # Accepted, and said plainly, with the predicted finish (the form and the CLI say the same).
    assert body["qos_warning"].startswith("Its QoS target is at risk: it is predicted to finish at ")
    assert blocker["qos_warning"] == ""
    stored = AdmissionPrediction.objects.get(job_id=body["id"])
    assert stored.attainable is False and stored.predicted_finish_at == finish


def test_with_rejection_on_an_unattainable_target_is_refused_and_nothing_is_kept(client, settings):
    settings.ATTUNE_SCHEDULER = {**settings.ATTUNE_SCHEDULER, "reject_unattainable_qos": True}
    iter_s = workload("res18").iter_time_s
    post(client, num_gpus=4, total_iters=int(4 * 3600 / iter_s))
    body = post(client, num_gpus=1, total_iters=1000, qos_max_latency_s=3600)
    assert body["status"] == 400
    (message,) = body["qos_max_latency_s"]
    assert "cannot be met" in message and "predicted finish" in message
    assert Job.objects.count() == 1 and AdmissionPrediction.objects.count() == 1
    accepted = post(client, num_gpus=1, total_iters=1000, qos_max_latency_s=6 * 3600)
    assert accepted["status"] == 201 and accepted["admission"]["attainable"] is True


def test_what_happened_is_stored_next_to_the_prediction(client, user):
    body = post(client, num_gpus=1, total_iters=1000, qos_max_latency_s=3600)
    job = Job.objects.get(pk=body["id"])
    job.state = JobState.RUNNING
    job.started_at = job.submitted_at + timedelta(seconds=30)
    job.save()
    finished_at = job.submitted_at + timedelta(seconds=600)
    job_finish(job=job, state=JobState.COMPLETED, now=finished_at)
    admission = client.get(f"{JOBS}{job.pk}/").json()["admission"]
    assert at(admission["actual_finish_at"]) == finished_at
    assert admission["met_deadline"] is True
    predicted = at(admission["predicted_finish_at"])
    assert admission["finish_error_s"] == pytest.approx((finished_at - predicted).total_seconds())


@pytest.fixture
def no_worker(live_redis, monkeypatch, settings) -> list[str]:
    """A queue past the request's forecast and no worker filling the predictions while the answer
    waits: the admission forecast tasks queued (names) are listed instead of sent to a broker, its
    debounce and pace keys cleared first."""
    settings.ATTUNE_SCHEDULER = {**settings.ATTUNE_SCHEDULER, "admission_in_request_max_jobs": 0}
    live_redis.delete(admission_worker.QUEUED_KEY, admission_worker.PACE_KEY, admission_worker.SECONDS_KEY)
    names: list[str] = []
    monkeypatch.setattr(admission_worker, "task_send", lambda name, **kwargs: names.append(name))
    yield names
    live_redis.delete(admission_worker.QUEUED_KEY, admission_worker.PACE_KEY, admission_worker.SECONDS_KEY)


def test_the_answer_does_not_wait_for_a_forecast_and_one_forecast_fills_a_burst(
    client, no_worker, django_capture_on_commit_callbacks
):
    with django_capture_on_commit_callbacks(execute=True):
        bodies = [post(client, num_gpus=1, total_iters=1000, qos_max_latency_s=3600) for _ in range(5)]
    assert [b["status"] for b in bodies] == [201] * 5
    for body in bodies:  # stored, and said to follow: no forecast in the request
        assert body["admission"]["predicted_finish_at"] is None and body["admission"]["attainable"] is None
        assert body["admission"]["detail"] == FORECAST_PENDING
    assert len(no_worker) == 1  # five submissions, one forecast asked for
    assert admission_forecasts_run() == 5
    for body in bodies:
        answer = client.get(f"{JOBS}{body['id']}/").json()["admission"]
        assert answer["predicted_finish_at"] is not None and answer["attainable"] is True
        assert answer["detail"] == ""
    # The run cleared its key: the next submission asks for the next forecast.
    with django_capture_on_commit_callbacks(execute=True):
        post(client, num_gpus=1, total_iters=1000)
    assert len(no_worker) == 2


def test_an_array_is_forecast_by_one_run(client, no_worker, django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks(execute=True):
        body = post(client, num_gpus=2, total_iters=1000, array="0-3")
    ids = body["array_job_ids"]
    assert len(no_worker) == 1  # one forecast for the whole array, not one per task
    assert not AdmissionPrediction.objects.filter(job_id__in=ids, predicted_finish_at__isnull=False).exists()
    assert admission_forecasts_run() == 4
    finishes = dict(
        AdmissionPrediction.objects.filter(job_id__in=ids).values_list("job_id", "predicted_finish_at")
    )
    assert all(finishes[i] is not None for i in ids)
    assert finishes[ids[2]] > finishes[ids[0]]  # 4 GPUs: the second pair runs after the first


def test_a_job_that_ended_before_its_forecast_is_said_to_have(client, no_worker):
    body = post(client, num_gpus=1, total_iters=1000)
    job = Job.objects.get(pk=body["id"])
    job_finish(job=job, state=JobState.CANCELLED, now=job.submitted_at + timedelta(seconds=1))
    admission_forecasts_run()
    assert AdmissionPrediction.objects.get(job=job).detail == admission_worker.ENDED_FIRST


def test_an_own_command_gets_a_start_and_a_finish_only_from_its_time_limit(client):
    body = client.post(
        JOBS,
        {
            "name": "mine",
            "command": "python train.py",
            "num_gpus": 1,
            "total_iters": 10,
            "qos_max_latency_s": 600,
        },
        format="json",
    ).json()
    admission = body["admission"]
    assert admission["predicted_start_at"] is not None and admission["predicted_finish_at"] is None
    assert admission["attainable"] is None and "time limit" in admission["detail"]
    limited = client.post(
        JOBS,
        {
            "name": "mine",
            "command": "python train.py",
            "num_gpus": 1,
            "total_iters": 10,
            "time_limit_s": 3600,
            "qos_max_latency_s": 600,
        },
        format="json",
    ).json()["admission"]
    start, finish = at(limited["predicted_start_at"]), at(limited["predicted_finish_at"])
    assert finish - start == timedelta(hours=1) and limited["attainable"] is False
