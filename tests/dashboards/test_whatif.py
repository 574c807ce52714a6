"""The what-if page: form validation, a run through the Celery task to completion, the history trace."""

from __future__ import annotations

import re

import pytest
from django.urls import reverse

from cluster_app.models import Server
from profiles_app.models import Workload
from scheduler_app import tasks
from scheduler_app.dashboards.history import HistoryTrace, history_trace, trace_from_rows
from scheduler_app.dashboards.services import whatif_run_create, whatif_run_execute
from scheduler_app.models import Job, SimulationRun, SimulationStatus
from scheduler_app.services.simulations import SimulationRequest
from scheduler_app.simulator import TraceJob
from tests.api.helpers import make_server
from tests.dashboards.conftest import completed_job
from tests.factories import JobFactory, WorkloadFactory

pytestmark = pytest.mark.django_db

VALID = {
    "policies": ["fifo"],
    "allocators": ["proportional", "tune"],
    "trace_source": "generated",
    "workload": "philly",
    "num_jobs": "20",
    "jobs_per_hour": "9",
    "split_image_pct": "",
    "split_language_pct": "",
    "split_speech_pct": "",
    "seed": "3",
    "servers": "2",
    "gpus_per_server": "8",
    "cpus_per_server": "24",
    "mem_gb_per_server": "500",
    "round_s": "300",
}


def post(client, **changes):
    return client.post(reverse("dashboards:whatif"), {**VALID, **changes})


def test_the_form_offers_every_registered_policy_and_allocator(staff_client):
    html = staff_client.get(reverse("dashboards:whatif")).content.decode()
    for name in ("fifo", "srtf", "las", "proportional", "tune", "greedy"):
        assert f'value="{name}"' in html


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"policies": []}, "policies"),
        ({"allocators": ["nope"]}, "allocators"),
        ({"num_jobs": "0"}, "num_jobs"),
        ({"num_jobs": "many"}, "num_jobs"),
        ({"jobs_per_hour": "-2"}, "jobs_per_hour"),
        ({"servers": "0"}, "servers"),
        ({"split_image_pct": "50"}, "split_image_pct"),
        ({"split_image_pct": "0", "split_language_pct": "0", "split_speech_pct": "0"}, "split_image_pct"),
    ],
)
def test_bad_values_give_field_errors_and_keep_what_was_typed(staff_client, changes, field):
    response = post(staff_client, **changes)
    assert response.status_code == 200
    assert not SimulationRun.objects.exists()
    assert response.context["form"].errors[field]
    html = response.content.decode()
    assert f'id="id_{field}_errors"' in html
    assert 'value="3"' in html  # the seed typed before is still there


def test_too_big_a_grid_is_refused_as_a_whole(staff_client):
    response = post(
        staff_client,
        num_jobs="5000",
        policies=["fifo", "srtf", "las"],
        allocators=["tune", "greedy", "proportional"],
    )
    assert "too much for one run" in str(response.context["form"].non_field_errors())


def test_history_needs_recorded_jobs(staff_client):
    response = post(staff_client, trace_source="history")
    assert "no completed catalog job" in str(response.context["form"].errors["trace_source"])


def test_a_run_goes_through_the_task_to_its_results(
    staff_client, settings, django_capture_on_commit_callbacks
):
    settings.CELERY_TASK_ALWAYS_EAGER = True  # the task runs in-process once the run is committed
    with django_capture_on_commit_callbacks(execute=True):
        response = post(staff_client)
    run = SimulationRun.objects.get()
    assert response.status_code == 302 and response["Location"] == reverse(
        "dashboards:whatif_run", args=[run.pk]
    )
    run.refresh_from_db()
    assert run.status == SimulationStatus.SUCCEEDED, run.error
    assert run.progress == 1.0
    data = staff_client.get(reverse("dashboards:api_whatif_run", args=[run.pk])).json()
    assert data["status"] == "SUCCEEDED" and data["jobs"] == 20 and data["actual"] is None
    assert [(r["policy"], r["allocator"]) for r in data["runs"]] == [
        ("fifo", "proportional"),
        ("fifo", "tune"),
    ]
    assert all(r["finished_jobs"] == 20 and r["avg_jct_h"] > 0 for r in data["runs"])
    page = staff_client.get(reverse("dashboards:whatif_run", args=[run.pk]))
    assert page.status_code == 200 and b'data-metric="avg_jct_h"' in page.content
    # The philly trace has no QoS target: the page says why edf would match fifo and QoS is a dash.
    assert data["qos_jobs"] == 0
    assert b'<p id="whatif-no-qos" class="dash-help">No job of this trace' in page.content
    assert b"rounds every 5 min" in page.content
    listing = staff_client.get(reverse("dashboards:whatif")).content.decode()
    took = re.search(rf'href="/dashboards/whatif/{run.pk}/".*?<td>([^<]*)</td></tr>', listing, re.S)
    assert took and re.fullmatch(r"[0-9.]+ (s|min)", took.group(1))


