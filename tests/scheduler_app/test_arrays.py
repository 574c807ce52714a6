"""Job arrays (Slurm's --array): one job per task index, forecast together, each told its index."""

from datetime import datetime

import pytest
from rest_framework.test import APIClient

from scheduler_app.models import AdmissionPrediction, Job, JobEvent, JobState, PendingReason
from scheduler_app.selectors import agent_commands
from scheduler_app.services.job_control import job_finish, job_hold
from scheduler_app.services.job_requests import MAX_ARRAY_TASKS, ArraySpec, parse_array_spec
from scheduler_app.services.rounds import scheduling_round_run
from tests.api.helpers import make_server, workload

pytestmark = pytest.mark.usefixtures("fifo_proportional_minute_rounds")

JOBS = "/api/v1/jobs/"


@pytest.mark.parametrize(
    ("spec", "ids"),
    [
        ("0-3", (0, 1, 2, 3)),
        ("7", (7,)),
        ("1,3,5-7", (1, 3, 5, 6, 7)),
        ("0-15:4", (0, 4, 8, 12)),
        ("3,1,1-2", (1, 2, 3)),
        (" 0 - 2 ".replace(" ", ""), (0, 1, 2)),
    ],
)
def test_array_specs_as_slurm_writes_them(spec, ids):
    assert parse_array_spec(spec) == ArraySpec(ids, None)


