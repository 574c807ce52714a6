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

from cluster_app.bulk_sql import update_from_values
from cluster_app.models import Server
from cluster_app.services import (
    UNRESPONSIVE_STATES,
    NodeInventory,
    UsageReport,
    node_heartbeat,
    node_register,
)
from cluster_app.usage_minutes import insert_new
from profiles_app.selectors import (
    profiling_runs_of_server,
    workload_interference_factor,
    workload_iter_time_s,
    workload_placement_slowdown,
)
from profiles_app.services import SpeedMeasurement, speed_observations_record
from scheduler_app.conf import scheduler_conf
from scheduler_app.models import (
    MAX_STORED_ITERS_PER_S,
    TERMINAL_JOB_STATES,
    AgentReport,
    AgentReportKind,
    Allocation,
    Job,
    JobEvent,
    JobState,
)
from scheduler_app.selectors import server_busy_gpus
from scheduler_app.selectors.agent_reports import jobs_lock, leases_of_server, leases_with_rank
from scheduler_app.services.job_control import job_finish, job_requeue
from scheduler_app.services.jobs import job_event
from scheduler_app.services.profiling import profiling_reports_ingest
from scheduler_app.services.rounds import scheduling_round_request_on_commit

logger = logging.getLogger(__name__)

MAX_LOG_LINE_CHARS = 2000
# How far an agent's clock may run ahead of the service's: a report dated later than the service's clock
# plus this is dated back to it (docs/agent-protocol.md section 4).
AGENT_CLOCK_SKEW = timedelta(seconds=60)
# A measured speed this many times above or below the profile's prediction is an outlier: recorded as
# an event, never stored as the lease's speed nor folded into the speed observations.
SPEED_OUTLIER_FACTOR = 1000.0
# Whatever the workload, no speed above this is believed (own commands have no prediction to compare).
MAX_ITERS_PER_S = MAX_STORED_ITERS_PER_S
MAX_REPORTED_ITERS = 2**62  # done_iters above this is malformed (the job row holds a 64-bit integer)
AGENT_REPORT_MAX_SEQ = 2**63 - 1
MAX_STOP_CHARS = 24  # "agent_" + stop must fit Allocation.end_reason
REPORT_FIELDS = ["agent_started_at", "accounted_until", "iters_per_s", "exit_code", "exited_at", "log_tail"]


@dataclass(frozen=True)
class LeaseReport:
    """One validated report from an agent; (lease_id, seq) is its idempotency key."""

    lease_id: UUID
    seq: int
    kind: str
    at: datetime
    data: dict[str, Any] = field(default_factory=dict)


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
        _apply_reports(to_apply, now=now, job_ids={allocations[r.lease_id].job_id for r in to_apply})
    outcome.applied = len(to_apply)
    return outcome