def test_a_trace_with_qos_targets_has_no_such_note(staff_client):
    run = whatif_run_create(
        request=SimulationRequest(servers=1, num_jobs=5, workload="genie", allocators=("tune",))
    )
    run = whatif_run_execute(run_id=run.pk)
    assert run.status == SimulationStatus.SUCCEEDED, run.error
    assert staff_client.get(reverse("dashboards:api_whatif_run", args=[run.pk])).json()["qos_jobs"] == 5
    page = staff_client.get(reverse("dashboards:whatif_run", args=[run.pk])).content.decode()
    assert '<p id="whatif-no-qos" class="dash-help" hidden>' in page


def test_policies_and_allocators_are_explained_on_hover(staff_client):
    html = staff_client.get(reverse("dashboards:whatif")).content.decode()
    assert '<abbr class="term" title="First in, first out' in html
    assert 'title="Synergy-TUNE: best-case cores' in html


def test_the_task_runs_a_queued_run_once():
    run = whatif_run_create(request=SimulationRequest(servers=1, num_jobs=5, allocators=("tune",)))
    assert tasks.simulation_run_task.apply(args=(run.pk,)).get() == SimulationStatus.SUCCEEDED
    assert tasks.simulation_run_task.apply(args=(run.pk,)).get() is None  # redelivered: already claimed


def test_a_history_run_replays_the_recorded_jobs_beside_what_happened():
    res18 = WorkloadFactory(name="res18")
    completed_job(submitted_h=0, finished_h=2, workload=res18, num_gpus=1, total_iters=500)
    completed_job(submitted_h=1, finished_h=5, workload=res18, num_gpus=2, total_iters=800)
    JobFactory(workload=None, command="./train.sh", state="COMPLETED", finished_at=None)  # not finished
    unprofiled = WorkloadFactory(name="my-model", tput_matrix=[])
    completed_job(submitted_h=0, finished_h=1, workload=unprofiled)  # no profile yet: skipped
    history = history_trace(max_jobs=10)
    assert [(j.model, j.arrival_s, j.total_iters, j.num_gpus) for j in history.jobs] == [
        ("res18", 0.0, 500, 1),
        ("res18", 3600.0, 800, 2),
    ]
    assert history.skipped == 1
    # Who submitted each job replays too (fair share), and survives the stored run's round trip.
    owners = list(Job.objects.filter(pk__in=[j.job_id for j in history.jobs]).order_by("submitted_at"))
    assert [j.owner_id for j in history.jobs] == [job.owner_id for job in owners]
    assert trace_from_rows(history.rows()) == history.jobs
    assert trace_from_rows([[1, "res18", 0.0, 10, 1, None]])[0].owner_id is None  # stored before owners
    assert history.actual["avg_jct_h"] == 3.0 and history.actual["makespan_h"] == 5.0
    run = whatif_run_create(request=SimulationRequest(servers=1, allocators=("tune",)), history=history)
    run = whatif_run_execute(run_id=run.pk)
    assert run.status == SimulationStatus.SUCCEEDED
    (result,) = run.results["runs"]
    assert result["jobs"] == 2 and result["finished_jobs"] == 2
    assert run.parameters["extra"]["actual"]["makespan_h"] == 5.0


