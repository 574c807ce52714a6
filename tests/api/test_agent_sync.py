"""The sync call's own guarantees (docs/agent-protocol.md section 2): one call carries the usage sample,
the reports and the running list; its commands are computed after the reports were applied; its cost
does not grow with what it carries; a batch of reports that cannot be applied never cuts the node off
its commands; with waking on, it hands out the long-poll's ticket and generation."""

from __future__ import annotations

import re
from collections import Counter
from datetime import timedelta

import pytest
from django.db import DatabaseError, connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from cluster_app.agent_wake import AGENT_WAIT_PATH, wait_ticket_server, wake_generation
from cluster_app.models import GpuUsageSample, NodeState, Server, UsageSample
from profiles_app.models import SpeedObservation
from scheduler_app.models import AgentReport, AgentReportPending, Job, JobState
from scheduler_app.services import agent_sync as agent_sync_module
from scheduler_app.services import report_ingest
from scheduler_app.services.report_ingest import agent_reports_apply_run
from scheduler_app.services.rounds import scheduling_round_run
from tests.api.agent_native import agent_path  # noqa: F401  (the fixture)
from tests.api.helpers import agent_client, lease_of, make_server, submit, synced, usage_sample

# Each test twice: through Django's handler and DRF's view, and through config/agent_calls.py first.
pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("agent_path")]


@pytest.fixture(autouse=True)
def rounds(fifo_tune):
    """FIFO + tune; the tests run the rounds themselves."""


def report(lease, seq, kind, at=None, **data):
    return {
        "lease_id": str(lease),
        "seq": seq,
        "kind": kind,
        "at": (at or timezone.now()).isoformat(),
        "data": data,
    }


def placed(*jobs: Job) -> list[Job]:
    scheduling_round_run()
    for job in jobs:
        job.refresh_from_db()
        assert job.state == JobState.RUNNING
    return list(jobs)


# --- (a) one call: sample, reports and running in; commands computed after the reports out ------------


def test_one_sync_stores_the_sample_applies_the_reports_and_answers_the_commands_that_follow(user, server):
    done, going = placed(
        submit(user, gpus=2, iters=1000, name="done"), submit(user, gpus=2, iters=1000, name="going")
    )
    done_lease, going_lease = lease_of(done).lease_id, lease_of(going).lease_id
    # The agent ran both; `done` has just exited, having finished its work, so it is no longer running.
    sample = usage_sample(
        cpu_util_pct=55.0,
        gpus=[{"uuid": g.uuid, "util_pct": 90.0, "mem_used_mb": 1000} for g in server.gpus.all()],
    )
    t0 = timezone.now() - timedelta(seconds=30)
    answer = synced(
        agent_client(server),
        sample=sample,
        running=[going_lease],
        reports=[
            report(done_lease, 1, "started", at=t0, pid=1),
            report(done_lease, 2, "exited", exit_code=0, signal=None, oom=False, done_iters=1000),
            report(going_lease, 1, "started", at=t0, pid=2),
            report(going_lease, 2, "progress", done_iters=300, iters_per_s=3.0),
        ],
    )
    # The reports were applied: `done` is COMPLETED, `going` has its progress.
    done.refresh_from_db()
    going.refresh_from_db()
    assert done.state == JobState.COMPLETED and going.done_iters == 300
    assert sorted(map(tuple, answer["acked"])) == sorted(
        [(str(done_lease), 1), (str(done_lease), 2), (str(going_lease), 1), (str(going_lease), 2)]
    )
    assert answer["rejected"] == []
    # ... before the commands were computed: a lease that ended in this very sync is not started again
    # (computed before the reports, `done`'s lease would still be active and not running: a start).
    assert answer["commands"] == []
    # The sample is stored and the server counts as alive.
    assert UsageSample.objects.get(server=server).cpu_util_pct == 55.0
    assert GpuUsageSample.objects.filter(gpu__server=server).count() == 4
    server.refresh_from_db()
    assert server.last_heartbeat_at is not None and answer["state"] == server.state


