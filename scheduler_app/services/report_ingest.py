"""Agents' lease reports in: stored once each (and acknowledged), then applied to their jobs and leases,
either within the sync that brought them or, for progress, by the worker's applier for all servers
at once (docs/agent-protocol.md section 4)."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any
from uuid import UUID

from django.db import OperationalError, connection, transaction
from django.utils import timezone

from cluster_app.agent_wake import agents_wake_on_commit, wake_enabled
from cluster_app.models import Server
from config.redis_pool import redis_client
from infra.task_send import task_send
from infra.vendor import is_postgresql
from profiles_app.selectors import profiling_runs_of_server
from scheduler_app.conf import scheduler_conf
from scheduler_app.models import TERMINAL_JOB_STATES, AgentReportKind
from scheduler_app.selectors.agent_reports import (
    LeaseOfServer,
    jobs_lock,
    leases_of_server,
    pending_report_job_ids,
    pending_reports,
    reports_mark_applied,
    waiting_lease_servers,
)
from scheduler_app.services.agents import AGENT_CLOCK_SKEW, clean_text
from scheduler_app.services.job_batches import job_batches_run
from scheduler_app.services.pacing import debounced_send
from scheduler_app.services.profiling import profiling_reports_ingest
from scheduler_app.services.report_apply import LeaseReport, reports_apply
from scheduler_app.services.report_rows import (
    NewReport,
    jobs_lock_within,
    reports_insert_new,
    reports_insert_on_leases,
)
from scheduler_app.task_names import AGENT_REPORTS_APPLY_TASK

logger = logging.getLogger(__name__)

LOCK_NOT_AVAILABLE = "55P03"  # PostgreSQL's SQLSTATE for lock_timeout / NOWAIT
# Jobs per transaction of the applier: a few seconds of a thousand servers' progress is ~4,000 jobs.
APPLY_JOBS_PER_BATCH = 500
# A sync whose start or exit could not be applied (a round held its jobs) asks the applier to run at
# once; later such syncs within this many seconds find it asked already.
APPLY_REQUEST_KEY = "attune:agent-reports-apply"
APPLY_REQUEST_DEBOUNCE_S = 1
REDIS_TIMEOUT_S = 0.5
# Reports applied within their sync even when progress is left to the applier: the commands depend on
# them (a moved job's next lease waits for its old one's exit; a job's end frees its GPUs for a round).
# A start is not one: the answer that carried its `start` marked the lease (start_sent_at), which
# already holds a moved job's next lease back (selectors/lease_starts.py), no command reads the
# agent's start, and its GPU time is credited from the report's own date whenever it is applied. It
# waits for the applier with progress: applied within its sync it cost 1.5 ms of the web tier's CPU
# and a transaction on the job's row, every job start (bench.sync_cost, 2026-11-29).
URGENT_KINDS = frozenset({AgentReportKind.EXITED})


@dataclass
class ReportsOutcome:
    """acked: (lease_id, seq) pairs that are final (stored, now or before); rejected: final refusals;
    applied: reports applied within this call (the others wait for the applier)."""

    acked: list[tuple[str, int]] = field(default_factory=list)
    rejected: list[dict[str, Any]] = field(default_factory=list)
    applied: int = 0


@dataclass
class _Stored:
    outcome: ReportsOutcome
    job_ids: set[int]  # the jobs of the reports stored for the first time
    urgent_job_ids: set[int]  # those of them with an exit (URGENT_KINDS)


def _within_lease_life(r: LeaseReport, allocation: LeaseOfServer, *, now: datetime) -> LeaseReport:
    """`r` dated within its lease's life as the service knows it: not before the lease started, not
    after the service's clock plus AGENT_CLOCK_SKEW. Clamped rather than refused: a wrong clock must not
    cost a job its exit report (it would stay RUNNING for ever), while the clamp keeps the GPU time it
    can credit within the wall time that passed. The agent's own date is kept in `data.agent_at`."""
    at = min(max(r.at, allocation.started_at), now + AGENT_CLOCK_SKEW)
    if at == r.at:
        return r
    logger.warning("lease %s report %s: agent clock %s clamped to %s", r.lease_id, r.seq, r.at, at)
    return replace(r, at=at, data={**r.data, "agent_at": r.at.isoformat()})


