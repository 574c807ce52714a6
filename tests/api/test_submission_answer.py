"""A submission's answer (the 201's body) is the job as its detail reads it, from fewer queries."""

import json
from types import SimpleNamespace

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from rest_framework.renderers import JSONRenderer
from rest_framework.test import APIClient

from scheduler_app.api.serializers.jobs import JobSubmittedSerializer
from scheduler_app.models import Job, JobEvent, JobState
from scheduler_app.selectors import job_detail_queryset, job_queue, job_queue_of, job_submitted_detail
from scheduler_app.services import admission_window
from scheduler_app.services.forecasts import job_forecasts_refresh
from scheduler_app.services.rounds import scheduling_round_run
from tests.api.helpers import make_server, submit, workload
from tests.scheduler_app.test_restarts_selectors import moved_twice_and_preempted

pytestmark = pytest.mark.django_db

JOBS = "/api/v1/jobs/"


def rendered(job: Job, user, queue, array_job_ids=None) -> dict:
    context = {"request": SimpleNamespace(user=user), "queue": queue, "array_job_ids": array_job_ids}
    return json.loads(JSONRenderer().render(JobSubmittedSerializer(job, context=context).data))


def as_detail_reads_it(job_id: int, user, array_job_ids=None) -> dict:
    """The answer as it was built before job_submitted_detail: the detail's read, job_queue's entry."""
    job = job_detail_queryset(user=user).prefetch_related("depends_on").get(pk=job_id)
    return rendered(job, user, lambda: job_queue(job_ids=[job_id]), array_job_ids)


def as_submission_reads_it(job_id: int, user, *, dependencies: bool, array_job_ids=None) -> dict:
    job = job_submitted_detail(user=user, job_id=job_id, dependencies=dependencies)
    return rendered(job, user, lambda: job_queue_of(job), array_job_ids)


@pytest.fixture
def client(user):
    client = APIClient()
    client.force_authenticate(user)
    return client


@pytest.mark.parametrize(
    "body",
    [
        {"name": "one"},
        {"name": "sweep", "array": "0-4"},
        {"name": "held", "hold": True},
        {"name": "own", "workload": None, "command": "python train.py", "output": "out-%j.log"},
        {"name": "late", "qos_max_latency_s": 3600, "priority": 0},
    ],
    ids=["single", "array", "held", "own-command", "qos"],
)
def test_each_kind_of_submission_is_answered_as_its_detail_reads_it(client, user, body, fifo_tune):
    make_server("gpu01", gpus=4, cpus=12, mem_gb=250)
    workload("res18")
    base = {"workload": "res18", "num_gpus": 1, "total_iters": 1000}
    response = client.post(JOBS, {**base, **body}, format="json")
    assert response.status_code == 201, response.content
    answer = response.json()
    assert answer == as_detail_reads_it(answer["id"], user, answer["array_job_ids"])


def test_a_submission_with_dependencies_is_answered_with_them_in_the_details_order(client, user, fifo_tune):
    workload("res18")
    first, second = submit(user, name="a"), submit(user, name="b")
    array = submit(user, name="c", array="0-2")
    response = client.post(
        JOBS,
        {
            "name": "after",
            "workload": "res18",
            "total_iters": 10,
            "depends_on": [first.pk, array.pk, second.pk],
        },
        format="json",
    )
    assert response.status_code == 201, response.content
    answer = response.json()
    assert len(answer["depends_on"]) == 5  # the array's three tasks and the two jobs
    assert answer == as_detail_reads_it(answer["id"], user)


def test_a_job_placed_since_its_submission_reads_as_its_detail_does(user, fifo_tune):
    """The answer reads the job's leases and restarts when its row says it has started (a round
    placed it between the submission's commit and its answer)."""
    make_server("gpu01", gpus=4, cpus=12, mem_gb=250)
    job = submit(user, gpus=2, name="placed")
    scheduling_round_run()
    job.refresh_from_db()
    assert job.state == JobState.RUNNING and job.allocations.exists()
    assert as_submission_reads_it(job.pk, user, dependencies=False) == as_detail_reads_it(job.pk, user)


def test_a_job_with_restarts_reads_them(user):
    job = moved_twice_and_preempted()
    # The factory leaves the start empty; a round sets it with the first lease.
    Job.objects.filter(pk=job.pk).update(started_at=timezone.now())
    answer = as_submission_reads_it(job.pk, user, dependencies=False)
    assert answer["restarts"]["restarts"] == 3
    assert answer == as_detail_reads_it(job.pk, user)


def test_a_pending_jobs_queue_place_and_forecast_come_from_its_own_row(user, fifo_tune):
    make_server("gpu01", gpus=4, cpus=12, mem_gb=250)
    ahead = submit(user, gpus=4, iters=20_000, name="ahead")
    behind = submit(user, gpus=4, name="behind")
    scheduling_round_run()
    job_forecasts_refresh()
    answer = as_submission_reads_it(behind.pk, user, dependencies=False)
    assert answer["queue_position"] == 1
    assert answer["estimated_finish_at"] is not None, answer["estimate_detail"]
    assert answer == as_detail_reads_it(behind.pk, user)
    ahead.refresh_from_db()
    assert ahead.state == JobState.RUNNING
    assert as_submission_reads_it(ahead.pk, user, dependencies=False) == as_detail_reads_it(ahead.pk, user)