def test_a_lease_requeued_by_its_own_report_is_not_started_again_in_that_sync(user, server):
    (job,) = placed(submit(user, gpus=2, iters=1000))
    lease = lease_of(job).lease_id
    stop = report(lease, 1, "exited", exit_code=None, signal=15, done_iters=250, stop="agent_exit")
    answer = synced(agent_client(server), running=[], reports=[stop])
    job.refresh_from_db()
    assert job.state == JobState.PENDING and answer["commands"] == []
    # The next round places it again, and the next sync starts it from where it stopped.
    placed(job)
    (start,) = synced(agent_client(server))["commands"]
    assert start["kind"] == "start" and start["resume_iters"] == 250 and start["lease_id"] != str(lease)


def test_a_silent_server_comes_back_and_gets_its_commands_in_the_same_sync(user, server):
    (job,) = placed(submit(user, gpus=2))
    Server.objects.filter(pk=server.pk).update(state=NodeState.DOWN, state_reason="silent")
    answer = synced(agent_client(server), running=[])
    assert answer["state"] == NodeState.MIXED
    assert [(c["kind"], c["lease_id"]) for c in answer["commands"]] == [
        ("start", str(lease_of(job).lease_id))
    ]


# --- (b) a constant number of queries, whatever the sync carries ---------------------------------------


@pytest.fixture
def eight_leases(user):
    """gpu08 (8 GPUs) runs 8 one-GPU res18 jobs placed by a real round, each started by its agent."""
    server = make_server("gpu08", gpus=8, cpus=24, mem_gb=500)
    jobs = placed(*[submit(user, gpus=1, iters=10**6, name=f"j{i}") for i in range(8)])
    leases = [lease_of(j) for j in jobs]
    assert {a.server_id for a in leases} == {server.pk}
    client = agent_client(server)
    t0 = max(a.started_at for a in leases)  # reports dated a second apart from here: none clamped
    # Started (and the credential's last use recorded: a write the throttle then skips for a while).
    synced(
        client,
        running=[a.lease_id for a in leases],
        reports=[report(a.lease_id, 1, "started", at=t0) for a in leases],
    )
    return server, client, leases, t0


def _progress_reports(leases, per_lease: int, *, first_seq: int, t0) -> list[dict]:
    """`per_lease` progress reports of each lease, with a believable measured speed (observed)."""
    reports = []
    for a in leases:
        ips = a.speedup / a.job.workload.iter_time_s
        for k in range(per_lease):
            seq = first_seq + k
            at = t0 + timedelta(seconds=seq)
            reports.append(report(a.lease_id, seq, "progress", at=at, done_iters=100 * seq, iters_per_s=ips))
    return reports


def _sync_queries(client, server, leases, reports) -> list[str]:
    sample = usage_sample(
        gpus=[{"uuid": g.uuid, "util_pct": 50.0, "mem_used_mb": 10} for g in server.gpus.all()]
    )
    with CaptureQueriesContext(connection) as queries:
        answer = synced(client, sample=sample, running=[a.lease_id for a in leases], reports=reports)
    assert len(answer["acked"]) == len(reports) and answer["rejected"] == [] and answer["commands"] == []
    return [q["sql"] for q in queries.captured_queries]


def _shape(sql: str) -> str:
    """A query with its values and repeated VALUES rows folded, to name what grows."""
    sql = re.sub(r"'[^']*'", "?", sql)
    sql = re.sub(r"\b\d+(\.\d+)?\b", "?", sql)
    sql = re.sub(r"(\([^()]*\))(, \1)+", r"\1, ...", sql)
    return sql[:160]


def test_a_sync_costs_the_same_queries_for_1_or_40_reports_over_8_leases(eight_leases):
    server, client, leases, t0 = eight_leases
    one = _sync_queries(client, server, leases, _progress_reports(leases[:1], 1, first_seq=2, t0=t0))
    forty = _sync_queries(client, server, leases, _progress_reports(leases, 5, first_seq=3, t0=t0))
    print(f"sync queries: 1 report -> {len(one)}, 40 reports over 8 leases -> {len(forty)}")
    grown = Counter(map(_shape, forty)) - Counter(map(_shape, one))
    assert len(one) == len(forty), "\n".join(
        ["queries the 40-report sync makes more often than the 1-report one:"]
        + [f"{n} x {sql}" for sql, n in sorted(grown.items())]
    )
    # Both really did the work: progress and GPU time of all 8 jobs, their speeds observed.
    jobs = Job.objects.filter(pk__in=[a.job_id for a in leases])
    assert [(j.done_iters, j.attained_service_gpu_s) for j in jobs] == [(700, pytest.approx(7.0))] * 8
    assert SpeedObservation.objects.filter(allocation__in=leases).count() == 8


