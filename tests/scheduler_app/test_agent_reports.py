"""Report ingestion under concurrency: two requests with the same batch apply it exactly once."""

import threading
import time
from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone

from scheduler_app.models import AgentReport, Job, JobEvent
from scheduler_app.services import report_ingest
from scheduler_app.services.report_apply import LeaseReport
from scheduler_app.services.report_ingest import agent_reports_ingest
from scheduler_app.services.rounds import scheduling_round_run
from tests.api.helpers import lease_of, make_server, submit


@pytest.mark.skipif(connection.vendor != "postgresql", reason="needs concurrent connections")
@pytest.mark.django_db(transaction=True)
def test_a_batch_sent_twice_at_once_is_applied_once(user, settings, monkeypatch):
    settings.ATTUNE_SCHEDULER = {**settings.ATTUNE_SCHEDULER, "inline_rounds": False}
    server = make_server("gpu01", gpus=2)
    job = submit(user, gpus=2)
    scheduling_round_run()
    lease = lease_of(job)
    t0 = timezone.now()
    batch = [
        LeaseReport(lease.lease_id, 1, "started", t0, {"pid": 1}),
        LeaseReport(lease.lease_id, 2, "progress", t0 + timedelta(seconds=30), {"done_iters": 300}),
    ]
    first_inside, release = threading.Event(), threading.Event()
    real_apply = report_ingest.reports_apply

    def slow_apply(reports, **kwargs):
        # The first request holds its transaction open with the reports inserted but not committed.
        first_inside.set()
        assert release.wait(10)
        return real_apply(reports, **kwargs)

    monkeypatch.setattr(report_ingest, "reports_apply", slow_apply)
    outcomes = {}

    def send(name):
        try:
            outcomes[name] = agent_reports_ingest(server=server, reports=batch)
        finally:
            connection.close()

    first = threading.Thread(target=send, args=("first",))
    first.start()
    assert first_inside.wait(10)
    second = threading.Thread(target=send, args=("second",))
    second.start()
    time.sleep(0.5)  # the second now waits on the unique index for the first's rows
    release.set()
    first.join(10)
    second.join(10)

    assert outcomes["first"].applied == 2 and outcomes["second"].applied == 0
    assert (
        outcomes["first"].acked
        == outcomes["second"].acked
        == [(str(lease.lease_id), 1), (str(lease.lease_id), 2)]
    )
    job.refresh_from_db()
    assert job.done_iters == 300 and job.attained_service_gpu_s == pytest.approx(2 * 30.0)
    assert JobEvent.objects.filter(job=job, kind="lease_started").count() == 1
    assert AgentReport.objects.count() == 2
    assert Job.objects.count() == 1


@pytest.mark.django_db
@pytest.mark.parametrize("insert", ["reports_insert_new", "_insert_new_by_rows"])
def test_new_reports_are_stored_once_each_with_their_work_list_row(user, settings, insert):
    """On PostgreSQL `reports_insert_new` is one statement (unnest, two inserts); `_insert_new_by_rows`
    is the path of other databases. Both store only what is new and list it for the applier."""
    import uuid

    from scheduler_app.models import AgentReportPending
    from scheduler_app.services import report_rows
    from scheduler_app.services.report_rows import NewReport

    settings.ATTUNE_SCHEDULER = {**settings.ATTUNE_SCHEDULER, "inline_rounds": False}
    make_server("gpu01", gpus=4)
    jobs = [submit(user, gpus=2), submit(user, gpus=2)]
    scheduling_round_run()
    leases = [lease_of(job) for job in jobs]
    now = timezone.now()

    def report(lease, seq, kind="progress", data=None):
        return NewReport(lease.pk, lease.job_id, lease.lease_id, seq, kind, now, data or {"done_iters": seq})

    store = getattr(report_rows, insert)
    first = [
        report(leases[0], 1, "started", {"pid": 7, "note": "é ✓"}),
        report(leases[0], 2),
        report(leases[1], 1),
    ]
    fresh = store(first, batch_id=uuid.uuid4(), received_at=now)
    assert set(fresh) == {(r.lease_id, r.seq) for r in first}
    # A retry of part of it with one new report: only that one goes in.
    again = [report(leases[0], 2), report(leases[1], 1), report(leases[1], 2)]
    fresh_again = store(again, batch_id=uuid.uuid4(), received_at=now)
    assert set(fresh_again) == {(leases[1].lease_id, 2)}

    stored = {(r.lease_id, r.seq): r for r in AgentReport.objects.all()}
    assert len(stored) == 4
    assert stored[leases[0].lease_id, 1].data == {"pid": 7, "note": "é ✓"}
    assert stored[leases[0].lease_id, 1].kind == "started" and stored[leases[0].lease_id, 1].at == now
    assert {key: stored[key].pk for key in [*fresh, *fresh_again]} == {**fresh, **fresh_again}
    pending = dict(AgentReportPending.objects.values_list("report_id", "job_id"))
    assert pending == {r.pk: r.allocation.job_id for r in stored.values()}