def agent_reports_ingest(
    *,
    server: Server,
    reports: Sequence[LeaseReport],
    lock_wait_ms: int | None = None,
    defer_progress: bool | None = None,
) -> ReportsOutcome:
    """Store a batch of lease reports from `server`'s agent, each exactly once, then apply them.

    Storing (`agent_reports_store`) is what the agent's acknowledgement means: from then on the
    service keeps the reports whatever happens to applying them. Applying locks the reports' jobs and
    applies, in (lease, seq) order, every stored report of theirs still pending (earlier progress left
    to the applier included), in a transaction of its own (`agent_reports_apply_pending`).
    A batch of progress and log lines alone is not applied here when `defer_progress` (default: the
    scheduler's `progress_deferred`): the worker's applier applies every server's within seconds, in
    one transaction, instead of every sync locking its jobs. Progress is cumulative and no command
    depends on it, on the log or on a start; a job prints all the time, so were log lines urgent,
    nearly every sync would be. An exit (URGENT_KINDS) is applied here, so that this sync's commands
    see it: its job's reports only, the batch's others (the other leases' progress that an exit's sync
    carries) left to the applier too.
    When the jobs' rows stay locked longer than `lock_wait_ms` (PostgreSQL; a scheduling round holds
    them) or applying fails, the reports stay pending and the applier applies them: after the round,
    or (a bug) on each of its runs, logged, as the agent's resends were before.
    """
    stored = agent_reports_store(server=server, reports=reports)
    if not stored.job_ids:
        return stored.outcome
    if defer_progress is None:
        defer_progress = scheduler_conf().progress_deferred
    job_ids = stored.job_ids
    if defer_progress:
        # Locking and applying the other jobs' progress here cost the exit's sync a row lock and an
        # update per job for nothing that its commands read; the applier does it in bulk.
        job_ids = stored.urgent_job_ids
        if not job_ids:
            return stored.outcome
    try:
        stored.outcome.applied = agent_reports_apply_pending(
            job_ids=job_ids, lock_wait_ms=lock_wait_ms, reporting_server_id=server.pk
        )
    except OperationalError as exc:
        if getattr(exc.__cause__, "pgcode", None) != LOCK_NOT_AVAILABLE:
            logger.exception("server %s: reports stored but not applied; left to the applier", server.name)
        else:
            logger.info(
                "server %s: reports stored, applied after the round that holds their jobs", server.name
            )
        agent_reports_apply_request()
    except Exception:
        logger.exception("server %s: reports stored but not applied; left to the applier", server.name)
    return stored.outcome


def agent_reports_store(*, server: Server, reports: Sequence[LeaseReport]) -> _Stored:
    """Store the batch's reports about `server`'s leases, pending, each once; settle the rest.

    1. Leases of other servers (or unknown) are rejected: an agent acts only for its own server.
    2. Insert-or-ignore every report on the (lease_id, seq) unique constraint: the rows inserted are
       the reports seen for the first time. A concurrent retry of the same batch waits on the unique
       index and then inserts nothing, so each report is applied once, by whoever inserted it.
    A report dated outside its lease's life is clamped into it (`_within_lease_life`), so that a buggy
    agent cannot inflate a job's attained service. Reports about a profiling run of this server (its
    lease id) go to the profiling service, which applies them at once.
    On PostgreSQL the leases are read by the statement that stores the reports
    (`reports_insert_on_leases`); a report it left out for its date is clamped and stored after it.
    """
    outcome = ReportsOutcome()
    now = timezone.now()
    if is_postgresql():
        allocations, fresh, ordered = _stored_with_leases(server=server, reports=reports, now=now)
    else:  # the leases read first, the reports stored after the profiling runs' (below)
        allocations = leases_of_server(server_id=server.pk, lease_ids={r.lease_id for r in reports})
        fresh, ordered = {}, []
    runs = profiling_runs_of_server(server=server, lease_ids={r.lease_id for r in reports} - set(allocations))
    if runs:
        with transaction.atomic():
            outcome.acked += profiling_reports_ingest(
                server=server, runs=runs, reports=[r for r in reports if r.lease_id in runs]
            )
    for r in reports:
        if r.lease_id not in runs and r.lease_id not in allocations:
            outcome.rejected.append(
                {
                    "lease_id": str(r.lease_id),
                    "seq": r.seq,
                    "error": "lease not found on this server",
                    "code": 404,
                }
            )
    if not is_postgresql():
        fresh, ordered = _stored(allocations, reports=reports, now=now)
    ordered = [r for r in ordered if r.lease_id in allocations]
    if not ordered:
        return _Stored(outcome, set(), set())
    new = [r for r in ordered if (r.lease_id, r.seq) in fresh]
    outcome.acked += [(str(r.lease_id), r.seq) for r in ordered]
    return _Stored(
        outcome,
        job_ids={allocations[r.lease_id].job_id for r in new},
        urgent_job_ids={allocations[r.lease_id].job_id for r in new if r.kind in URGENT_KINDS},
    )