def test_a_sync_that_starts_8_leases_costs_as_much_as_one_that_starts_1(
    eight_leases, django_assert_max_num_queries
):
    _, client, leases, _ = eight_leases
    with CaptureQueriesContext(connection) as one:
        commands = synced(client, running=[a.lease_id for a in leases[1:]])["commands"]
    assert [c["kind"] for c in commands] == ["start"]
    with django_assert_max_num_queries(len(one.captured_queries)) as eight:
        commands = synced(client, running=[])["commands"]
    assert [c["kind"] for c in commands] == ["start"] * 8
    print(f"sync queries: 1 start -> {len(one.captured_queries)}, 8 starts -> {len(eight.captured_queries)}")


def test_an_exit_that_ends_its_job_looks_for_no_lease_to_wake(user, server, settings):
    """A job its exit ended has no lease left (job_finish ends them all), so the exit's sync does not ask
    which agents wait for it; a moved job's old process exiting still does (tests/cluster_app/
    test_agent_wake.py)."""
    settings.ATTUNE_DB_PREPARED_STATEMENTS = False  # the statements' text captured, not EXECUTE names
    (job,) = placed(submit(user, gpus=2, iters=100))
    lease = lease_of(job).lease_id
    client = agent_client(server)
    synced(client, running=[lease], reports=[report(lease, 1, "started")])
    with CaptureQueriesContext(connection) as queries:
        answer = synced(client, running=[], reports=[report(lease, 2, "exited", exit_code=0, done_iters=100)])
    job.refresh_from_db()
    assert answer["acked"] == [[str(lease), 2]] and job.state == JobState.COMPLETED
    statements = [q["sql"] for q in queries.captured_queries]
    assert any("UPDATE" in sql and "scheduler_app_job" in sql for sql in statements)  # the end applied
    assert not [sql for sql in statements if "agent_started_at IS NULL AND server_id" in sql]


def test_the_reports_leases_are_read_by_the_statement_that_stores_them(eight_leases, settings):
    """On PostgreSQL one statement reads the batch's leases on this server and stores its reports with
    their work list (services/report_rows.py `reports_insert_on_leases`): no read of the leases of its
    own; another server's lease is still refused alone. Progress left to the applier, as with workers."""
    settings.ATTUNE_DB_PREPARED_STATEMENTS = False  # the statements' text captured, not EXECUTE names
    settings.ATTUNE_SCHEDULER = {**settings.ATTUNE_SCHEDULER, "progress_apply_s": 2.0}
    _, client, leases, t0 = eight_leases
    pending = AgentReportPending.objects.count()
    foreign = report("00000000-0000-4000-8000-000000000000", 1, "progress", done_iters=1)
    reports = [*_progress_reports(leases[:2], 2, first_seq=2, t0=t0), foreign]
    with CaptureQueriesContext(connection) as queries:
        answer = synced(client, running=[a.lease_id for a in leases], reports=reports)
    assert len(answer["acked"]) == 4 and [r["code"] for r in answer["rejected"]] == [404]
    statements = [q["sql"] for q in queries.captured_queries]
    (stored,) = [sql for sql in statements if "scheduler_app_agentreport" in sql]
    assert "INSERT INTO" in stored and 'FROM "scheduler_app_allocation"' in stored
    assert not [sql for sql in statements if sql.startswith("SELECT id, lease_id, job_id, started_at")]
    assert AgentReport.objects.count() == 8 + 4 and AgentReportPending.objects.count() == pending + 4


