"""User endpoints: job submit/list/filter/detail/cancel with their permissions."""

import pytest
from django.utils import timezone
from rest_framework.authtoken.models import Token
from rest_framework.test import APIClient

from scheduler_app.models import Job, JobEvent, JobState, PendingReason, SchedulingRound
from scheduler_app.services.forecasts import job_forecasts_refresh
from scheduler_app.services.rounds import scheduling_round_run
from tests.api.helpers import make_server, submit, workload
from tests.factories import TeamFactory, UserFactory

pytestmark = pytest.mark.django_db

JOBS = "/api/v1/jobs/"


@pytest.fixture(autouse=True)
def scheduler(settings):
    settings.ATTUNE_SCHEDULER = {
        **settings.ATTUNE_SCHEDULER,
        "policy": "fifo",
        "allocator": "tune",
        "inline_rounds": False,
        "round_s": 60,
    }


@pytest.fixture
def cluster():
    return make_server("gpu01", gpus=4, cpus=12, mem_gb=250)


def client_for(user) -> APIClient:
    client = APIClient()
    client.force_authenticate(user)
    return client


def test_anonymous_users_get_nothing(cluster):
    client = APIClient()
    # 401 with the challenge a token client expects (not 403, which says "you may not").
    for answer in (client.get(JOBS), client.post(JOBS, {}, format="json"), client.get("/api/v1/cluster/")):
        assert answer.status_code == 401 and answer["WWW-Authenticate"] == "Token"
    client.credentials(HTTP_AUTHORIZATION="Token not-a-real-token")
    answer = client.get(JOBS)
    assert answer.status_code == 401 and answer["WWW-Authenticate"] == "Token"


def test_a_user_token_authenticates(user, cluster):
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {Token.objects.create(user=user).key}")
    assert client.get(JOBS).status_code == 200


def test_obtaining_a_token(user):
    response = APIClient().post(
        "/api/v1/auth/token/", {"username": user.username, "password": "pw-for-tests"}
    )
    assert response.status_code == 200 and response.json()["token"]


def test_submit_a_catalog_job(user, cluster, django_capture_on_commit_callbacks, monkeypatch):
    workload("res18")
    team = TeamFactory(name="vision")
    team.members.add(user)
    requested = []
    monkeypatch.setattr(
        "scheduler_app.services.round_requests.scheduling_round_request",
        lambda *, trigger: requested.append(trigger),
    )
    with django_capture_on_commit_callbacks(execute=True):
        response = client_for(user).post(
            JOBS,
            {
                "name": "res18-a",
                "workload": "res18",
                "team": "vision",
                "num_gpus": 2,
                "total_iters": 20000,
                "qos_max_latency_s": 7200,
            },
            format="json",
        )
    assert response.status_code == 201, response.json()
    body = response.json()
    assert body["state"] == "PENDING" and body["owner"] == user.username and body["team"] == "vision"
    assert body["workload"] == "res18" and body["queue_position"] == 1
    assert body["events"][0]["kind"] == "submitted"
    assert requested == ["submit"]  # an early round, debounced by the service
    assert Job.objects.get(pk=body["id"]).qos_max_latency_s == 7200


def test_submit_an_own_command(user, cluster):
    response = client_for(user).post(
        JOBS, {"name": "mine", "command": "python train.py", "num_gpus": 1, "total_iters": 10}, format="json"
    )
    assert response.status_code == 201
    assert response.json()["workload"] is None


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"name": "x", "num_gpus": 1, "total_iters": 10}, "workload"),  # neither workload nor command
        ({"name": "x", "command": "true", "num_gpus": 5, "total_iters": 10}, "num_gpus"),  # > cluster GPUs
        ({"name": "x", "command": "true", "num_gpus": 1, "total_iters": 10, "team": "other"}, "team"),
        ({"name": "x", "command": "true", "num_gpus": 1, "total_iters": 0}, "total_iters"),
        ({"name": "x", "workload": "nope", "num_gpus": 1, "total_iters": 10}, "workload"),
        (
            {
                "name": "x",
                "command": "true",
                "num_gpus": 1,
                "total_iters": 10,
                "qos_max_latency_s": 60,
                "qos_deadline_at": "2030-01-01T00:00:00Z",
            },
            "qos_max_latency_s",
        ),
        ({"name": "x", "command": "true", "num_gpus": 1, "total_iters": 10, "priority": 5}, "priority"),
    ],
)
def test_submit_errors_are_field_errors(user, cluster, body, field):
    TeamFactory(name="other")
    response = client_for(user).post(JOBS, body, format="json")
    assert response.status_code == 400
    assert field in response.json(), response.json()
    assert not Job.objects.exists()