def _sorted_once(reports: Iterable[LeaseReport]) -> list[LeaseReport]:
    """Each (lease_id, seq) once (its first), sorted, so that two overlapping batches insert keys in
    the same order and cannot deadlock; strings cleaned once, before they are stored (PostgreSQL
    refuses NUL)."""
    once: dict[tuple[UUID, int], LeaseReport] = {}
    for r in reports:
        once.setdefault((r.lease_id, r.seq), r)
    return [
        replace(once[k], data=clean_text(once[k].data)) for k in sorted(once, key=lambda k: (str(k[0]), k[1]))
    ]


def _new_rows(reports: Iterable[LeaseReport], allocations: dict[UUID, LeaseOfServer]) -> list[NewReport]:
    # The applier's work list goes in with the reports: a report stored is a report applied, sooner
    # or later (an exit left out would leave its job RUNNING).
    return [
        NewReport(
            allocation_id=allocations[r.lease_id].pk,
            job_id=allocations[r.lease_id].job_id,
            lease_id=r.lease_id,
            seq=r.seq,
            kind=r.kind,
            at=r.at,
            data=r.data,
        )
        for r in reports
    ]


def _stored(
    allocations: dict[UUID, LeaseOfServer], *, reports: Sequence[LeaseReport], now: datetime
) -> tuple[dict[tuple[UUID, int], int], list[LeaseReport]]:
    """The reports of `allocations`' leases, dated within their lease's life, stored: (the rows
    inserted now, the reports in their order)."""
    ordered = _sorted_once(
        _within_lease_life(r, allocations[r.lease_id], now=now) for r in reports if r.lease_id in allocations
    )
    fresh = reports_insert_new(_new_rows(ordered, allocations), batch_id=uuid.uuid4(), received_at=now)
    return fresh, ordered


def _stored_with_leases(
    *, server: Server, reports: Sequence[LeaseReport], now: datetime
) -> tuple[dict[UUID, LeaseOfServer], dict[tuple[UUID, int], int], list[LeaseReport]]:
    """PostgreSQL: the batch's leases on `server` read and its reports stored in one statement; a
    report it left out for its date (a wrong clock) clamped into its lease's life and stored after.
    Returns (the leases, the rows inserted now, the reports in their order: those of other leases
    included, which the caller leaves out)."""
    ordered = _sorted_once(reports)
    batch_id = uuid.uuid4()
    latest = now + AGENT_CLOCK_SKEW
    rows = [NewReport(0, 0, r.lease_id, r.seq, r.kind, r.at, r.data) for r in ordered]
    allocations, fresh = reports_insert_on_leases(
        rows, server_id=server.pk, latest=latest, batch_id=batch_id, received_at=now
    )
    clamped = []
    for i, r in enumerate(ordered):
        lease = allocations.get(r.lease_id)
        if lease is not None and not lease.started_at <= r.at <= latest:
            ordered[i] = _within_lease_life(r, lease, now=now)
            clamped.append(ordered[i])
    if clamped:
        fresh |= reports_insert_new(_new_rows(clamped, allocations), batch_id=batch_id, received_at=now)
    return allocations, fresh, ordered


