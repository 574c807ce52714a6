"""Reports stored by a sync, applied within it or by the worker's applier (services/report_ingest.py):
progress left pending and applied for all servers at once, in order with what comes after it, never
twice; jobs another transaction holds skipped and applied on the next run; one job's bad report
holding back no other job's."""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest
from django.db import connection, transaction
from django.utils import timezone

from scheduler_app.models import AgentReport, AgentReportPending, Allocation, Job, JobState
from scheduler_app.services import report_ingest
from scheduler_app.services.report_apply import LeaseReport
from scheduler_app.services.report_ingest import (
    agent_reports_apply_run,
    agent_reports_ingest,
)
from tests.factories import AllocationFactory, JobFactory, ServerFactory, hold_gpus

pytestmark = pytest.mark.django_db


@pytest.fixture
def deferred(settings):
    """Workers' mode with the default applier period: syncs leave progress alone to the applier."""
    settings.ATTUNE_SCHEDULER = {**settings.ATTUNE_SCHEDULER, "inline_rounds": False, "progress_apply_s": 2.0}


def running_lease(server=None, *, minutes_ago: float = 5.0) -> Allocation:
    started = timezone.now() - timedelta(minutes=minutes_ago)
    job = JobFactory(state=JobState.RUNNING, total_iters=1000, started_at=started)
    lease = AllocationFactory(job=job, server=server or ServerFactory(), started_at=started)
    hold_gpus(lease, *lease.server.gpus.filter(holds__isnull=True).order_by("index")[:2])
    return lease


def progress(lease: Allocation, seq: int, done: int, *, seconds_ago: float = 0.0, **data) -> LeaseReport:
    at = timezone.now() - timedelta(seconds=seconds_ago)
    return LeaseReport(lease.lease_id, seq, "progress", at, {"done_iters": done, **data})


def pending_count() -> int:
    return AgentReportPending.objects.count()


def test_a_start_is_stored_acknowledged_and_left_to_the_applier_like_progress(deferred):
    """No command depends on the agent's start (the answer that carried it marked the lease)."""
    lease = running_lease()
    started = LeaseReport(lease.lease_id, 1, "started", lease.started_at, {"pid": 1})
    outcome = agent_reports_ingest(server=lease.server, reports=[started])
    assert outcome.acked == [(str(lease.lease_id), 1)] and outcome.applied == 0 and pending_count() == 1
    lease.refresh_from_db()
    assert lease.agent_started_at is None
    assert agent_reports_apply_run() == 1
    lease.refresh_from_db()
    assert lease.agent_started_at == started.at and lease.accounted_until == started.at
    assert pending_count() == 0


def test_progress_alone_is_stored_acknowledged_and_left_to_the_applier(deferred):
    lease = running_lease()
    started = LeaseReport(lease.lease_id, 1, "started", lease.started_at, {"pid": 1})
    agent_reports_ingest(server=lease.server, reports=[started])
    assert agent_reports_apply_run() == 1  # the start, left to the applier
    report = progress(lease, 2, 100, seconds_ago=60)
    outcome = agent_reports_ingest(server=lease.server, reports=[report])
    assert outcome.acked == [(str(lease.lease_id), 2)] and outcome.applied == 0
    job = Job.objects.get(pk=lease.job_id)
    assert job.done_iters == 0 and job.attained_service_gpu_s == 0 and pending_count() == 1
    assert agent_reports_apply_run() == 1
    job.refresh_from_db()
    assert job.done_iters == 100 and pending_count() == 0
    credited_s = 2 * (report.at - lease.started_at).total_seconds()
    assert job.attained_service_gpu_s == pytest.approx(credited_s)
    # The same report again: acknowledged, stored once, applied never again.
    again = agent_reports_ingest(server=lease.server, reports=[report])
    assert again.acked == [(str(lease.lease_id), 2)] and pending_count() == 0
    assert agent_reports_apply_run() == 0
    job.refresh_from_db()
    assert job.attained_service_gpu_s == pytest.approx(credited_s) and AgentReport.objects.count() == 2


