"""What node agents tell the service: registration, usage samples and lease reports (idempotent)."""

from __future__ import annotations

import logging
import math
import re
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any
from uuid import UUID

from django.db import connection, transaction
from django.utils import timezone

from cluster_app.agent_wake import agents_wake_on_commit, wake_enabled
from cluster_app.models import Server
from cluster_app.services import (
    UNRESPONSIVE_STATES,
    NodeInventory,
    UsageReport,
    node_heartbeat,
    node_register,
)
from cluster_app.usage_minutes import insert_new
from profiles_app.selectors import profiling_runs_of_server
from scheduler_app.conf import scheduler_conf
from scheduler_app.models import AgentReport, Allocation
from scheduler_app.selectors import server_busy_gpus
from scheduler_app.selectors.agent_reports import jobs_lock, leases_of_server
from scheduler_app.services.profiling import profiling_reports_ingest
from scheduler_app.services.report_apply import LeaseReport, reports_apply
from scheduler_app.services.rounds import scheduling_round_request_on_commit

logger = logging.getLogger(__name__)

# How far an agent's clock may run ahead of the service's: a report dated later than the service's clock
# plus this is dated back to it (docs/agent-protocol.md section 4).
AGENT_CLOCK_SKEW = timedelta(seconds=60)
AGENT_REPORT_MAX_SEQ = 2**63 - 1


@dataclass
class ReportsOutcome:
    """acked: (lease_id, seq) pairs that are final (new or seen before); rejected: final refusals."""

    acked: list[tuple[str, int]] = field(default_factory=list)
    rejected: list[dict[str, Any]] = field(default_factory=list)
    applied: int = 0


# NUL (PostgreSQL text and jsonb cannot hold it) and lone surrogates (JSON's \ud800 escapes: not UTF-8).
_NOT_STORABLE = re.compile("[\x00\ud800-\udfff]")


