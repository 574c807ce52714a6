"""Job dependencies (Slurm's afterok): validated at submission, held out of rounds until every
dependency completes, never started after one that failed, and followed by the admission forecast."""

from datetime import datetime, timedelta

import pytest
from django.core.exceptions import ValidationError
from rest_framework.test import APIClient

from profiles_app.models import ProfilingRun
from profiles_app.services.workloads import workload_register
from scheduler_app.models import Job, JobEvent, JobState, PendingReason
from scheduler_app.selectors import job_queue
from scheduler_app.services.job_control import job_cancel, job_finish
from scheduler_app.services.job_requests import MAX_DEPENDENCIES
from scheduler_app.services.rounds import scheduling_round_run
from tests.api.helpers import make_server, submit, workload
from tests.factories import UserFactory

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("fifo_proportional_minute_rounds")]

JOBS = "/api/v1/jobs/"


@pytest.fixture
def server():
    return make_server("gpu01", gpus=4, cpus=12, mem_gb=250)


def state(job: Job) -> tuple[str, str]:
    job.refresh_from_db()
    return job.state, job.pending_reason


def api_for(user) -> APIClient:
    api = APIClient()
    api.force_authenticate(user)
    return api


def test_a_job_starts_only_once_every_dependency_has_completed(user, server):
    first = submit(user, gpus=1, name="preprocess")
    second = submit(user, gpus=1, name="prepare")
    train = submit(user, gpus=1, name="train", depends_on=(first.pk, second.pk))
    assert state(train) == (JobState.PENDING, PendingReason.DEPENDENCY)  # before any round
    scheduling_round_run()
    assert state(first)[0] == state(second)[0] == JobState.RUNNING
    assert state(train) == (JobState.PENDING, PendingReason.DEPENDENCY)  # a GPU is free: not for it
    job_finish(job=first, state=JobState.COMPLETED)
    scheduling_round_run()
    assert state(train) == (JobState.PENDING, PendingReason.DEPENDENCY)
    job_finish(job=second, state=JobState.COMPLETED)
    scheduling_round_run()
    assert state(train)[0] == JobState.RUNNING
    assert JobEvent.objects.get(job=train, kind="submitted").data == {"depends_on": [first.pk, second.pk]}


def test_after_a_failed_dependency_the_job_never_starts_and_says_why(user, server):
    first = submit(user, gpus=1)
    train = submit(user, gpus=1, depends_on=(first.pk,))
    scheduling_round_run()
    first.refresh_from_db()  # RUNNING now: it fails as a running job does (the lifecycle's table)
    job_finish(job=first, state=JobState.FAILED, exit_code=1)
    for _ in range(2):  # the reason and its event are written once
        scheduling_round_run()
    assert state(train) == (JobState.PENDING, PendingReason.DEPENDENCY_NEVER_SATISFIED)
    event = JobEvent.objects.get(job=train, kind="dependency_never_satisfied")
    assert event.message == f"job {first.pk} ended FAILED"
    job_cancel(job=train, by=user)  # what its owner does next, as with Slurm
    assert state(train)[0] == JobState.CANCELLED


def test_submission_refuses_unknown_foreign_and_failed_dependencies_and_stores_nothing(user, server):
    failed = submit(user, gpus=1)
    scheduling_round_run()
    failed.refresh_from_db()  # a job fails once it runs (the lifecycle's table)
    job_finish(job=failed, state=JobState.FAILED)
    done = submit(user, gpus=1)
    job_finish(job=done, state=JobState.COMPLETED)
    foreign = submit(UserFactory(), gpus=1)
    before = Job.objects.count()
    with pytest.raises(ValidationError) as err:
        submit(user, gpus=1, depends_on=(failed.pk, foreign.pk, 999999, done.pk))
    assert err.value.message_dict["depends_on"] == [
        f"No job {foreign.pk}, 999999 that you can see.",
        f"Job {failed.pk} ended FAILED: a job after it could never start.",
    ]
    assert Job.objects.count() == before
    with pytest.raises(ValidationError, match=f"at most {MAX_DEPENDENCIES}"):
        submit(user, gpus=1, depends_on=tuple(range(1, MAX_DEPENDENCIES + 2)))
    after_done = submit(user, gpus=1, depends_on=(done.pk,))  # already completed: nothing to wait for
    assert state(after_done) == (JobState.PENDING, PendingReason.PRIORITY)