def _apply_reports(reports: list[LeaseReport], *, now: datetime, job_ids: set[int]) -> None:
    """Apply new reports of the leases of `job_ids` (a lease's job never changes)."""
    conf = scheduler_conf()
    lease_ids = {r.lease_id for r in reports}
    # Lock the jobs (in id order, like every other writer), then re-read their leases: a round or a
    # cancel may have ended a lease between our first read and the lock. A job spread over servers has
    # one lease per server, all created at once (GENIE's placement fit); each lease comes with their
    # number and its rank among them (rank 0 reports the job's progress).
    jobs = jobs_lock(job_ids=job_ids)
    allocations = leases_with_rank(lease_ids=lease_ids)
    events: list[JobEvent] = []
    dirty_jobs: set[int] = set()
    measurements: list[SpeedMeasurement] = []
    for r in reports:  # already in (lease, seq) order
        allocation = allocations[r.lease_id]
        job = jobs[allocation.job_id]
        if r.kind == AgentReportKind.STARTED:
            if allocation.agent_started_at is None:
                allocation.agent_started_at = r.at
            if allocation.accounted_until is None:
                # GPU time is credited from the lease's start at the earliest (the agent's clock may lag).
                allocation.accounted_until = max(r.at, allocation.started_at)
            data = {**r.data, "lease_id": str(r.lease_id), "seq": r.seq, "agent_at": r.at.isoformat()}
            isolation = str(r.data.get("isolation", ""))[:64]
            events.append(job_event(job, "lease_started", reason=isolation, at=now, data=data))
        elif r.kind == AgentReportKind.PROGRESS:
            events.extend(_progress(job, allocation, r, gpus=allocation.num_gpus, now=now, out=measurements))
            dirty_jobs.add(job.pk)
        elif r.kind == AgentReportKind.LOG:
            lines = [str(line)[:MAX_LOG_LINE_CHARS] for line in r.data.get("lines", [])]
            if lines:
                tail = (allocation.log_tail.splitlines() if allocation.log_tail else []) + lines
                allocation.log_tail = "\n".join(tail[-conf.log_tail_lines :])
        elif r.kind == AgentReportKind.EXITED:
            events.extend(_progress(job, allocation, r, gpus=allocation.num_gpus, now=now))
            if allocation.exited_at is None:
                allocation.exited_at = r.at  # a moved job's next lease waits for this (agent_commands)
            dirty_jobs.add(job.pk)
            # A job that ends folds its leases' measured speeds into the workload's correction: they
            # must be stored first (exits are rare, so this extra statement is too).
            speed_observations_record(measurements)
            measurements.clear()
            events.extend(_exited(job, allocation, r, now=now))
    # One statement each, whatever the batch holds. Only the fields reports own: ended_at / end_reason
    # belong to job_finish and the round.
    touched = {r.lease_id for r in reports}
    update_from_values(
        Allocation,
        [
            {"pk": a.pk, **{f: getattr(a, f) for f in REPORT_FIELDS}}
            for a in sorted(allocations.values(), key=lambda a: a.pk)
            if a.lease_id in touched
        ],
        REPORT_FIELDS,
    )
    update_from_values(
        Job,
        [
            {
                "pk": j,
                "done_iters": jobs[j].done_iters,
                "attained_service_gpu_s": jobs[j].attained_service_gpu_s,
            }
            for j in sorted(dirty_jobs)
        ],
        ["done_iters", "attained_service_gpu_s"],
    )
    speed_observations_record(measurements)
    JobEvent.objects.bulk_create(events)


def _progress(
    job: Job,
    allocation: Allocation,
    r: LeaseReport,
    *,
    gpus: int,
    now: datetime,
    out: list[SpeedMeasurement] | None = None,
) -> list[JobEvent]:
    """Progress never goes backwards nor past the job's total (a report above it is clamped, and the
    clamp recorded) and is counted once, from rank 0 (every part of a multi-node job runs the same
    training loop); GPU-seconds are credited to every part for agent time since its last report, never
    from before the lease started (reports dated after the service's clock were rejected on arrival)."""
    events: list[JobEvent] = []
    done = r.data.get("done_iters")
    if _finite(done) and done >= 0 and allocation.rank == 0:
        reported = min(int(done), MAX_REPORTED_ITERS)  # the serializer refuses more; direct callers
        if job.total_iters is not None and reported > job.total_iters:
            events.append(
                job_event(
                    job,
                    "progress_clamped",
                    reason="above_total_iters",
                    at=now,
                    data={
                        "lease_id": str(r.lease_id),
                        "seq": r.seq,
                        "reported_done_iters": reported,
                        "total_iters": job.total_iters,
                    },
                )
            )
            reported = job.total_iters
        job.done_iters = max(job.done_iters, reported)
    ips = _measured_speed(r)
    if ips is not None:
        outlier = _speed_outlier(job, allocation, r, ips)
        if outlier is not None:
            events.append(job_event(job, "speed_outlier", reason=outlier[0], at=now, data=outlier[1]))
        else:
            allocation.iters_per_s = ips
            if r.kind == AgentReportKind.PROGRESS and out is not None:  # not an exit's last figure
                measurement = _observed_speed(job, allocation, r, ips)
                if measurement is not None:
                    out.append(measurement)
    start = allocation.started_at
    if allocation.accounted_until is not None and r.at > allocation.accounted_until:
        job.attained_service_gpu_s += gpus * (r.at - allocation.accounted_until).total_seconds()
    if allocation.accounted_until is None:
        allocation.accounted_until = max(r.at, start)
    elif r.at > allocation.accounted_until:
        allocation.accounted_until = r.at
    return events


