"""Hold and release (Slurm's scontrol hold / release): a held job stays PENDING out of every round and
forecast until released; an administrator's hold is theirs to release."""

from datetime import datetime

import pytest
from django.core.exceptions import PermissionDenied
from rest_framework.test import APIClient

from scheduler_app.models import AdmissionPrediction, JobEvent, JobState, PendingReason
from scheduler_app.services.job_control import JobStateError, job_hold, job_release
from scheduler_app.services.rounds import scheduling_round_run
from tests.api.helpers import submit
from tests.factories import UserFactory

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("fifo_proportional_minute_rounds")]

JOBS = "/api/v1/jobs/"


def reason(job) -> tuple[str, bool, str]:
    job.refresh_from_db()
    return job.state, job.held, job.pending_reason


def test_a_held_job_waits_out_of_the_rounds_until_released(user, gpu01_res18):
    job = submit(user, gpus=1)
    job_hold(job=job, by=user)
    assert reason(job) == (JobState.PENDING, True, PendingReason.HELD_USER)
    scheduling_round_run()
    assert reason(job) == (JobState.PENDING, True, PendingReason.HELD_USER)  # a free GPU, yet it waits
    job_release(job=job, by=user)
    assert reason(job) == (JobState.PENDING, False, PendingReason.PRIORITY)
    scheduling_round_run()
    assert reason(job)[0] == JobState.RUNNING
    kinds = list(JobEvent.objects.filter(job=job).order_by("at", "id").values_list("kind", "message"))
    assert kinds[1:3] == [("held", f"held by {user.username}"), ("released", f"released by {user.username}")]


def test_only_a_pending_job_can_be_held_and_only_a_held_one_released(user, gpu01_res18):
    job = submit(user, gpus=1)
    with pytest.raises(JobStateError, match="is not held"):
        job_release(job=job, by=user)
    scheduling_round_run()
    with pytest.raises(JobStateError, match="is RUNNING: only a pending job can be held"):
        job_hold(job=job, by=user)


def test_an_administrators_hold_is_released_only_by_staff(user, staff_user, gpu01_res18):
    job = submit(user, gpus=1)
    job_hold(job=job, by=user)
    job_hold(job=job, by=staff_user)  # staff take the owner's hold over
    assert reason(job) == (JobState.PENDING, True, PendingReason.HELD_ADMIN)
    job_hold(job=job, by=user)  # the owner cannot turn it back into theirs
    assert reason(job)[2] == PendingReason.HELD_ADMIN
    with pytest.raises(PermissionDenied, match="held by an administrator"):
        job_release(job=job, by=user)
    job_release(job=job, by=staff_user)
    assert reason(job) == (JobState.PENDING, False, PendingReason.PRIORITY)
    own = submit(staff_user, gpus=1)
    job_hold(job=own, by=staff_user)  # staff holding their own job: an ordinary hold
    assert reason(own)[2] == PendingReason.HELD_USER


def at(value: str) -> datetime:
    return datetime.fromisoformat(value.replace("Z", "+00:00"))


def test_held_jobs_are_left_out_of_forecasts_and_the_api_holds_and_releases(user, gpu01_res18):
    api = APIClient()
    api.force_authenticate(user)
    body = {"name": "big", "workload": "res18", "num_gpus": 4, "total_iters": 100000, "hold": True}
    big = api.post(JOBS, body, format="json").json()
    assert big["held"] is True and big["pending_reason"] == PendingReason.HELD_USER
    assert big["admission"]["detail"] == "held: it starts only once released"
    assert big["admission"]["predicted_start_at"] is None
    # A job behind the held 4-GPU one is forecast to start at once: the held job takes nothing.
    small = api.post(
        JOBS, {"name": "small", "workload": "res18", "num_gpus": 1, "total_iters": 10}, format="json"
    ).json()
    assert abs((at(small["admission"]["predicted_start_at"]) - at(small["submitted_at"])).total_seconds()) < 5

    released = api.post(f"{JOBS}{big['id']}/release/")
    assert released.status_code == 200 and released.json()["held"] is False
    admission = released.json()["admission"]  # forecast at its release, now that it will run
    assert admission["detail"] == "" and at(admission["predicted_start_at"]) >= at(big["submitted_at"])
    assert at(admission["predicted_finish_at"]) > at(admission["predicted_start_at"])
    assert api.post(f"{JOBS}{big['id']}/release/").status_code == 409
    held = api.post(f"{JOBS}{big['id']}/hold/")
    assert held.status_code == 200 and held.json()["pending_reason"] == PendingReason.HELD_USER

    staff = APIClient()
    staff.force_authenticate(UserFactory(is_staff=True))
    assert staff.post(f"{JOBS}{big['id']}/hold/").json()["pending_reason"] == PendingReason.HELD_ADMIN
    refused = api.post(f"{JOBS}{big['id']}/release/")
    assert refused.status_code == 403 and "only staff can release it" in refused.json()["detail"]
    assert AdmissionPrediction.objects.filter(job_id=big["id"]).count() == 1