def test_an_unprofiled_workload_is_profiled_while_its_job_waits_for_a_dependency(user, server):
    first = submit(user, gpus=1)
    fresh = workload_register(name="my-model")
    waiting = submit(user, gpus=1, workload=fresh, depends_on=(first.pk,))
    scheduling_round_run()
    assert ProfilingRun.objects.filter(workload=fresh).exists()  # profiled on arrival, as Synergy does
    assert state(waiting) == (JobState.PENDING, PendingReason.DEPENDENCY)  # not flipped to Profiling


def at(value: str) -> datetime:
    return datetime.fromisoformat(value.replace("Z", "+00:00"))


def test_the_admission_forecast_starts_a_dependent_job_after_its_dependency_finishes(user, server):
    iter_s = workload("res18").iter_time_s
    api = api_for(user)
    body = api.post(
        JOBS, {"name": "a", "workload": "res18", "num_gpus": 1, "total_iters": 10000}, format="json"
    )
    first = body.json()
    first_finish = at(first["admission"]["predicted_finish_at"])
    body = api.post(
        JOBS,
        {"name": "b", "workload": "res18", "num_gpus": 1, "total_iters": 100, "depends_on": [first["id"]]},
        format="json",
    )
    assert body.status_code == 201, body.json()
    after = body.json()
    assert after["depends_on"] == [first["id"]] and after["pending_reason"] == PendingReason.DEPENDENCY
    start = at(after["admission"]["predicted_start_at"])
    # Three GPUs are free, yet it starts at the first 60 s round after the first job's finish.
    assert first_finish <= start < first_finish + timedelta(seconds=60)
    assert (at(after["admission"]["predicted_finish_at"]) - start).total_seconds() == pytest.approx(
        workload("res18").startup_s + 100 * iter_s  # its start-up, then its work (docs/restarts.md)
    )
    # One forecast: the queue's estimate is the one made at submission (nothing happened since).
    assert job_queue()[after["id"]].estimated_start_at == start
    assert at(api.get(f"{JOBS}{after['id']}/").json()["estimated_start_at"]) == start
    listed = api.get(JOBS).json()["results"]
    assert {j["id"]: j["depends_on"] for j in listed} == {after["id"]: [first["id"]], first["id"]: []}


def test_the_api_names_a_bad_dependency_in_its_field(user, server):
    workload("res18")
    body = api_for(user).post(
        JOBS,
        {"name": "b", "workload": "res18", "num_gpus": 1, "total_iters": 100, "depends_on": [424242]},
        format="json",
    )
    assert body.status_code == 400
    assert body.json() == {"depends_on": ["No job 424242 that you can see."]}
    body = api_for(user).post(
        JOBS,
        {"name": "b", "workload": "res18", "num_gpus": 1, "total_iters": 100, "depends_on": ["x"]},
        format="json",
    )
    assert body.status_code == 400 and "depends_on" in body.json()


def test_a_job_after_an_array_waits_for_every_task_of_it(user, server):
    sweep = [submit(user, gpus=1, name="sweep", array="0-2")]
    tasks = list(Job.objects.filter(name="sweep").order_by("array_task_id"))
    assert sweep[0] == tasks[0]
    evaluate = submit(user, gpus=1, name="evaluate", depends_on=(tasks[0].pk,))  # the array's id
    assert sorted(evaluate.depends_on.values_list("pk", flat=True)) == [t.pk for t in tasks]
    scheduling_round_run()
    for task in tasks[:2]:
        job_finish(job=task, state=JobState.COMPLETED)
    scheduling_round_run()
    assert state(evaluate) == (JobState.PENDING, PendingReason.DEPENDENCY)  # task 2 still runs
    job_finish(job=tasks[2], state=JobState.COMPLETED)
    scheduling_round_run()
    assert state(evaluate)[0] == JobState.RUNNING
