"""GENIE's feedback: measured / predicted speed of ended jobs corrects every later estimate of time."""

from datetime import datetime, timedelta

import pytest
from django.utils import timezone
from rest_framework.test import APIClient

from profiles_app.models import SpeedObservation, Workload
from profiles_app.selectors import workload_profile
from profiles_app.services.speeds import SPEED_MIN_REPORTS, SPEED_RATIO_RANGE, job_speed_ratio
from scheduler_app.models import Job, JobState
from scheduler_app.services.job_control import job_finish
from scheduler_app.services.rounds import scheduling_round_run
from tests.api.helpers import agent_client, lease_of, make_server, observe, submit, synced, workload
from tests.factories import AllocationFactory

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("fifo_proportional_minute_rounds")]

JOBS = "/api/v1/jobs/"


@pytest.fixture
def server():
    return make_server("gpu01", gpus=4, cpus=12, mem_gb=250)


def placed(user, *, iters: int = 1000) -> Job:
    job = submit(user, gpus=1, iters=iters)
    scheduling_round_run()
    job.refresh_from_db()
    assert job.state == JobState.RUNNING
    return job


def correction(name: str = "res18") -> tuple[float, int]:
    w = Workload.objects.get(name=name)
    return w.speed_correction, w.speed_correction_jobs


def test_each_ended_job_moves_the_correction_a_fifth_of_the_way_to_what_was_measured(user, server):
    first = placed(user)
    observe(first, predicted=2.0, measured=1.0)
    job_finish(job=first, state=JobState.COMPLETED)
    assert correction() == (pytest.approx(0.8 * 1.0 + 0.2 * 0.5), 1)
    second = placed(user)
    observe(second, predicted=2.0, measured=1.0)
    job_finish(job=second, state=JobState.FAILED)  # a failed job's measured speed is still a measure
    assert correction() == (pytest.approx(0.8 * 0.9 + 0.2 * 0.5), 2)


def test_leases_count_by_their_reports(user, server):
    job = placed(user)
    observe(job, predicted=2.0, measured=1.0, samples=3)  # 3 reports at half speed
    job.refresh_from_db()
    other = SpeedObservation.objects.get(job=job)
    # A second lease of the same job (after a preemption), at full speed with one report.
    other.pk, other.allocation = None, None
    other.allocation = AllocationFactory(job=job, server=server, num_cpus=3, mem_gb=62.5)
    other.measured_iters_per_s, other.samples = 2.0, 1
    other.save()
    assert job_speed_ratio(job_id=job.pk) == pytest.approx((3 * 1.0 + 1 * 2.0) / (3 * 2.0 + 1 * 2.0))


def test_a_job_with_nothing_measured_changes_nothing(user, server):
    job = placed(user)
    job_finish(job=job, state=JobState.CANCELLED)
    assert correction() == (1.0, 0)


def test_a_job_measured_fewer_than_three_times_changes_nothing(user, server):
    job = placed(user)
    observe(job, predicted=2.0, measured=1.0, samples=SPEED_MIN_REPORTS - 1)  # start-up only
    job_finish(job=job, state=JobState.CANCELLED)
    assert correction() == (1.0, 0)


def test_an_absurd_measure_moves_the_correction_only_as_far_as_a_tenfold_error(user, server):
    job = placed(user)
    observe(job, predicted=1.0, measured=1e6)
    job_finish(job=job, state=JobState.COMPLETED)
    assert correction()[0] == pytest.approx(0.8 + 0.2 * SPEED_RATIO_RANGE[1])


def test_the_core_profile_takes_the_correction_into_its_time_per_iteration():
    wl = workload("res18")
    raw_iter_s = wl.iter_time_s
    Workload.objects.filter(pk=wl.pk).update(speed_correction=0.5)
    profile = workload_profile(Workload.objects.get(pk=wl.pk))
    assert profile.iter_time_s == pytest.approx(raw_iter_s / 0.5)
    assert profile.speedup == wl.speedup  # relative speeds stay as profiled


def test_measured_slowness_reaches_the_next_admission_forecast_through_the_agent_path(user, server):
    """A real round places a job, its agent reports half the predicted speed and the exit; the next
    submission of that workload is forecast at the corrected speed."""
    job = placed(user)
    lease = lease_of(job)
    predicted_ips = lease.speedup / job.workload.iter_time_s
    t0 = timezone.now()
    lease_id = str(lease.lease_id)

    def report(seq: int, kind: str, **data) -> dict:
        return {
            "lease_id": lease_id,
            "seq": seq,
            "kind": kind,
            "at": (t0 + timedelta(seconds=10 * seq)).isoformat(),
            "data": data,
        }

    reports = [report(1, "started", pid=1)]
    reports += [
        report(1 + n, "progress", done_iters=250 * n, iters_per_s=predicted_ips / 2)
        for n in range(1, SPEED_MIN_REPORTS + 1)
    ]
    reports.append(
        report(SPEED_MIN_REPORTS + 2, "exited", exit_code=0, signal=None, oom=False, done_iters=1000)
    )
    answer = synced(agent_client(server), reports=reports)
    assert len(answer["acked"]) == len(reports)
    job.refresh_from_db()
    assert job.state == JobState.COMPLETED
    r, jobs = correction()
    assert jobs == 1 and r == pytest.approx(0.8 + 0.2 * 0.5)

    api = APIClient()
    api.force_authenticate(user)
    body = api.post(
        JOBS, {"name": "next", "workload": "res18", "num_gpus": 1, "total_iters": 20000}, format="json"
    )
    assert body.status_code == 201, body.json()
    admission = body.json()["admission"]
    start = datetime.fromisoformat(admission["predicted_start_at"].replace("Z", "+00:00"))
    finish = datetime.fromisoformat(admission["predicted_finish_at"].replace("Z", "+00:00"))
    # Its run: the work at the corrected speed, after its start-up (the workload's, core/restarts.py).
    job.workload.refresh_from_db()
    run_s = 20000 * job.workload.iter_time_s / r + job.workload.startup_s
    assert (finish - start).total_seconds() == pytest.approx(run_s)
