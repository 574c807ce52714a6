"""PATCH /api/v1/jobs/{id}/ (Slurm's scontrol update): a time limit lowered by its owner, raised only by
staff; an array's limit on tasks at once changed for every task, and the rounds following it."""

import pytest
from rest_framework.test import APIClient

from scheduler_app.models import Job, JobEvent, JobState, PendingReason
from scheduler_app.services.rounds import scheduling_round_run
from tests.api.helpers import make_server, submit, workload
from tests.factories import UserFactory

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("fifo_proportional_minute_rounds")]

JOBS = "/api/v1/jobs/"


def api_for(user) -> APIClient:
    client = APIClient()
    client.force_authenticate(user)
    return client


@pytest.fixture
def server():
    workload("res18")
    return make_server("gpu01", gpus=4, cpus=12, mem_gb=250)


def test_its_owner_lowers_a_time_limit_and_only_staff_raise_one(user, server):
    job = submit(user, gpus=1, time_limit_s=3600)
    answer = api_for(user).patch(f"{JOBS}{job.pk}/", {"time_limit_s": 1800}, format="json")
    assert answer.status_code == 200 and answer.json()["time_limit_s"] == 1800
    event = JobEvent.objects.get(job=job, kind="updated")
    assert event.message == f"time limit 3600 s -> 1800 s by {user.username}"
    assert event.data == {"time_limit_s": [3600, 1800]}
    answer = api_for(user).patch(f"{JOBS}{job.pk}/", {"time_limit_s": 7200}, format="json")
    assert (
        answer.status_code == 403
        and "only staff can raise a time limit (1800 s now)" in answer.json()["detail"]
    )
    assert Job.objects.get(pk=job.pk).time_limit_s == 1800
    staff = UserFactory(is_staff=True)
    assert api_for(staff).patch(f"{JOBS}{job.pk}/", {"time_limit_s": 7200}, format="json").status_code == 200
    assert Job.objects.get(pk=job.pk).time_limit_s == 7200
    # A job without a limit is unlimited: setting one lowers it.
    unlimited = submit(user, gpus=1)
    assert (
        api_for(user).patch(f"{JOBS}{unlimited.pk}/", {"time_limit_s": 60}, format="json").status_code == 200
    )


def test_another_users_job_an_ended_one_and_bad_values_are_refused_and_change_nothing(user, server):
    job = submit(user, gpus=1, time_limit_s=3600)
    other = UserFactory()
    assert api_for(other).patch(f"{JOBS}{job.pk}/", {"time_limit_s": 60}, format="json").status_code == 403
    assert api_for(user).patch(f"{JOBS}{job.pk}/", {}, format="json").json()["time_limit_s"] == 3600
    for body, field in (
        ({"time_limit_s": 0}, "time_limit_s"),
        ({"time_limit_s": "1h"}, "time_limit_s"),
        ({"array_task_limit": -1}, "array_task_limit"),
        ({"array_task_limit": 2}, "array_task_limit"),  # not a task of an array
    ):
        answer = api_for(user).patch(f"{JOBS}{job.pk}/", body, format="json")
        assert answer.status_code == 400 and field in answer.json(), (body, answer.json())
    assert answer.json() == {"array_task_limit": [f"job {job.pk} is not a task of an array."]}
    Job.objects.filter(pk=job.pk).update(state=JobState.CANCELLED)
    answer = api_for(user).patch(f"{JOBS}{job.pk}/", {"time_limit_s": 60}, format="json")
    assert (
        answer.status_code == 409
        and "only a pending or running job can be updated" in answer.json()["detail"]
    )
    assert Job.objects.get(pk=job.pk).time_limit_s == 3600 and not JobEvent.objects.filter(kind="updated")


def test_an_arrays_limit_changes_for_every_task_and_the_next_round_follows_it(user, server):
    api = api_for(user)
    body = {"name": "sweep", "workload": "res18", "num_gpus": 1, "total_iters": 2000, "array": "0-3%1"}
    first = api.post(JOBS, body, format="json").json()["id"]
    scheduling_round_run()
    tasks = lambda: list(Job.objects.filter(array_job_id=first).order_by("array_task_id"))  # noqa: E731
    assert [t.state for t in tasks()] == ["RUNNING", "PENDING", "PENDING", "PENDING"]
    answer = api.patch(f"{JOBS}{tasks()[2].pk}/", {"array_task_limit": 3}, format="json")
    assert answer.status_code == 200 and answer.json()["array_task_limit"] == 3
    assert {t.array_task_limit for t in tasks()} == {3}
    scheduling_round_run()
    assert [t.state for t in tasks()] == ["RUNNING", "RUNNING", "RUNNING", "PENDING"]
    assert tasks()[3].pending_reason == PendingReason.ARRAY_TASK_LIMIT
    # Lowered, it stops no running task; 0 removes it.
    api.patch(f"{JOBS}{first}/", {"array_task_limit": 1}, format="json")
    scheduling_round_run()
    assert [t.state for t in tasks()] == ["RUNNING", "RUNNING", "RUNNING", "PENDING"]
    api.patch(f"{JOBS}{first}/", {"array_task_limit": 0}, format="json")
    assert {t.array_task_limit for t in tasks()} == {None}
    scheduling_round_run()
    assert [t.state for t in tasks()] == ["RUNNING"] * 4
