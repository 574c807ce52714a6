"""The minimum-rate QoS target through the API: validation, the round, admission, the outcome at its end."""

import pytest
from rest_framework.test import APIClient

from scheduler_app.models import AdmissionPrediction, Job, JobState, PendingReason
from scheduler_app.services.job_control import job_finish
from scheduler_app.services.rounds import scheduling_round_run
from tests.api.helpers import make_server, observe, submit, workload

pytestmark = pytest.mark.django_db

JOBS = "/api/v1/jobs/"


@pytest.fixture(autouse=True)
def scheduler(settings):
    settings.ATTUNE_SCHEDULER = {
        **settings.ATTUNE_SCHEDULER,
        "policy": "swaf",
        "allocator": "genie",
        "inline_rounds": False,
        "round_s": 60,
    }


@pytest.fixture
def cluster():
    return make_server("gpu01", gpus=1, cpus=3, mem_gb=62.5)


def client_for(user) -> APIClient:
    client = APIClient()
    client.force_authenticate(user)
    return client


def body(**extra):
    return {"name": "r", "workload": "res18", "num_gpus": 1, "total_iters": 20000, **extra}


def proportional_rate() -> float:
    return 1.0 / workload("res18").iter_time_s


def test_a_min_rate_job_is_stored_listed_and_shown(user, cluster):
    workload("res18")
    response = client_for(user).post(JOBS, body(qos_min_rate_iters_per_s=0.5), format="json")
    assert response.status_code == 201, response.json()
    job_id = response.json()["id"]
    assert response.json()["qos_min_rate_iters_per_s"] == 0.5
    assert Job.objects.get(pk=job_id).qos_min_rate_iters_per_s == 0.5
    (listed,) = client_for(user).get(JOBS).json()["results"]
    assert listed["qos_min_rate_iters_per_s"] == 0.5 and listed["qos_deadline_at"] is None


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"qos_min_rate_iters_per_s": 0}, "positive number of iterations per second"),
        ({"qos_min_rate_iters_per_s": -2.5}, "positive number of iterations per second"),
        ({"qos_min_rate_iters_per_s": "fast"}, "Give a number"),
        ({"qos_min_rate_iters_per_s": 1.0, "qos_max_latency_s": 3600}, "one QoS target"),
        ({"qos_min_rate_iters_per_s": 1.0, "qos_deadline_at": "2030-01-01T00:00:00Z"}, "one QoS target"),
    ],
)
def test_bad_rates_and_two_targets_are_field_errors(user, cluster, extra, message):
    workload("res18")
    response = client_for(user).post(JOBS, body(**extra), format="json")
    assert response.status_code == 400
    errors = response.json()
    assert message in " ".join(errors["qos_min_rate_iters_per_s"]), errors
    assert not Job.objects.exists()


def test_the_database_refuses_two_targets_or_a_zero_rate(user, cluster):
    from django.db import IntegrityError, transaction

    job = submit(user)
    for fields in ({"qos_min_rate_iters_per_s": 0}, {"qos_min_rate_iters_per_s": 1, "qos_max_latency_s": 60}):
        with pytest.raises(IntegrityError), transaction.atomic():
            Job.objects.filter(pk=job.pk).update(**fields)


def test_a_rate_above_the_best_case_waits_as_qos_unattainable(user, cluster, settings):
    # FIFO keeps the first job ahead (SWAF would put the late rate job, best effort, before a job
    # without any target: docs/genie.md).
    settings.ATTUNE_SCHEDULER = {**settings.ATTUNE_SCHEDULER, "policy": "fifo"}
    running = submit(user)
    scheduling_round_run()
    too_fast = submit(user, qos_min_rate_iters_per_s=10 * proportional_rate())  # best case: 2.4x
    scheduling_round_run()
    running.refresh_from_db()
    too_fast.refresh_from_db()
    assert running.state == JobState.RUNNING
    assert too_fast.pending_reason == PendingReason.QOS_UNATTAINABLE
    assert too_fast.decisions.order_by("-id").first().reason == "min_rate_unattainable"


def test_admission_judges_the_predicted_rate(user, cluster):
    workload("res18")
    low = client_for(user).post(JOBS, body(qos_min_rate_iters_per_s=0.1 * proportional_rate()), format="json")
    assert low.json()["admission"]["attainable"] is True and low.json()["qos_warning"] == ""
    high = client_for(user).post(JOBS, body(qos_min_rate_iters_per_s=5 * proportional_rate()), format="json")
    assert high.status_code == 201
    assert high.json()["admission"]["attainable"] is False
    assert "below its minimum rate" in high.json()["qos_warning"]


def placed(user, **kwargs) -> Job:
    """A running job with the admission prediction a submission through the API stores."""
    job = submit(user, **kwargs)
    AdmissionPrediction.objects.create(job=job, policy="swaf", allocator="genie")
    scheduling_round_run()
    job.refresh_from_db()
    assert job.state == JobState.RUNNING, job.pending_reason
    return job


@pytest.mark.parametrize(
    ("measured", "state", "met"),
    [(2.0, JobState.COMPLETED, True), (1.0, JobState.COMPLETED, False), (2.0, JobState.FAILED, False)],
)
def test_the_outcome_compares_the_measured_rate_with_the_target(user, cluster, measured, state, met):
    job = placed(user, qos_min_rate_iters_per_s=1.5)
    observe(job, predicted=measured, measured=measured)
    job_finish(job=job, state=state)
    prediction = AdmissionPrediction.objects.get(job=job)
    assert (prediction.measured_iters_per_s, prediction.met_min_rate) == (measured, met)
    assert prediction.met_deadline is None
    admission = client_for(user).get(f"{JOBS}{job.pk}/").json()["admission"]
    assert (admission["measured_iters_per_s"], admission["met_min_rate"]) == (measured, met)


def test_without_a_measurement_the_outcome_is_unknown(user, cluster):
    job = placed(user, qos_min_rate_iters_per_s=1.5)
    job_finish(job=job, state=JobState.COMPLETED)
    prediction = AdmissionPrediction.objects.get(job=job)
    assert (prediction.measured_iters_per_s, prediction.met_min_rate) == (None, None)