def test_a_fresh_jobs_answer_is_two_queries(user):
    job = submit(user, name="fresh")
    with CaptureQueriesContext(connection) as queries:
        as_submission_reads_it(job.pk, user, dependencies=False)
    # The job's row (owner, team, workload, forecast, prediction) and its events: no leases, no
    # dependencies, no restarts' subqueries, no queue read.
    assert len(queries.captured_queries) == 2, [q["sql"][:80] for q in queries.captured_queries]


# One submission of each kind, whose 201 body the tests below compare with the detail's read.
KINDS_OF_SUBMISSION = pytest.mark.parametrize(
    "body",
    [
        {"name": "one"},
        {"name": "sweep", "array": "0-4"},
        {"name": "own", "workload": None, "command": "python train.py", "output": "out-%j.log"},
        {"name": "late", "qos_max_latency_s": 3600},
    ],
    ids=["single", "array", "own-command", "qos"],
)


@KINDS_OF_SUBMISSION
def test_a_submission_behind_the_forecasts_window_is_answered_as_stored_as_its_detail_reads_it(
    client, user, body, fifo_tune, settings, live_redis, monkeypatch
):
    """Queued behind the forecast's window, a job's answer is what its request stored (no read): the
    same, field for field, as the detail's read after it."""
    settings.ATTUNE_SCHEDULER = {
        **settings.ATTUNE_SCHEDULER,
        "forecast_window_jobs": 2,
        "admission_in_request_max_jobs": 0,
        "reject_unattainable_qos": False,
    }
    monkeypatch.setattr("scheduler_app.services.admission_worker.task_send", lambda name, **kwargs: None)
    monkeypatch.setattr("scheduler_app.services.round_requests.task_send", lambda name, **kwargs: None)
    make_server("gpu01", gpus=4, cpus=12, mem_gb=250)
    workload("res18")
    for n in range(4):
        submit(user, gpus=4, iters=20_000, name=f"ahead{n}")
    scheduling_round_run()
    job_forecasts_refresh()
    admission_window.window_last_start_forget()

    def read(**kwargs):
        raise AssertionError("the answer read the job again")

    monkeypatch.setattr("scheduler_app.api.views.job_submitted_detail", read)
    base = {"workload": "res18", "num_gpus": 1, "total_iters": 1000}
    response = client.post(JOBS, {**base, **body}, format="json")
    admission_window.window_last_start_forget()
    assert response.status_code == 201, response.content
    answer = response.json()
    assert answer["admission"]["detail"].startswith("queued behind the 2 jobs the forecast plays forward")
    assert answer["estimate_detail"] == answer["admission"]["detail"]
    assert answer == as_detail_reads_it(answer["id"], user, answer["array_job_ids"])


def test_relations_known_from_the_submission_still_read_the_database_when_filtered(user):
    """job_submit hands back its job with its events, leases and dependencies as prefetched (what it
    stored): a filter on them reads the database, as on any prefetched relation, so a later change
    (a cancel) is found."""
    workload("res18")
    job = submit(user)
    detail = job_submitted_detail(user=user, job_id=job.pk, dependencies=False)
    for each in (job, detail):
        assert [e.kind for e in each.events.all()] == ["submitted"]  # as stored, no query
    Job.objects.filter(pk=job.pk).update(state=JobState.CANCELLED)
    JobEvent.objects.create(job_id=job.pk, kind="cancelled", data={})  # not through job.events
    for each in (job, detail):
        assert each.events.filter(kind="cancelled").count() == 1
        assert not each.allocations.filter(ended_at__isnull=True).exists()
        assert each.depends_on.filter(pk=job.pk).count() == 0


@KINDS_OF_SUBMISSION
def test_a_submission_left_to_the_worker_is_answered_as_stored_as_its_detail_reads_it(
    client, user, body, fifo_tune, settings, live_redis, monkeypatch
):
    """Inside the forecast's window with a worker, and its answer not waiting for it (the last admission
    forecast too long): what its request stored (the prediction pending, no estimate), not read again;
    the same, field for field, as the detail's read after it."""
    from scheduler_app.services.admission_worker import FORECAST_PENDING, PACE_KEY, QUEUED_KEY, SECONDS_KEY

    settings.ATTUNE_SCHEDULER = {
        **settings.ATTUNE_SCHEDULER,
        "admission_in_request_max_jobs": 0,
        "reject_unattainable_qos": False,
    }
    monkeypatch.setattr("scheduler_app.services.admission_worker.task_send", lambda name, **kwargs: None)
    monkeypatch.setattr("scheduler_app.services.round_requests.task_send", lambda name, **kwargs: None)
    live_redis.delete(QUEUED_KEY, PACE_KEY)
    live_redis.set(SECONDS_KEY, "5")  # the answer would only wait: it does not
    make_server("gpu01", gpus=4, cpus=12, mem_gb=250)
    workload("res18")
    submit(user, gpus=4, iters=20_000, name="ahead")

    def read(**kwargs):
        raise AssertionError("the answer read the job again")

    monkeypatch.setattr("scheduler_app.api.views.job_submitted_detail", read)
    base = {"workload": "res18", "num_gpus": 1, "total_iters": 1000}
    try:
        response = client.post(JOBS, {**base, **body}, format="json")
    finally:
        live_redis.delete(SECONDS_KEY, QUEUED_KEY, PACE_KEY)
    assert response.status_code == 201, response.content
    answer = response.json()
    assert answer["admission"]["detail"] == FORECAST_PENDING
    assert answer == as_detail_reads_it(answer["id"], user, answer["array_job_ids"])
