"""The job API says as of when each estimate holds (`estimate_as_of`), read once per response."""

from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from rest_framework.fields import DateTimeField
from rest_framework.test import APIClient

from scheduler_app.models import JobForecast, JobState
from scheduler_app.services.forecast_as_of import forecast_confirm
from scheduler_app.services.forecasts import job_forecasts_refresh
from tests.api.helpers import make_server, submit, workload
from tests.factories import JobFactory

pytestmark = pytest.mark.django_db

JOBS = "/api/v1/jobs/"


@pytest.fixture(autouse=True)
def scheduler(settings):
    settings.ATTUNE_SCHEDULER = {**settings.ATTUNE_SCHEDULER, "policy": "fifo", "inline_rounds": False}
    workload("res18")
    make_server("gpu01", gpus=4, cpus=12, mem_gb=250)


@pytest.fixture
def api(user) -> APIClient:
    client = APIClient()
    client.force_authenticate(user)
    return client


def iso(at) -> str:
    return DateTimeField().to_representation(at)


def test_detail_and_list_say_as_of_the_last_finished_refresh_or_the_jobs_own_newer_forecast(user, api):
    waiting = [submit(user, gpus=4, name=f"w{i}") for i in range(3)]
    refreshed = timezone.now().replace(microsecond=0) - timedelta(minutes=25)
    job_forecasts_refresh(now=refreshed)
    # Submitted since: its own (admission) forecast is newer than the last refresh.
    newer = submit(user, name="newer")
    own = refreshed + timedelta(minutes=20)
    JobForecast.objects.create(job=newer, detail="", computed_at=own)
    not_yet = submit(user, name="no estimate yet")
    ended = JobFactory(owner=user, state=JobState.COMPLETED)

    detail = api.get(f"{JOBS}{waiting[-1].pk}/").json()
    assert detail["estimate_as_of"] == iso(refreshed)
    listed = {
        j["id"]: j["estimate_as_of"]
        for j in api.get(JOBS, {"state": ["PENDING", "COMPLETED"]}).json()["results"]
    }
    assert listed == {
        **{job.pk: iso(refreshed) for job in waiting},
        newer.pk: iso(own),
        not_yet.pk: None,
        ended.pk: None,
    }
    # A later refresh moves every unchanged estimate's as-of, without rewriting its row.
    later = refreshed + timedelta(minutes=22)
    forecast_confirm(later)
    assert api.get(f"{JOBS}{waiting[0].pk}/").json()["estimate_as_of"] == iso(later)
    assert api.get(f"{JOBS}{newer.pk}/").json()["estimate_as_of"] == iso(later)


def test_a_list_reads_the_confirmation_once_whatever_its_length(user, api):
    def queries() -> int:
        with CaptureQueriesContext(connection) as captured:
            assert api.get(JOBS).status_code == 200
        return len(captured.captured_queries)

    submit(user, name="one")
    job_forecasts_refresh(now=timezone.now())
    one = queries()
    for i in range(5):
        submit(user, name=f"more{i}")
    job_forecasts_refresh(now=timezone.now())
    assert queries() == one


def test_the_schema_documents_the_field(api):
    schema = api.get("/api/schema/", HTTP_ACCEPT="application/vnd.oai.openapi+json").json()
    field = schema["components"]["schemas"]["Job"]["properties"]["estimate_as_of"]
    assert field["format"] == "date-time" and field["nullable"] is True and field["readOnly"] is True
    assert "last forecast refresh that finished" in field["description"]