def test_reports_dated_outside_their_lease_are_clamped_stored_once_and_acked_again(eight_leases, settings):
    """A wrong clock: the statement leaves such reports out, they are clamped into the lease's life
    (the agent's date kept) and stored after it, in the same sync; a resend stores nothing twice."""
    settings.ATTUNE_SCHEDULER = {**settings.ATTUNE_SCHEDULER, "progress_apply_s": 2.0}
    _, client, leases, _ = eight_leases
    lease = leases[0]
    early = lease.started_at - timedelta(hours=1)
    late = timezone.now() + timedelta(days=1)
    reports = [
        report(lease.lease_id, 2, "progress", at=early, done_iters=10),
        report(lease.lease_id, 3, "progress", done_iters=20),
        report(lease.lease_id, 4, "progress", at=late, done_iters=30),
    ]
    running = [a.lease_id for a in leases]
    pending = AgentReportPending.objects.count()
    answer = synced(client, running=running, reports=reports)
    assert answer["acked"] == [[str(lease.lease_id), seq] for seq in (2, 3, 4)] and answer["rejected"] == []
    stored = {r.seq: r for r in AgentReport.objects.filter(allocation=lease, seq__gte=2)}
    assert stored[2].at == lease.started_at and stored[2].data["agent_at"] == early.isoformat()
    assert "agent_at" not in stored[3].data
    assert stored[4].at < late and stored[4].data["agent_at"] == late.isoformat()
    assert AgentReportPending.objects.count() == pending + 3
    again = synced(client, running=running, reports=reports)
    assert again["acked"] == answer["acked"]
    assert AgentReport.objects.filter(allocation=lease).count() == 4
    assert AgentReportPending.objects.count() == pending + 3


def test_an_exits_job_end_runs_in_the_applying_transaction_without_a_savepoint(user, server, settings):
    """The exit's job end (job_finish) writes within the transaction that applies the reports, without
    a savepoint of its own, and the job is updated once (its progress with its end)."""
    settings.ATTUNE_DB_PREPARED_STATEMENTS = False  # the statements' text captured, not EXECUTE names
    (job,) = placed(submit(user, gpus=2, iters=100))
    lease = lease_of(job).lease_id
    client = agent_client(server)
    synced(client, running=[lease], reports=[report(lease, 1, "started")])
    with CaptureQueriesContext(connection) as queries:
        synced(client, running=[], reports=[report(lease, 2, "exited", exit_code=0, done_iters=100)])
    job.refresh_from_db()
    assert job.state == JobState.COMPLETED and job.done_iters == 100
    statements = [q["sql"] for q in queries.captured_queries]
    # The test's own transaction makes the applying one a savepoint: that one only.
    assert len([sql for sql in statements if sql.startswith("SAVEPOINT")]) == 1
    assert len([sql for sql in statements if sql.startswith('UPDATE "scheduler_app_job"')]) == 1


def test_a_job_end_that_fails_leaves_nothing_of_the_exit_applied(user, server, monkeypatch):
    """Without job_finish's savepoint an error in it still rolls back the whole application: the job
    stays RUNNING with its lease, the exit stays stored and pending for the applier."""
    (job,) = placed(submit(user, gpus=2, iters=100))
    lease = lease_of(job).lease_id
    client = agent_client(server)

    def failing(**kwargs):
        raise RuntimeError("a bug in a job's end")

    monkeypatch.setattr("scheduler_app.services.job_control.job_end_followups", failing)
    monkeypatch.setattr(report_ingest, "agent_reports_apply_request", lambda: None)
    answer = synced(client, running=[], reports=[report(lease, 1, "exited", exit_code=0, done_iters=100)])
    assert answer["acked"] == [[str(lease), 1]]
    job.refresh_from_db()
    allocation = lease_of(job)
    assert job.state == JobState.RUNNING and job.done_iters == 0 and job.finished_at is None
    assert allocation.ended_at is None and allocation.exited_at is None
    assert AgentReportPending.objects.count() == 1


# --- (c) a batch that cannot be stored is not acknowledged, one that cannot be applied is kept ------