@transaction.atomic
def agent_reports_apply_pending(
    *,
    job_ids: Iterable[int],
    lock_wait_ms: int | None = None,
    skip_locked: bool = False,
    reporting_server_id: int | None = None,
) -> int:
    """Apply every pending report of these jobs' leases, in (lease, seq) order; returns how many.

    The job rows are locked first (in id order, like every other writer), and the pending reports read
    after the lock: whoever holds a job's row applies its reports, and the next holder finds them
    applied. `lock_wait_ms` bounds the wait (PostgreSQL; the caller gets LockNotAvailable);
    `skip_locked` leaves the jobs another transaction holds for a later call. Agents whose leases wait
    for an exit applied here are woken, except `reporting_server_id`'s (its commands follow in its sync).
    """
    if lock_wait_ms is not None and is_postgresql() and not skip_locked:
        # A sync's exit: the wait's bound, the lock and the workloads in one statement (not three).
        jobs = jobs_lock_within(job_ids=job_ids, lock_wait_ms=lock_wait_ms)
    else:
        if lock_wait_ms is not None and is_postgresql():
            with connection.cursor() as cursor:
                cursor.execute(f"SET LOCAL lock_timeout = '{int(lock_wait_ms)}ms'")
        jobs = jobs_lock(job_ids=job_ids, skip_locked=skip_locked)
    if not jobs:
        return 0
    pending = pending_reports(job_ids=jobs)
    if not pending:
        return 0
    ordered = sorted(pending, key=lambda r: (str(r.lease_id), r.seq))
    exited_jobs = reports_apply(
        [LeaseReport(lease_id=r.lease_id, seq=r.seq, kind=r.kind, at=r.at, data=r.data) for r in ordered],
        now=timezone.now(),
        jobs=jobs,
    )
    reports_mark_applied(report_ids=[r.pk for r in ordered])
    # A job that the exit ended (job_finish ends all its leases) has no lease left to wake: most exits
    # under churn, one statement fewer each. A moved job's old process exiting leaves it RUNNING.
    moved = {job_id for job_id in exited_jobs if jobs[job_id].state not in TERMINAL_JOB_STATES}
    _next_leases_wake(job_ids=moved, reporting_server_id=reporting_server_id)
    return len(ordered)


def agent_reports_apply_run() -> int:
    """The applier (a worker's periodic task): apply every pending report, a batch of jobs per
    transaction, skipping the jobs another transaction holds (a round: their reports go next run).
    A batch that fails is applied again job by job, so that one job's bad report (a bug) holds back
    only that job's; it is logged and retried on each run. Returns the reports applied."""
    return job_batches_run(
        next_job_ids=lambda after: pending_report_job_ids(after_job_id=after, limit=APPLY_JOBS_PER_BATCH),
        apply=lambda job_ids: agent_reports_apply_pending(job_ids=job_ids, skip_locked=True),
        failure="pending agent reports could not be applied",
    )


def agent_reports_apply_request() -> None:
    """Ask the applier to run now (debounced), for reports a sync could not apply; the periodic run
    catches up if Redis or the broker is unreachable. Inline mode has no worker: nothing to ask."""
    conf = scheduler_conf()
    if conf.inline_rounds:
        return
    try:
        debounced_send(
            redis_client(conf.redis_url, REDIS_TIMEOUT_S),
            key=APPLY_REQUEST_KEY,
            value="1",
            countdown_s=0,
            slack_s=APPLY_REQUEST_DEBOUNCE_S,
            send=lambda: task_send(AGENT_REPORTS_APPLY_TASK),
        )
    except Exception:
        logger.warning(
            "could not ask for the reports' applier; its periodic run will apply them", exc_info=True
        )


def _next_leases_wake(*, job_ids: set[int], reporting_server_id: int | None) -> None:
    """Wake the agents of the jobs' leases not started yet: their `start` waited for the exit just
    recorded (agent_commands holds a moved job's next lease until its stopped process exited), and
    would otherwise wait for their agents' next sync, up to an interval later. The reporting server's
    own commands are computed after its reports, in its sync."""
    if not job_ids or not wake_enabled():
        return
    agents_wake_on_commit(waiting_lease_servers(job_ids=job_ids, except_server_id=reporting_server_id))
