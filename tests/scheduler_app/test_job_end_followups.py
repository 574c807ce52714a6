"""A job's end follow-ups (services/job_end.py): with workers, left by job_finish to the applier and
run by it exactly once, after the job's pending reports; one job's failing follow-up holding back
no other job's; without workers, run within job_finish."""

from __future__ import annotations

import pytest
from django.utils import timezone

from notify_app.models import Notification
from profiles_app.models import Workload
from scheduler_app.models import AdmissionPrediction, JobEndPending, JobState
from scheduler_app.services import job_end
from scheduler_app.services.job_control import job_finish
from scheduler_app.services.report_apply import LeaseReport
from scheduler_app.services.report_ingest import agent_reports_ingest
from scheduler_app.services.rounds import scheduling_round_run
from scheduler_app.tasks import agent_reports_apply_task
from tests.api.helpers import lease_of, make_server, observe, submit
from tests.notify_app.helpers import opt_in

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("fifo_proportional_minute_rounds")]


@pytest.fixture
def deferred(settings):
    """Workers' mode with the default applier period (as in test_report_applier.py)."""
    settings.ATTUNE_SCHEDULER = {**settings.ATTUNE_SCHEDULER, "inline_rounds": False, "progress_apply_s": 2.0}


@pytest.fixture(autouse=True)
def server(db):
    return make_server("gpu01", gpus=4, cpus=12, mem_gb=250)


@pytest.fixture(autouse=True)
def no_broker(monkeypatch):
    """Notifications handed to Celery are dropped: these tests read the rows."""
    from config import celery_app

    monkeypatch.setattr(celery_app, "send_task", lambda *args, **kwargs: None)


def placed(user, *, iters: int = 1000):
    job = submit(user, gpus=1, iters=iters)
    scheduling_round_run()
    job.refresh_from_db()
    assert job.state == JobState.RUNNING
    return job


def correction() -> tuple[float, int]:
    w = Workload.objects.get(name="res18")
    return w.speed_correction, w.speed_correction_jobs


def test_with_workers_the_applier_runs_them_once(user, deferred):
    user.email = "ada@example.org"
    user.save(update_fields=["email"])
    opt_in(user)
    job = placed(user)
    AdmissionPrediction.objects.create(job=job, policy="fifo", allocator="proportional")
    observe(job, predicted=2.0, measured=1.0)
    job_finish(job=job, state=JobState.COMPLETED)
    # The end itself is recorded; its follow-ups wait.
    job.refresh_from_db()
    assert job.state == JobState.COMPLETED and job.finished_at is not None
    assert correction() == (1.0, 0) and not Notification.objects.filter(job=job).exists()
    assert AdmissionPrediction.objects.get(job=job).actual_finish_at is None
    assert list(JobEndPending.objects.values_list("job_id", "state")) == [(job.pk, JobState.COMPLETED)]

    assert job_end.job_end_followups_run() == 1
    assert correction() == (pytest.approx(0.8 * 1.0 + 0.2 * 0.5), 1)
    assert Notification.objects.filter(job=job).count() == 1  # email, the one channel opted in
    assert AdmissionPrediction.objects.get(job=job).actual_finish_at == job.finished_at
    assert not JobEndPending.objects.exists()
    # Run again: nothing left, nothing folded twice.
    assert job_end.job_end_followups_run() == 0
    assert correction() == (pytest.approx(0.9), 1)


def test_jobs_of_one_workload_ended_together_each_count(user, deferred, monkeypatch):
    jobs = [placed(user) for _ in range(3)]
    for job in jobs:
        observe(job, predicted=2.0, measured=1.0)
        job_finish(job=job, state=JobState.COMPLETED)
    refits: list[int] = []
    monkeypatch.setattr(job_end, "placement_penalty_refit", lambda *, workload_id: refits.append(workload_id))
    assert job_end.job_end_followups_run() == 3
    expected = 1.0
    for _ in jobs:
        expected = 0.8 * expected + 0.2 * 0.5
    assert correction() == (pytest.approx(expected), 3)
    # The placement fit reads the workload's latest leases: once for the three.
    assert refits == [jobs[0].workload_id]
    assert not Notification.objects.exists()  # their owner asked for none


def test_one_jobs_failing_followup_holds_back_only_its_own(user, deferred, monkeypatch, caplog):
    bad, good = placed(user), placed(user)
    for job in (bad, good):
        observe(job, predicted=2.0, measured=1.0)
        job_finish(job=job, state=JobState.COMPLETED)
    real_record = job_end.admission_outcome_record

    def broken_for_bad(*, job):
        if job.pk == bad.pk:
            raise RuntimeError("a bug")
        real_record(job=job)

    monkeypatch.setattr(job_end, "admission_outcome_record", broken_for_bad)
    assert job_end.job_end_followups_run() == 1
    assert list(JobEndPending.objects.values_list("job_id", flat=True)) == [bad.pk]
    assert correction() == (pytest.approx(0.9), 1)  # good's fold; bad's was rolled back with its batch
    assert f"job {bad.pk}: the follow-ups of its end failed" in caplog.text
    # Mended: the next run follows bad's end up, once.
    monkeypatch.setattr(job_end, "admission_outcome_record", real_record)
    assert job_end.job_end_followups_run() == 1
    assert correction() == (pytest.approx(0.8 * 0.9 + 0.2 * 0.5), 2) and not JobEndPending.objects.exists()


def test_an_exit_reported_in_a_sync_is_learnt_from_by_the_applier_task(user, deferred):
    job = placed(user, iters=100)
    observe(job, predicted=2.0, measured=1.0)
    lease = lease_of(job)
    exited = LeaseReport(lease.lease_id, 1, "exited", timezone.now(), {"exit_code": 0, "done_iters": 100})
    outcome = agent_reports_ingest(server=lease.server, reports=[exited])  # an exit is applied in its sync
    assert outcome.applied == 1
    job.refresh_from_db()
    assert job.state == JobState.COMPLETED and correction() == (1.0, 0)
    agent_reports_apply_task()
    assert correction() == (pytest.approx(0.9), 1) and not JobEndPending.objects.exists()


def test_without_workers_they_run_within_job_finish(user):
    job = placed(user)
    observe(job, predicted=2.0, measured=1.0)
    job_finish(job=job, state=JobState.COMPLETED)
    assert correction() == (pytest.approx(0.9), 1) and not JobEndPending.objects.exists()