def test_staff_may_raise_priority(staff_user, cluster):
    response = client_for(staff_user).post(
        JOBS, {"name": "x", "command": "true", "num_gpus": 1, "total_iters": 10, "priority": 5}, format="json"
    )
    assert response.status_code == 201


def test_every_user_lists_every_job_as_squeue_does(user, staff_user, cluster):
    other = UserFactory()
    mine = submit(user, name="mine", command="echo secret-argument", time_limit_s=600)
    theirs = submit(other, name="theirs", command="echo their-secret", time_limit_s=600)
    rows = {j["id"]: j for j in client_for(user).get(JOBS).json()["results"]}
    assert set(rows) == {mine.pk, theirs.pk}
    assert rows[theirs.pk]["owner"] == other.username and rows[theirs.pk]["details_hidden"] is True
    assert rows[theirs.pk]["command"] == "" and rows[theirs.pk]["run_as"] == ""
    assert rows[mine.pk]["command"] == "echo secret-argument" and rows[mine.pk]["details_hidden"] is False
    assert client_for(staff_user).get(JOBS).json()["count"] == 2


def test_private_jobs_lists_only_ones_own_as_slurms_privatedata(user, staff_user, cluster, settings):
    settings.ATTUNE_SCHEDULER = {**settings.ATTUNE_SCHEDULER, "private_jobs": True}
    mine = submit(user, name="mine")
    theirs = submit(UserFactory(), name="theirs")
    assert [j["id"] for j in client_for(user).get(JOBS).json()["results"]] == [mine.pk]
    assert client_for(user).get(f"{JOBS}{theirs.pk}/").status_code == 404
    assert client_for(staff_user).get(JOBS).json()["count"] == 2


def test_list_filters(staff_user, cluster):
    alice, bob = UserFactory(username="alice"), UserFactory(username="bob")
    team = TeamFactory(name="nlp")
    team.members.add(bob)
    submit(alice, name="a1", workload=workload("res18"))
    b1 = submit(bob, name="b1", workload=workload("lstm"), team=team)
    b2 = submit(bob, name="b2", workload=workload("lstm"))
    Job.objects.filter(pk=b2.pk).update(state=JobState.COMPLETED)
    client = client_for(staff_user)

    def names(query: str) -> set[str]:
        return {j["name"] for j in client.get(f"{JOBS}?{query}").json()["results"]}

    assert names("owner=bob") == {"b1", "b2"}
    assert names("name=b1") == {"b1"}
    assert names("name=b") == set()  # the whole name, as squeue --name
    assert names("team=nlp") == {"b1"}
    assert names("workload=res18") == {"a1"}
    assert names("state=COMPLETED") == {"b2"}
    assert names("state=PENDING&state=COMPLETED") == {"a1", "b1", "b2"}
    assert names("state=PENDING&owner=bob") == {"b1"}
    assert client.get(f"{JOBS}?state=BOGUS").status_code == 400
    assert b1