def test_the_applier_applies_every_servers_progress_in_one_run(deferred):
    leases = [running_lease() for _ in range(3)]
    for i, lease in enumerate(leases):
        agent_reports_ingest(server=lease.server, reports=[progress(lease, 1, 10 * (i + 1))])
    assert pending_count() == 3
    assert agent_reports_apply_run() == 3
    assert sorted(Job.objects.values_list("done_iters", flat=True)) == [10, 20, 30]


def test_with_the_applier_off_a_sync_applies_its_own_progress(settings):
    settings.ATTUNE_SCHEDULER = {**settings.ATTUNE_SCHEDULER, "inline_rounds": False, "progress_apply_s": 0}
    lease = running_lease()
    outcome = agent_reports_ingest(server=lease.server, reports=[progress(lease, 1, 100)])
    assert outcome.applied == 1 and pending_count() == 0
    assert Job.objects.get(pk=lease.job_id).done_iters == 100


def test_inline_mode_never_defers_there_is_no_worker(settings):
    settings.ATTUNE_SCHEDULER = {**settings.ATTUNE_SCHEDULER, "inline_rounds": True, "progress_apply_s": 2.0}
    lease = running_lease()
    assert agent_reports_ingest(server=lease.server, reports=[progress(lease, 1, 100)]).applied == 1
    assert Job.objects.get(pk=lease.job_id).done_iters == 100


def test_an_exit_is_applied_in_its_sync_after_the_progress_left_pending_before_it(deferred):
    """The exit's batch applies the lease's earlier start and progress first, in seq order: the speed
    it measured and the GPU time up to it are credited before the exit's own figures."""
    lease = running_lease(minutes_ago=10)
    started = LeaseReport(lease.lease_id, 1, "started", lease.started_at, {"pid": 1})
    agent_reports_ingest(server=lease.server, reports=[started])
    agent_reports_ingest(
        server=lease.server, reports=[progress(lease, 2, 400, seconds_ago=120, iters_per_s=2.0)]
    )
    assert pending_count() == 2
    exited = LeaseReport(lease.lease_id, 3, "exited", timezone.now(), {"exit_code": 0, "done_iters": 1000})
    outcome = agent_reports_ingest(server=lease.server, reports=[exited])
    assert outcome.applied == 3 and pending_count() == 0
    job = Job.objects.get(pk=lease.job_id)
    assert job.state == JobState.COMPLETED and job.done_iters == 1000
    lease.refresh_from_db()
    assert lease.iters_per_s == 2.0 and lease.exited_at is not None
    assert lease.agent_started_at == started.at
    # GPU time from the lease's start to the exit, once: nothing counted twice or skipped between.
    assert lease.num_gpus == 2
    expected_s = 2 * (exited.at - lease.started_at).total_seconds()
    assert job.attained_service_gpu_s == pytest.approx(expected_s)


def test_an_exits_sync_applies_its_own_job_and_leaves_the_other_leases_reports_to_the_applier(deferred):
    """What the commands read is the exit; the other leases' progress and starts that its sync carries
    wait for the applier, as they would in a sync without the exit."""
    ending = running_lease(minutes_ago=10)
    other = running_lease(ending.server)
    started = LeaseReport(other.lease_id, 1, "started", other.started_at, {"pid": 2})
    exited = LeaseReport(ending.lease_id, 1, "exited", timezone.now(), {"exit_code": 0, "done_iters": 1000})
    outcome = agent_reports_ingest(server=ending.server, reports=[progress(other, 2, 300), started, exited])
    assert outcome.applied == 1 and len(outcome.acked) == 3 and pending_count() == 2
    assert Job.objects.get(pk=ending.job_id).state == JobState.COMPLETED
    assert Job.objects.get(pk=other.job_id).done_iters == 0
    assert agent_reports_apply_run() == 2
    other.refresh_from_db()
    assert other.agent_started_at == started.at and Job.objects.get(pk=other.job_id).done_iters == 300


def test_with_the_applier_off_an_exits_sync_applies_the_whole_batch(settings):
    settings.ATTUNE_SCHEDULER = {**settings.ATTUNE_SCHEDULER, "inline_rounds": False, "progress_apply_s": 0}
    ending = running_lease(minutes_ago=10)
    other = running_lease(ending.server)
    exited = LeaseReport(ending.lease_id, 1, "exited", timezone.now(), {"exit_code": 0, "done_iters": 1000})
    outcome = agent_reports_ingest(server=ending.server, reports=[progress(other, 1, 300), exited])
    assert outcome.applied == 2 and pending_count() == 0
    assert Job.objects.get(pk=other.job_id).done_iters == 300


