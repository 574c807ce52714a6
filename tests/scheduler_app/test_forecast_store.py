"""The stored forecast's writer (services/forecast_store.py): new rows' positions, ended jobs left out."""

from datetime import timedelta

import pytest
from django.utils import timezone

from scheduler_app.models import Job, JobForecast, JobState
from scheduler_app.services import forecast_store
from scheduler_app.services.forecast_store import Estimate, job_forecasts_store
from tests.api.helpers import submit

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize("postgresql", [True, False], ids=["postgresql", "portable (the demo's SQLite)"])
def test_new_rows_take_the_given_positions_and_stored_ones_keep_theirs(
    user, gpu01_res18, monkeypatch, postgresql
):
    if not postgresql:
        monkeypatch.setattr(forecast_store, "is_postgresql", lambda: False)
    old, new = submit(user, name="old"), submit(user, name="new")
    now = timezone.now()
    job_forecasts_store({old.pk: Estimate(None, None, "before")}, now=now, positions={old.pk: 7})
    later = now + timedelta(hours=1)
    estimates = {old.pk: Estimate(later, None, "after"), new.pk: Estimate(later, None, "after")}
    assert job_forecasts_store(estimates, now=now, new_positions={old.pk: 1, new.pk: 2}) == 2
    rows = {f.job_id: (f.detail, f.position) for f in JobForecast.objects.all()}
    assert rows == {old.pk: ("after", 7), new.pk: ("after", 2)}


@pytest.mark.parametrize("postgresql", [True, False], ids=["postgresql", "portable (the demo's SQLite)"])
def test_live_only_leaves_out_the_jobs_that_ended(user, gpu01_res18, monkeypatch, postgresql):
    if not postgresql:
        monkeypatch.setattr(forecast_store, "is_postgresql", lambda: False)
    running, ended = submit(user, name="running"), submit(user, name="ended")
    Job.objects.filter(pk=ended.pk).update(state=JobState.COMPLETED)
    estimates = {running.pk: Estimate(None, None, "x"), ended.pk: Estimate(None, None, "x")}
    assert job_forecasts_store(estimates, now=timezone.now(), live_only=True) == 1
    assert list(JobForecast.objects.values_list("job_id", flat=True)) == [running.pk]
    assert job_forecasts_store(estimates, now=timezone.now()) == 1  # without: every row written
    assert JobForecast.objects.filter(job=ended).exists()