def test_an_unknown_list_parameter_is_refused_naming_it(staff_user, cluster):
    """A misspelt filter listed every job as if unfiltered; now it is a 400 that names it and says
    what the list accepts. Pagination and DRF's format stay accepted; a job's detail is not a list."""
    job = submit(staff_user, name="mine")
    client = client_for(staff_user)
    answer = client.get(f"{JOBS}?nmae=mine&stat=RUNNING")
    assert answer.status_code == 400
    errors = answer.json()
    assert set(errors) == {"nmae", "stat"}
    message = errors["nmae"][0]
    assert message.startswith("Unknown parameter") and "name" in message and "state" in message
    assert "limit" in message and "offset" in message
    page = client.get(f"{JOBS}?name=mine&limit=5&offset=0&format=json")
    assert page.status_code == 200 and [j["name"] for j in page.json()["results"]] == ["mine"]
    assert client.get(f"{JOBS}{job.pk}/?nmae=x").status_code == 200
    assert client.get("/api/v1/workloads/?limit=2").status_code == 200
    assert set(client.get("/api/v1/workloads/?name=res18").json()) == {"name"}


def test_detail_shows_queue_position_estimate_allocations_and_events(user, cluster):
    first = submit(user, gpus=4, name="first", iters=1000)
    scheduling_round_run()
    second = submit(user, gpus=2, name="second")
    third = submit(user, gpus=2, name="third")
    scheduling_round_run()
    job_forecasts_refresh()  # what the forecasts worker does after the round
    client = client_for(user)

    running = client.get(f"{JOBS}{first.pk}/").json()
    assert running["state"] == "RUNNING" and running["queue_position"] is None
    (allocation,) = running["allocations"]
    assert allocation["server"] == "gpu01" and allocation["gpu_indices"] == [0, 1, 2, 3]
    assert allocation["gpu_uuids"] == [f"GPU-gpu01-{i}" for i in range(4)]
    assert allocation["num_cpus"] > 0 and allocation["mem_gb"] > 0 and allocation["ended_at"] is None
    assert [e["kind"] for e in running["events"]] == ["submitted", "scheduled"]
    assert running["log_tail"] == []

    waiting = client.get(f"{JOBS}{third.pk}/").json()
    assert waiting["state"] == "PENDING" and waiting["pending_reason"] == PendingReason.PRIORITY
    assert waiting["queue_position"] == 2
    assert client.get(f"{JOBS}{second.pk}/").json()["queue_position"] == 1
    # Both wait for the 4-GPU job to finish, which is predicted from its profile; they start in the
    # first round after that, so the estimate lies on the round grid in the future.
    estimate = waiting["estimated_start_at"]
    assert estimate is not None
    last_round = SchedulingRound.objects.order_by("-started_at").first().started_at
    from datetime import datetime

    start = datetime.fromisoformat(estimate.replace("Z", "+00:00"))
    assert start > timezone.now()
    assert ((start - last_round).total_seconds() % 60) == pytest.approx(0, abs=1e-3)


def test_another_users_job_shows_its_summary_but_not_what_it_runs_and_cannot_be_changed(user, cluster):
    job = submit(UserFactory(), name="theirs", command="echo their-secret", time_limit_s=600)
    client = client_for(user)
    body = client.get(f"{JOBS}{job.pk}/").json()
    assert body["name"] == "theirs" and body["details_hidden"] is True
    assert body["command"] == "" and body["log_tail"] == []
    assert all(e["message"] == "" and e["data"] == {} for e in body["events"])
    for action in ("cancel", "hold"):
        response = client.post(f"{JOBS}{job.pk}/{action}/")
        assert response.status_code == 403 and "owner" in response.json()["detail"]
    job.refresh_from_db()
    assert job.state == JobState.PENDING and not job.held


def test_cancel_a_running_job(user, cluster):
    job = submit(user, gpus=2)
    scheduling_round_run()
    response = client_for(user).post(f"{JOBS}{job.pk}/cancel/")
    assert response.status_code == 200
    body = response.json()
    assert body["state"] == "CANCELLED" and body["allocations"][0]["end_reason"] == "cancelled"
    assert JobEvent.objects.filter(job=job, kind="cancelled", to_state="CANCELLED").exists()
    assert client_for(user).post(f"{JOBS}{job.pk}/cancel/").status_code == 409


def test_staff_cancel_anyones_job(staff_user, user, cluster):
    job = submit(user)
    assert client_for(staff_user).post(f"{JOBS}{job.pk}/cancel/").status_code == 200
    job.refresh_from_db()
    assert job.state == JobState.CANCELLED
