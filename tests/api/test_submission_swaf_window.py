"""Under `swaf`, a submission without a QoS target behind the forecast's window is answered in its 201
through the API (the view's prepared statements included) as its detail reads it; one inside the
window, or with a QoS target, is the forecasts worker's."""

import pytest
from rest_framework.test import APIClient

from scheduler_app.services import admission_tail, admission_window
from scheduler_app.services.admission_worker import FORECAST_PENDING
from scheduler_app.services.forecasts import job_forecasts_refresh
from scheduler_app.services.rounds import scheduling_round_run
from tests.api.helpers import make_server, submit, workload
from tests.api.test_submission_answer import as_detail_reads_it

pytestmark = pytest.mark.django_db

JOBS = "/api/v1/jobs/"


@pytest.fixture
def queued(user, settings, live_redis, monkeypatch):
    """gpu01 busy; four jobs of 20,000 iterations waiting; swaf + genie, a window of 2 jobs."""
    settings.ATTUNE_SCHEDULER = {
        **settings.ATTUNE_SCHEDULER,
        "policy": "swaf",
        "allocator": "genie",
        "inline_rounds": False,
        "forecast_window_jobs": 2,
        "admission_in_request_max_jobs": 0,
        "reject_unattainable_qos": False,
    }
    monkeypatch.setattr("scheduler_app.services.admission_worker.task_send", lambda name, **kwargs: None)
    monkeypatch.setattr("scheduler_app.services.round_requests.task_send", lambda name, **kwargs: None)
    make_server("gpu01", gpus=4, cpus=12, mem_gb=250)
    workload("res18")
    submit(user, gpus=4, iters=100_000, name="running")
    scheduling_round_run()
    for n in range(4):
        submit(user, gpus=1, iters=20_000, name=f"ahead{n}")
    job_forecasts_refresh()
    admission_tail.rates_forget()
    admission_window.window_last_start_forget()
    client = APIClient()
    client.force_authenticate(user)
    yield client
    admission_tail.rates_forget()
    admission_window.window_last_start_forget()


@pytest.mark.parametrize(
    "body", [{"name": "one"}, {"name": "sweep", "array": "0-2"}], ids=["single", "array"]
)
def test_a_long_job_behind_the_window_is_answered_in_its_201(queued, user, body):
    base = {"workload": "res18", "num_gpus": 1, "total_iters": 50_000}
    response = queued.post(JOBS, {**base, **body}, format="json")
    assert response.status_code == 201, response.content
    answer = response.json()
    assert answer["admission"]["detail"].startswith("queued behind the 2 jobs the forecast plays forward")
    assert answer["estimate_detail"] == answer["admission"]["detail"]
    assert answer == as_detail_reads_it(answer["id"], user, answer["array_job_ids"])


@pytest.mark.parametrize(
    "body",
    [{"total_iters": 1000}, {"total_iters": 50_000, "qos_max_latency_s": 30 * 86400}],
    ids=["inside the window", "qos"],
)
def test_a_short_job_or_a_qos_job_is_the_workers(queued, body):
    base = {"name": "new", "workload": "res18", "num_gpus": 1}
    response = queued.post(JOBS, {**base, **body}, format="json")
    assert response.status_code == 201, response.content
    assert response.json()["admission"]["detail"] == FORECAST_PENDING
