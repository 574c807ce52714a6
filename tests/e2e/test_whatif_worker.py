"""A what-if simulation submitted from the dashboard runs on a real Celery worker (`forecasts` queue)."""

from __future__ import annotations

from django.test import Client
from django.urls import reverse

from scheduler_app.models import SimulationRun, SimulationStatus
from tests.dashboards.test_whatif import VALID
from tests.e2e.processes import wait_until
from tests.factories import UserFactory


def test_a_what_if_run_goes_through_a_real_worker(worker):
    client = Client()
    client.force_login(UserFactory(is_staff=True))
    response = client.post(reverse("dashboards:whatif"), {**VALID, "num_jobs": "30"})
    run = SimulationRun.objects.get()
    assert response.status_code == 302 and response["Location"] == reverse(
        "dashboards:whatif_run", args=[run.pk]
    )

    def done() -> bool:
        run.refresh_from_db()
        return run.status in (SimulationStatus.SUCCEEDED, SimulationStatus.FAILED)

    try:
        wait_until(done, timeout_s=90, what=f"the worker to finish what-if run {run.pk}")
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{worker.log_text()}") from None
    assert run.status == SimulationStatus.SUCCEEDED, run.error
    assert run.progress == 1.0 and run.started_at is not None
    data = client.get(reverse("dashboards:api_whatif_run", args=[run.pk])).json()
    assert [(r["policy"], r["allocator"]) for r in data["runs"]] == [
        ("fifo", "proportional"),
        ("fifo", "tune"),
    ]
    assert all(r["finished_jobs"] == 30 for r in data["runs"])