@pytest.mark.parametrize(
    ("spec", "ids", "limit"),
    [
        ("0-99%4", tuple(range(100)), 4),
        ("1,3,5-7 % 2 ", (1, 3, 5, 6, 7), 2),
        ("0-15:4%10", (0, 4, 8, 12), 10),
    ],
)
def test_a_limit_on_tasks_at_once_follows_the_indices(spec, ids, limit):
    assert parse_array_spec(spec) == ArraySpec(ids, limit)


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("", "give the task indices"),
        ("a-b", "is not an index or a range"),
        ("5-2", "is an empty range"),
        ("0-9:0", "is an empty range"),
        ("0-9%", "“%” is not a limit"),
        ("0-9%x", "“%x” is not a limit"),
        ("0-9%2%3", "“%2%3” is not a limit"),
        ("0-9%0", "(%N) is from 1 to"),
        (f"0-9%{MAX_ARRAY_TASKS + 1}", "(%N) is from 1 to"),
        ("%2", "give the task indices"),
        (f"0-{MAX_ARRAY_TASKS}", f"at most {MAX_ARRAY_TASKS} tasks"),
        ("0-2000000", "task indices go up to"),
    ],
)
def test_bad_array_specs_say_what_is_wrong(spec, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        parse_array_spec(spec)


def at(value: str) -> datetime:
    return datetime.fromisoformat(value.replace("Z", "+00:00"))


@pytest.mark.django_db
def test_an_array_is_one_job_per_task_forecast_together_and_each_process_knows_its_index(user):
    server = make_server("gpu01", gpus=4, cpus=12, mem_gb=250)
    workload("res18")
    api = APIClient()
    api.force_authenticate(user)
    body = {"name": "sweep", "workload": "res18", "num_gpus": 2, "total_iters": 2000, "array": "0-2"}
    response = api.post(JOBS, body, format="json")
    assert response.status_code == 201, response.json()
    first = response.json()
    ids = first["array_job_ids"]
    tasks = list(Job.objects.filter(pk__in=ids).order_by("array_task_id"))
    assert [t.pk for t in tasks] == ids and first["id"] == ids[0]
    assert [(t.array_job_id, t.array_task_id, t.num_gpus) for t in tasks] == [
        (ids[0], i, 2) for i in range(3)
    ]
    assert JobEvent.objects.get(job=tasks[2], kind="submitted").data == {
        "array_job": ids[0],
        "array_task_id": 2,
    }
    # One forecast for all three: two tasks fill the 4 GPUs, the third starts when they end.
    predictions = {p.job_id: p for p in AdmissionPrediction.objects.filter(job_id__in=ids)}
    assert len(predictions) == 3
    assert predictions[ids[0]].predicted_start_at == predictions[ids[1]].predicted_start_at
    assert predictions[ids[2]].predicted_start_at >= predictions[ids[0]].predicted_finish_at
    listed = api.get(JOBS, {"array_job": ids[0]}).json()["results"]
    assert sorted(j["array_task_id"] for j in listed) == [0, 1, 2]

    scheduling_round_run()
    starts = [c for c in agent_commands(server=server, running=[]) if c["kind"] == "start"]
    assert len(starts) == 2
    for command in starts:
        task = Job.objects.get(pk=command["job_id"]).array_task_id
        env = command["env"]
        assert env["ATTUNE_ARRAY_TASK_ID"] == env["SLURM_ARRAY_TASK_ID"] == str(task)
        assert env["ATTUNE_ARRAY_JOB_ID"] == env["SLURM_ARRAY_JOB_ID"] == str(ids[0])


@pytest.mark.django_db
def test_a_bad_array_is_a_400_on_its_field_and_stores_nothing(user):
    make_server("gpu01", gpus=4, cpus=12, mem_gb=250)
    workload("res18")
    api = APIClient()
    api.force_authenticate(user)
    body = {"name": "sweep", "workload": "res18", "num_gpus": 1, "total_iters": 10, "array": "0-9%0"}
    response = api.post(JOBS, body, format="json")
    assert response.status_code == 400
    assert response.json() == {
        "array": [f"a limit on simultaneous tasks (%N) is from 1 to {MAX_ARRAY_TASKS}"]
    }
    assert not Job.objects.exists()
    plain = api.post(JOBS, {**body, "array": ""}, format="json").json()
    assert plain["array_job"] is None and plain["array_task_id"] is None and plain["array_job_ids"] is None


def tasks_by_index(first_id: int) -> list[Job]:
    return list(Job.objects.filter(array_job_id=first_id).order_by("array_task_id"))


def res18_api(user) -> APIClient:
    workload("res18")
    api = APIClient()
    api.force_authenticate(user)
    return api


@pytest.mark.django_db
def test_an_array_limit_runs_at_most_n_tasks_at_once_lowest_index_first_and_forecasts_the_rest_after(user):
    server = make_server("gpu01", gpus=4, cpus=12, mem_gb=250)
    api = res18_api(user)
    body = {"name": "sweep", "workload": "res18", "num_gpus": 1, "total_iters": 2000, "array": "0-4%2"}
    response = api.post(JOBS, body, format="json")
    assert response.status_code == 201, response.json()
    assert response.json()["array_task_limit"] == 2
    tasks = tasks_by_index(response.json()["id"])
    assert [t.array_task_limit for t in tasks] == [2] * 5
    # The forecast plays the limit: four free GPUs, yet two tasks at a time, the next when one ends.
    predictions = {p.job_id: p for p in AdmissionPrediction.objects.filter(job_id__in=[t.pk for t in tasks])}
    first_two = [predictions[t.pk] for t in tasks[:2]]
    assert first_two[0].predicted_start_at == first_two[1].predicted_start_at
    earliest_finish = min(p.predicted_finish_at for p in first_two)
    assert predictions[tasks[2].pk].predicted_start_at >= earliest_finish
    assert predictions[tasks[4].pk].predicted_start_at >= predictions[tasks[2].pk].predicted_finish_at

    scheduling_round_run()
    states = [(t.state, t.pending_reason) for t in tasks_by_index(tasks[0].pk)]
    assert [s for s, _ in states] == ["RUNNING", "RUNNING", "PENDING", "PENDING", "PENDING"]
    assert {r for _, r in states[2:]} == {PendingReason.ARRAY_TASK_LIMIT}
    assert len([c for c in agent_commands(server=server, running=[]) if c["kind"] == "start"]) == 2
    listed = api.get(f"{JOBS}{tasks[3].pk}/").json()
    assert listed["pending_reason"] == "JobArrayTaskLimit"

    # A task that ends makes room for the next index, and only for it.
    job_finish(job=Job.objects.get(pk=tasks[1].pk), state=JobState.COMPLETED)
    scheduling_round_run()
    now = tasks_by_index(tasks[0].pk)
    assert [t.state for t in now] == ["RUNNING", "COMPLETED", "RUNNING", "PENDING", "PENDING"]
    assert now[3].pending_reason == now[4].pending_reason == PendingReason.ARRAY_TASK_LIMIT


@pytest.mark.django_db
def test_held_tasks_and_other_arrays_take_no_place_within_an_arrays_limit(user):
    make_server("gpu01", gpus=8, cpus=24, mem_gb=500)
    api = res18_api(user)
    body = {"name": "sweep", "workload": "res18", "num_gpus": 1, "total_iters": 2000}
    limited = api.post(JOBS, {**body, "array": "0-3%2"}, format="json").json()
    free = api.post(JOBS, {**body, "array": "0-2"}, format="json").json()
    tasks = tasks_by_index(limited["id"])
    job_hold(job=tasks[0], by=user)  # held by its owner: out of the queue, so task 2 takes its place
    scheduling_round_run()
    assert [t.state for t in tasks_by_index(limited["id"])] == ["PENDING", "RUNNING", "RUNNING", "PENDING"]
    assert [t.state for t in tasks_by_index(free["id"])] == ["RUNNING"] * 3
    assert tasks_by_index(limited["id"])[0].pending_reason == PendingReason.HELD_USER