def test_log_lines_go_with_progress_and_an_exit_brings_them_in_first(deferred):
    """A job prints all the time: log lines wait for the applier like progress (were they urgent, nearly
    every sync would apply within itself). The exit applies them, in order, before itself."""
    lease = running_lease()

    def log(seq: int, *lines: str) -> LeaseReport:
        return LeaseReport(lease.lease_id, seq, "log", timezone.now(), {"lines": list(lines)})

    outcome = agent_reports_ingest(server=lease.server, reports=[log(1, "epoch 1"), progress(lease, 2, 10)])
    assert outcome.applied == 0 and pending_count() == 2
    agent_reports_ingest(server=lease.server, reports=[log(3, "epoch 2")])
    lease.refresh_from_db()
    assert lease.log_tail == ""
    # The agent ships a job's last output before its exit: the whole of this batch and what waited.
    exited = LeaseReport(lease.lease_id, 5, "exited", timezone.now(), {"exit_code": 1, "done_iters": 20})
    assert agent_reports_ingest(server=lease.server, reports=[log(4, "Traceback"), exited]).applied == 5
    lease.refresh_from_db()
    assert lease.log_tail.splitlines() == ["epoch 1", "epoch 2", "Traceback"] and pending_count() == 0
    assert Job.objects.get(pk=lease.job_id).state == JobState.FAILED


def test_a_bad_report_holds_back_only_its_own_job(deferred, monkeypatch, caplog):
    good, bad = running_lease(), running_lease()
    for lease in (good, bad):
        agent_reports_ingest(server=lease.server, reports=[progress(lease, 1, 50)])
    real_apply = report_ingest.reports_apply

    def failing_for_bad(reports, *, now, jobs):
        if bad.job_id in jobs:
            raise RuntimeError("a bug in applying this job's reports")
        return real_apply(reports, now=now, jobs=jobs)

    monkeypatch.setattr(report_ingest, "reports_apply", failing_for_bad)
    assert agent_reports_apply_run() == 1
    assert Job.objects.get(pk=good.job_id).done_iters == 50
    assert Job.objects.get(pk=bad.job_id).done_iters == 0
    assert f"job {bad.job_id}: pending agent reports could not be applied" in caplog.text
    # Still pending, so once the bug is gone the next run applies it.
    assert pending_count() == 1
    monkeypatch.setattr(report_ingest, "reports_apply", real_apply)
    assert agent_reports_apply_run() == 1
    assert Job.objects.get(pk=bad.job_id).done_iters == 50


def test_a_batch_that_fails_to_apply_in_its_sync_is_kept_for_the_applier(settings, monkeypatch, caplog):
    """Stored is acknowledged: a failure in applying (here a statement the database refuses) rolls back
    the application only, and the applier applies the reports afterwards."""
    settings.ATTUNE_SCHEDULER = {**settings.ATTUNE_SCHEDULER, "inline_rounds": False, "progress_apply_s": 0}
    lease = running_lease()

    def failing(reports, *, now, jobs):
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1 / 0")

    with monkeypatch.context() as m:
        m.setattr(report_ingest, "reports_apply", failing)
        m.setattr(report_ingest, "agent_reports_apply_request", lambda: None)
        outcome = agent_reports_ingest(server=lease.server, reports=[progress(lease, 1, 70)])
    assert outcome.acked == [(str(lease.lease_id), 1)] and outcome.applied == 0
    assert "reports stored but not applied" in caplog.text and pending_count() == 1
    assert agent_reports_apply_run() == 1
    assert Job.objects.get(pk=lease.job_id).done_iters == 70


def _holding(job_ids: list[int]):
    """A thread holding the jobs' rows as a round's apply step does, until released."""
    from scheduler_app.selectors.round_jobs import round_jobs_recheck

    locked, release = threading.Event(), threading.Event()

    def hold():
        try:
            with transaction.atomic():
                round_jobs_recheck(job_ids)
                locked.set()
                release.wait(30)
        finally:
            connection.close()

    thread = threading.Thread(target=hold)
    thread.start()
    assert locked.wait(10)
    return thread, release