def _finite(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _measured_speed(r: LeaseReport) -> float | None:
    """The report's measured speed, in the agent's time (None: not measured, i.e. absent, 0 or not a
    finite positive number)."""
    ips = r.data.get("iters_per_s")
    return float(ips) if _finite(ips) and ips > 0 else None


def _time_scale(r: LeaseReport) -> float:
    scale = r.data.get("time_scale")
    return float(scale) if _finite(scale) and scale > 0 else 1.0


def _predicted_speed(job: Job, allocation: Allocation) -> float | None:
    """The profile's prediction for this lease, in the workload's own time (None: no profile)."""
    workload = job.workload
    if workload is None or not workload.tput_matrix or not workload.iter_time_s or allocation.speedup <= 0:
        return None
    return allocation.speedup / workload_iter_time_s(workload, job.num_gpus)


def _speed_outlier(
    job: Job, allocation: Allocation, r: LeaseReport, ips: float
) -> tuple[str, dict[str, Any]] | None:
    """(reason, data) when `ips` is not believable for this lease: above MAX_ITERS_PER_S, or more than
    SPEED_OUTLIER_FACTOR times off the profile's prediction; None when it is believable."""
    measured = ips * _time_scale(r)
    predicted = _predicted_speed(job, allocation)
    info: dict[str, Any] = {
        "lease_id": str(r.lease_id),
        "seq": r.seq,
        "reported_iters_per_s": ips,
        "time_scale": _time_scale(r),
        "predicted_iters_per_s": predicted,
    }
    if ips > MAX_ITERS_PER_S or not math.isfinite(measured):
        return "above_max_speed", info
    if predicted is not None and not (
        predicted / SPEED_OUTLIER_FACTOR <= measured <= predicted * SPEED_OUTLIER_FACTOR
    ):
        return "far_from_prediction", info
    return None


def _observed_speed(job: Job, allocation: Allocation, r: LeaseReport, ips: float) -> SpeedMeasurement | None:
    """Predicted (the allocation's speed-up / seconds per iteration at proportional) versus measured;
    None when nothing was predicted (own command, or not profiled)."""
    workload = job.workload
    predicted = _predicted_speed(job, allocation)
    if workload is None or predicted is None:
        return None
    # A fake node runs synthetic jobs `time_scale` times faster; compare in the workload's own time.
    gpus = max(1, allocation.num_gpus)
    return SpeedMeasurement(
        workload_id=workload.pk,
        job_id=job.pk,
        allocation_id=allocation.pk,
        cpus_per_gpu=allocation.num_cpus / gpus,
        mem_gb_per_gpu=allocation.mem_gb / gpus,
        predicted_iters_per_s=predicted,
        measured_iters_per_s=ips * _time_scale(r),
        at=r.at,
        num_servers=allocation.num_servers,
        # The allocation's speed-up holds the penalty its round applied: today's, barring a refit since.
        placement_penalty=workload_placement_slowdown(workload, job.num_gpus, allocation.num_servers),
        colocated_comm_jobs=allocation.colocated_comm_jobs,
        interference_factor=workload_interference_factor(
            workload, job.num_gpus, allocation.colocated_comm_jobs
        ),
    )


def _exited(job: Job, allocation: Allocation, r: LeaseReport, *, now: datetime) -> list[JobEvent]:
    """What a lease's exit means for its job (see agent protocol, section 4)."""
    # The serializer let through only exit codes 0-255 and signals 1-64; checked again, as the row's
    # CHECK constraint would refuse anything else.
    exit_code = r.data.get("exit_code")
    signal = r.data.get("signal")
    if not (isinstance(signal, int) and not isinstance(signal, bool) and 1 <= signal <= 64):
        signal = None
    oom = bool(r.data.get("oom"))
    if not (isinstance(exit_code, int) and not isinstance(exit_code, bool) and 0 <= exit_code <= 255):
        exit_code = 128 + signal if signal is not None else None
    allocation.exit_code = exit_code
    stop = r.data.get("stop")
    if stop is not None and not isinstance(stop, bool):
        stop = str(stop)[:MAX_STOP_CHARS]
    error = str(r.data.get("error") or "")
    info = {
        "lease_id": str(r.lease_id),
        "seq": r.seq,
        "exit_code": exit_code,
        "signal": signal,
        "oom": oom,
        "stop": stop,
        "error": error,
        "agent_at": r.at.isoformat(),
    }
    event = job_event(job, "lease_exited", reason=allocation.end_reason or "exited", at=now, data=info)
    if job.state in TERMINAL_JOB_STATES:
        # Cancelled, or finished through another lease: the agent merely confirms the process is gone.
        return [event]
    all_done = job.workload_id is None or job.done_iters >= job.total_iters
    if allocation.num_servers > 1 and allocation.rank > 0 and exit_code == 0 and not oom and not stop:
        # Gang semantics, as Slurm's: the job ends with its rank 0 (which then stops every other part);
        # a part that finishes first keeps its resources until then and ends nothing.
        return [event]
    if allocation.ended_at is not None:
        # The service ended this lease (preempted by a round, node failure): the job is already back
        # in the queue or running elsewhere, with its progress kept -- unless the process managed to
        # finish all its work during the grace period.
        if exit_code == 0 and not oom and job.workload_id is not None and all_done:
            job_finish(
                job=job,
                state=JobState.COMPLETED,
                now=now,
                exit_code=0,
                reason="finished_on_preemption",
                data=info,
            )
        return [event]
    if stop and not oom:
        # The agent stopped a lease the service still counts as running (it was shutting down): not
        # the job's fault, so it goes back to the queue with its progress, like a preemption.
        reason = str(stop) if str(stop).startswith("agent") else f"agent_{stop}"
        job_requeue(job=job, reason=reason, now=now)
        return [event]
    if oom:
        job_finish(
            job=job, state=JobState.OUT_OF_MEMORY, now=now, exit_code=exit_code, reason="oom", data=info
        )
    elif exit_code == 0 and all_done:
        if job.workload_id is None and job.total_iters is not None:
            job.done_iters = job.total_iters  # an own command's work is done when it exits 0
        job_finish(job=job, state=JobState.COMPLETED, now=now, exit_code=0, data=info)
    else:
        if exit_code is None:  # the agent could not start or lost the process; `error` says why
            reason = "start_failed" if error.startswith("start failed") else "lost"
        elif exit_code == 0:
            reason = "incomplete"
        else:
            reason = f"signal_{signal}" if signal else f"exit_{exit_code}"
        job_finish(
            job=job,
            state=JobState.FAILED,
            now=now,
            exit_code=exit_code,
            reason=reason,
            message=error,
            data=info,
        )
    return []


@transaction.atomic
def agent_reports_prune(*, now: datetime | None = None) -> int:
    """Delete stored reports of leases that ended longer ago than the retention period.

    They only serve idempotency, and an agent stops retrying a lease's reports long before.
    """
    now = now or timezone.now()
    before = now - timedelta(days=scheduler_conf().agent_report_retention_days)
    deleted, _ = AgentReport.objects.filter(allocation__ended_at__lt=before).delete()
    return deleted