def clean_text(value: Any) -> Any:
    """`value` with every string in it (dict keys too, at any depth) storable by PostgreSQL: NUL and
    lone surrogates (what JSON can carry that is not UTF-8) become U+FFFD."""
    if isinstance(value, str):
        if value.isascii() and "\x00" not in value:
            return value
        return _NOT_STORABLE.sub("\ufffd", value)
    if isinstance(value, dict):
        return {clean_text(str(k)): clean_text(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [clean_text(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None  # jsonb holds no NaN or infinity
    return value


def _within_lease_life(r: LeaseReport, allocation: Allocation, *, now: datetime) -> LeaseReport:
    """`r` dated within its lease's life as the service knows it: not before the lease started, not
    after the service's clock plus AGENT_CLOCK_SKEW. Clamped rather than refused: a wrong clock must not
    cost a job its exit report (it would stay RUNNING for ever), while the clamp keeps the GPU time it
    can credit within the wall time that passed. The agent's own date is kept in `data.agent_at`."""
    at = min(max(r.at, allocation.started_at), now + AGENT_CLOCK_SKEW)
    if at == r.at:
        return r
    logger.warning("lease %s report %s: agent clock %s clamped to %s", r.lease_id, r.seq, r.at, at)
    return replace(r, at=at, data={**r.data, "agent_at": r.at.isoformat()})


@transaction.atomic
def agent_register(*, server: Server, inventory: NodeInventory) -> Server:
    """Replace the server's inventory (cluster_app) with what its agent found; marks it alive.

    Capacity may have appeared (a new or returning server), so an early round is requested.
    """
    server = node_register(server=server, inventory=inventory, busy_gpus=server_busy_gpus().get(server.pk, 0))
    scheduling_round_request_on_commit(trigger="register")
    return server


def agent_heartbeat(*, server: Server, usage: UsageReport) -> Server:
    """Mark the server alive and store its usage sample (stored once per `sampled_at`).

    A live server's heartbeat runs in no transaction of ours: on PostgreSQL it is one statement
    (`node_heartbeat`), committed by itself. A server coming back asks for an early round.
    """
    if server.state not in UNRESPONSIVE_STATES:
        return node_heartbeat(server=server, usage=usage)
    with transaction.atomic():
        server = node_heartbeat(server=server, usage=usage, busy_gpus=server_busy_gpus().get(server.pk, 0))
        if server.state not in UNRESPONSIVE_STATES:
            scheduling_round_request_on_commit(trigger="node_back")
    return server


@transaction.atomic
def agent_reports_ingest(
    *, server: Server, reports: Sequence[LeaseReport], lock_wait_ms: int | None = None
) -> ReportsOutcome:
    """Store and apply a batch of lease reports from `server`'s agent, each exactly once.

    1. Leases of other servers (or unknown) are rejected: an agent acts only for its own server.
    2. Insert-or-ignore every report on the (lease_id, seq) unique constraint, tagging the rows with
       this batch's id; the rows carrying it are the reports seen for the first time. A concurrent
       retry of the same batch waits on the unique index and then inserts nothing, so each report
       is applied by exactly one request.
    3. Apply only the new ones, in seq order per lease, with the affected job rows locked.
    A report dated outside its lease's life is clamped into it (`_within_lease_life`), so that a buggy
    agent cannot inflate a job's attained service; implausible values inside a report are clamped or
    ignored when applied (docs/agent-protocol.md section 4).
    Reports about a profiling run of this server (its lease id) go to the profiling service instead.
    Everything in one transaction: if applying fails, the reports are not recorded either and the
    agent's retry applies them. `lock_wait_ms` bounds the wait for locked rows (PostgreSQL; None: no
    bound).
    """
    if lock_wait_ms is not None and connection.vendor == "postgresql":
        # Waiting longer for the job rows a round holds fails the transaction (LockNotAvailable); the
        # caller leaves the reports unacknowledged and the agent sends them with its next sync.
        with connection.cursor() as cursor:
            cursor.execute(f"SET LOCAL lock_timeout = '{int(lock_wait_ms)}ms'")
    outcome = ReportsOutcome()
    now = timezone.now()
    allocations = leases_of_server(server_id=server.pk, lease_ids={r.lease_id for r in reports})
    runs = profiling_runs_of_server(server=server, lease_ids={r.lease_id for r in reports} - set(allocations))
    if runs:
        outcome.acked += profiling_reports_ingest(
            server=server, runs=runs, reports=[r for r in reports if r.lease_id in runs]
        )
    known: dict[tuple[UUID, int], LeaseReport] = {}
    for r in reports:
        if r.lease_id in runs:
            continue
        if r.lease_id not in allocations:
            outcome.rejected.append(
                {
                    "lease_id": str(r.lease_id),
                    "seq": r.seq,
                    "error": "lease not found on this server",
                    "code": 404,
                }
            )
        else:
            known.setdefault((r.lease_id, r.seq), _within_lease_life(r, allocations[r.lease_id], now=now))
    if not known:
        return outcome
    # The job rows are locked before anything is written: when a round holds them, the lock wait
    # (lock_wait_ms) fails the batch before it cost an insert that would be rolled back.
    jobs = jobs_lock(job_ids={allocations[lease_id].job_id for lease_id, _ in known})
    batch_id = uuid.uuid4()
    # Sorted, so that two overlapping batches insert keys in the same order and cannot deadlock.
    # Strings cleaned once, for the stored row and for what is applied (PostgreSQL refuses NUL).
    ordered = [
        replace(known[k], data=clean_text(known[k].data))
        for k in sorted(known, key=lambda k: (str(k[0]), k[1]))
    ]
    outcome.acked += [(str(r.lease_id), r.seq) for r in ordered]
    inserted = insert_new(
        AgentReport,
        ("lease_id", "seq"),
        [
            {
                "allocation_id": allocations[r.lease_id].pk,
                "lease_id": r.lease_id,
                "seq": r.seq,
                "kind": r.kind,
                "at": r.at,
                "data": r.data,
                "batch_id": batch_id,
                "received_at": now,
            }
            for r in ordered
        ],
        ("lease_id", "seq"),
    )
    fresh = {(UUID(str(lease_id)), seq) for lease_id, seq in inserted}
    to_apply = [r for r in ordered if (r.lease_id, r.seq) in fresh]
    if to_apply:
        exited_jobs = reports_apply(to_apply, now=now, jobs=jobs)
        _next_leases_wake(job_ids=exited_jobs, reporting_server_id=server.pk)
    outcome.applied = len(to_apply)
    return outcome


def _next_leases_wake(*, job_ids: set[int], reporting_server_id: int) -> None:
    """Wake the agents of the jobs' leases not started yet: their `start` waited for the exit just
    recorded (agent_commands holds a moved job's next lease until its stopped process exited), and
    would otherwise wait for their agents' next sync, up to an interval later. The reporting server's
    own commands are computed after its reports, in this sync."""
    if not job_ids or not wake_enabled():
        return
    waiting = Allocation.objects.filter(
        job_id__in=job_ids, ended_at__isnull=True, agent_started_at__isnull=True
    ).exclude(server_id=reporting_server_id)
    agents_wake_on_commit(waiting.values_list("server_id", flat=True))


@transaction.atomic
def agent_reports_prune(*, now: datetime | None = None) -> int:
    """Delete stored reports of leases that ended longer ago than the retention period.

    They only serve idempotency, and an agent stops retrying a lease's reports long before.
    """
    now = now or timezone.now()
    before = now - timedelta(days=scheduler_conf().agent_report_retention_days)
    deleted, _ = AgentReport.objects.filter(allocation__ended_at__lt=before).delete()
    return deleted