def test_a_history_recorded_on_fake_nodes_is_replayed_and_shown_in_the_jobs_own_time(staff_client):
    """The demo's agents run jobs 20 times faster than their profiles (time scale 0.05); the replay
    plays the profiles, so what happened is shown in the jobs' own time too, and the page says so."""
    make_server("gpu01", gpus=4, cpus=12, mem_gb=250)
    res18 = WorkloadFactory(name="res18")
    completed_job(submitted_h=0, finished_h=0.1, workload=res18, num_gpus=1, total_iters=500)
    completed_job(submitted_h=0.05, finished_h=0.25, workload=res18, num_gpus=1, total_iters=800)
    real = history_trace(max_jobs=10)
    Server.objects.update(time_scale=0.05)
    fake = history_trace(max_jobs=10)
    assert [j.arrival_s for j in real.jobs] == [0.0, 180.0]
    assert [j.arrival_s for j in fake.jobs] == [0.0, 3600.0]  # 3 min of wall time, an hour of theirs
    assert fake.actual["avg_jct_h"] == pytest.approx(20 * real.actual["avg_jct_h"])
    assert fake.actual["makespan_h"] == pytest.approx(5.0) and fake.actual["time_scale"] == 0.05
    run = whatif_run_create(request=SimulationRequest(servers=1, allocators=("tune",)), history=fake)
    run = whatif_run_execute(run_id=run.pk)
    page = staff_client.get(reverse("dashboards:whatif_run", args=[run.pk])).content.decode()
    assert "ran on fake nodes 20 times faster than their profiles" in page
    assert "wall time x 20)" in page
    real_run = whatif_run_create(request=SimulationRequest(servers=1, allocators=("tune",)), history=real)
    page = staff_client.get(reverse("dashboards:whatif_run", args=[real_run.pk])).content.decode()
    assert 'id="whatif-time-scale"' not in page


def test_history_replays_the_clusters_own_profiles_with_their_speed_correction():
    """A workload profiled on this cluster (not in the shipped catalog) replays; so does its learnt
    speed: measured at half its profile, its job takes twice as long in the replay. The profiles are
    stored with the run, so a later change does not change what the run replays."""
    mine = WorkloadFactory(name="users-cnn")  # res18's matrix under another name
    completed_job(submitted_h=0, finished_h=2, workload=mine, num_gpus=1, total_iters=5000)

    def replay() -> float:
        history = history_trace(max_jobs=10)
        assert [j.model for j in history.jobs] == ["users-cnn"] and history.skipped == 0
        run = whatif_run_create(
            request=SimulationRequest(servers=1, allocators=("proportional",)), history=history
        )
        run = whatif_run_execute(run_id=run.pk)
        assert run.status == SimulationStatus.SUCCEEDED, run.error
        return run.results["runs"][0]["avg_jct_h"]

    as_profiled = replay()
    assert as_profiled == pytest.approx(5000 * mine.iter_time_s / 3600, abs=300 / 3600)
    Workload.objects.filter(pk=mine.pk).update(speed_correction=0.5)
    history = history_trace(max_jobs=10)
    assert history.profiles["users-cnn"].iter_time_s == pytest.approx(2 * mine.iter_time_s)
    stored = whatif_run_create(
        request=SimulationRequest(servers=1, allocators=("proportional",)), history=history
    )
    assert replay() == pytest.approx(2 * as_profiled, rel=0.1)
    Workload.objects.filter(pk=mine.pk).update(speed_correction=1.0)  # changed after the run was asked for
    stored = whatif_run_execute(run_id=stored.pk)
    assert stored.results["runs"][0]["avg_jct_h"] == pytest.approx(2 * as_profiled, rel=0.1)


def test_a_failing_run_records_its_error_for_the_page(staff_client):
    history = HistoryTrace(jobs=[TraceJob(1, "no-such-model", 0.0, 100, 1)], skipped=0, actual={"jobs": 1})
    run = whatif_run_create(request=SimulationRequest(servers=1, allocators=("tune",)), history=history)
    with pytest.raises(ValueError, match="no-such-model"):
        whatif_run_execute(run_id=run.pk)
    data = staff_client.get(reverse("dashboards:api_whatif_run", args=[run.pk])).json()
    assert data["status"] == "FAILED" and "no-such-model" in data["error"]


def test_an_unreadable_stored_trace_fails_the_run():
    run = whatif_run_create(request=SimulationRequest(servers=1, allocators=("tune",)))
    run.parameters["extra"] = {"trace_source": "history", "history_trace": [["x"]]}
    run.save()
    with pytest.raises(ValueError):
        whatif_run_execute(run_id=run.pk)
    run.refresh_from_db()
    assert run.status == SimulationStatus.FAILED and "unreadable" in run.error