@pytest.mark.skipif(connection.vendor != "postgresql", reason="row locks and lock_timeout are PostgreSQL's")
@pytest.mark.django_db(transaction=True)
def test_reports_whose_jobs_a_round_holds_are_acknowledged_and_applied_after_it(deferred, monkeypatch):
    """Neither the web thread nor the applier waits for a round: a start or an exit waits 100 ms and is
    left pending (acknowledged: the agent need not send it again), the applier asked to run; the
    applier skips the held jobs; once the round commits, its next run applies everything, in order."""
    from cluster_app.services import UsageReport
    from scheduler_app.services.agent_sync import SyncRequest, agent_sync

    held, free = running_lease(), running_lease()
    asked: list[bool] = []
    monkeypatch.setattr(report_ingest, "agent_reports_apply_request", lambda: asked.append(True))

    def sync(lease, *reports):
        usage = UsageReport(sampled_at=timezone.now(), cpu_util_pct=1.0, mem_used_gb=1.0)
        return agent_sync(server=lease.server, request=SyncRequest(usage=usage, reports=list(reports)))

    thread, release = _holding([held.job_id])
    try:
        first = progress(held, 1, 10, seconds_ago=30)
        assert sync(held, first).reports.acked == [(str(held.lease_id), 1)]
        assert not asked  # progress goes to the applier anyway
        exited = LeaseReport(held.lease_id, 2, "exited", timezone.now(), {"exit_code": 0, "done_iters": 1000})
        answer = sync(held, exited).reports
        assert answer.acked == [(str(held.lease_id), 2)] and answer.applied == 0
        assert asked == [True]
        agent_reports_ingest(server=free.server, reports=[progress(free, 1, 5)])
        # The applier runs meanwhile: it applies the free job and skips the held one.
        assert agent_reports_apply_run() == 1
        assert Job.objects.get(pk=free.job_id).done_iters == 5
        assert Job.objects.get(pk=held.job_id).state == JobState.RUNNING and pending_count() == 2
    finally:
        release.set()
        thread.join(30)
    assert agent_reports_apply_run() == 2
    job = Job.objects.get(pk=held.job_id)
    assert job.state == JobState.COMPLETED and job.done_iters == 1000 and pending_count() == 0
    assert AgentReport.objects.count() == 3


def test_pending_reports_are_found_by_key_not_by_reading_the_report_history(deferred):
    """The work list churns faster than autovacuum analyzes it, so PostgreSQL overestimates it; the
    reports must still be found through their primary key, not by scanning every report ever stored."""
    if connection.vendor != "postgresql":
        pytest.skip("the plan is PostgreSQL's")
    from django.test.utils import CaptureQueriesContext

    from scheduler_app.selectors.agent_reports import pending_reports

    lease = running_lease()
    report_table, pending_table = AgentReport._meta.db_table, AgentReportPending._meta.db_table
    with connection.cursor() as cursor:
        # Days of history, analyzed; and a work list that churned: 40,000 rows come and gone.
        cursor.execute(
            f"INSERT INTO {report_table}"
            f" (allocation_id, lease_id, seq, kind, at, data, batch_id, received_at)"
            f" SELECT %s, %s, s, 'progress', now(), '{{}}', gen_random_uuid(), now()"
            f" FROM generate_series(1000, 40999) s",
            [lease.pk, lease.lease_id],
        )
        cursor.execute(f"INSERT INTO {pending_table} (report_id, job_id) SELECT id, 0 FROM {report_table}")
        cursor.execute(f"DELETE FROM {pending_table}")
        cursor.execute(f"ANALYZE {report_table}")
    agent_reports_ingest(server=lease.server, reports=[progress(lease, 1, 10), progress(lease, 2, 20)])
    with CaptureQueriesContext(connection) as queries:
        found = pending_reports(job_ids=[lease.job_id])
    assert sorted(r.seq for r in found) == [1, 2]
    with connection.cursor() as cursor:
        cursor.execute("EXPLAIN " + queries.captured_queries[-1]["sql"])
        plan = "\n".join(row[0] for row in cursor.fetchall())
    print(plan)
    assert f"Seq Scan on {report_table}" not in plan, plan