def test_a_poisoned_batch_still_answers_commands_and_acks_nothing(user, server, monkeypatch):
    (job,) = placed(submit(user, gpus=2))
    lease = lease_of(job).lease_id

    def poisoned(**kwargs):
        raise RuntimeError("a bug in applying reports")

    Server.objects.filter(pk=server.pk).update(state=NodeState.DOWN)
    batch = [report(lease, 1, "started", pid=1), report(lease, 2, "progress", done_iters=10)]
    malformed = report(lease, 3, "progress")  # no done_iters: refused before the service sees it
    with monkeypatch.context() as m:
        m.setattr(agent_sync_module, "agent_reports_ingest", poisoned)
        answer = synced(agent_client(server), running=[], reports=[*batch, malformed])
    # The node is alive and told what to run...
    assert answer["state"] == NodeState.MIXED
    assert [(c["kind"], c["lease_id"]) for c in answer["commands"]] == [("start", str(lease))]
    # ... and nothing of the batch is acknowledged, so the agent keeps it and sends it again; only the
    # malformed report, which no resend can cure, is settled.
    assert answer["acked"] == []
    assert [(r["seq"], r["code"]) for r in answer["rejected"]] == [(3, 400)]
    assert not AgentReport.objects.exists()
    answer = synced(agent_client(server), running=[lease], reports=batch)
    assert sorted(map(tuple, answer["acked"])) == [(str(lease), 1), (str(lease), 2)]
    job.refresh_from_db()
    assert job.done_iters == 10


def test_a_batch_that_fails_to_apply_is_acknowledged_and_applied_by_the_applier(user, server, monkeypatch):
    """The failure comes after the reports were stored: they stay stored, pending (acknowledged, so the
    agent drops them from its spool), and the worker's applier applies them; a resend changes nothing."""
    (job,) = placed(submit(user, gpus=2))
    lease = lease_of(job).lease_id

    def failing(reports, *, now, jobs):
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1 / 0")  # any statement the database refuses

    batch = [report(lease, 1, "progress", done_iters=10)]
    with monkeypatch.context() as m:
        m.setattr(report_ingest, "reports_apply", failing)
        m.setattr(report_ingest, "agent_reports_apply_request", lambda: None)
        answer = synced(agent_client(server), running=[lease], reports=batch)
    assert answer["acked"] == [[str(lease), 1]] and answer["rejected"] == [] and answer["commands"] == []
    assert list(AgentReport.objects.values_list("seq", flat=True)) == [1]
    assert AgentReportPending.objects.count() == 1
    job.refresh_from_db()
    assert job.done_iters == 0
    assert synced(agent_client(server), running=[lease], reports=batch)["acked"] == [[str(lease), 1]]
    assert agent_reports_apply_run() == 1
    job.refresh_from_db()
    assert job.done_iters == 10 and not AgentReportPending.objects.exists()


def test_the_poisoned_batch_is_logged(user, server, monkeypatch, caplog):
    (job,) = placed(submit(user, gpus=2))

    def poisoned(**kwargs):
        raise DatabaseError("deadlock detected")

    monkeypatch.setattr(agent_sync_module, "agent_reports_ingest", poisoned)
    synced(agent_client(server), reports=[report(lease_of(job).lease_id, 1, "progress", done_iters=1)])
    assert "1 reports could not be stored" in caplog.text and "deadlock detected" in caplog.text


# --- the long-poll offer ----------------------------------------------------------------------------


def test_with_waking_on_a_sync_offers_the_wait_with_its_ticket_and_generation(server, settings):
    pytest.importorskip("redis")
    settings.ATTUNE_AGENT_WAKE = True
    settings.ATTUNE_AGENT_WAIT_TIMEOUT_S = 25.0
    settings.ATTUNE_AGENT_SYNC_INTERVAL_S = 12.0
    answer = synced(agent_client(server))
    wait = answer["wait"]
    assert answer["sync_interval_s"] == 12.0
    assert wait["url"] == AGENT_WAIT_PATH == "/api/v1/agent/wait" and wait["timeout_s"] == 25.0
    assert wait_ticket_server(wait["ticket"], max_age_s=60) == server.pk
    assert wait["generation"] == wake_generation(server.pk)


def test_with_waking_off_no_wait_is_offered(server, settings):
    settings.ATTUNE_AGENT_WAKE = False
    assert synced(agent_client(server))["wait"] is None
