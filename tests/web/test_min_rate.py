"""The minimum-rate QoS target on the web: the submit form's field and its errors, the job page."""

from __future__ import annotations

import pytest

from scheduler_app.models import AdmissionPrediction, Job, JobState
from tests.web.conftest import pending_job
from tests.web.test_submit import URL, field_errors

pytestmark = pytest.mark.django_db


def test_the_form_submits_a_min_rate(user, client_of, cluster, no_rounds):
    body = {
        "name": "r",
        "workload": "res18",
        "num_gpus": "1",
        "total_iters": "10",
        "qos_min_rate_iters_per_s": "2.5",
    }
    response = client_of(user).post(URL, body)
    job = Job.objects.get()
    assert response.status_code == 302 and job.qos_min_rate_iters_per_s == 2.5
    assert 'id="id_qos_min_rate_iters_per_s"' in client_of(user).get(URL).content.decode()


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (
            {"qos_min_rate_iters_per_s": "0"},
            "The minimum rate must be a positive number of iterations per second.",
        ),
        (
            {"qos_min_rate_iters_per_s": "-1"},
            "The minimum rate must be a positive number of iterations per second.",
        ),
        ({"qos_min_rate_iters_per_s": "fast"}, "Enter a number."),
        (
            {"qos_min_rate_iters_per_s": "1", "qos_max_latency_s": "6h"},
            "Give one QoS target: a deadline, a maximum latency or a minimum rate, not two.",
        ),
    ],
)
def test_bad_rates_are_placed_on_their_field(user, client_of, cluster, data, message):
    body = {"name": "j", "workload": "res18", "num_gpus": "1", "total_iters": "10", **data}
    html = client_of(user).post(URL, body).content.decode()
    assert not Job.objects.exists()
    assert message in field_errors(html, "qos_min_rate_iters_per_s")


def test_the_job_page_shows_the_rate_target_and_its_outcome(user, client_of, cluster):
    job = pending_job(user, qos_min_rate_iters_per_s=1.5, state=JobState.COMPLETED)
    AdmissionPrediction.objects.create(
        job=job,
        policy="swaf",
        allocator="genie",
        attainable=False,
        measured_iters_per_s=1.25,
        met_min_rate=False,
    )
    html = client_of(user).get(f"/jobs/{job.pk}/").content.decode()
    assert "at least 1.5 iterations/s while running" in html
    assert "predicted to run below its minimum rate on average" in html
    assert '<dd id="min-rate-outcome"><span class="warn">missed</span>' in html
    assert "measured 1.250 iterations/s over its leases, target 1.5" in html
