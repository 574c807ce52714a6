"""Applying an agent's new lease reports to their jobs and leases: progress (counted once, clamped),
measured speeds (outliers set aside, observations for the workload's correction), GPU time, logs and
exits. agent_reports_ingest (services/agents.py) stores each report once and calls this for the new ones.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any
from uuid import UUID

from django.db import connection

from cluster_app.conf import node_conf
from infra.bulk_sql import update_from_values
from profiles_app.selectors import (
    workload_interference_factor,
    workload_iter_time_s,
    workload_placement_slowdown,
)
from profiles_app.services.speeds import SpeedMeasurement, speed_observations_record
from profiles_app.services.startups import StartupMeasurement, workload_startups_learn
from scheduler_app.conf import scheduler_conf
from scheduler_app.models import (
    MAX_STORED_ITERS_PER_S,
    TERMINAL_JOB_STATES,
    AgentReportKind,
    Allocation,
    Job,
    JobEvent,
    JobState,
)
from scheduler_app.selectors.agent_reports import leases_with_rank, silent_sibling_servers
from scheduler_app.selectors.restart_facts import checkpoint_every_s_of, lease_lost_work_s
from scheduler_app.services.job_control import job_finish, job_requeue
from scheduler_app.services.job_lifecycle import job_event, job_events_record

MAX_LOG_LINE_CHARS = 2000
# A measured speed this many times above or below the profile's prediction is an outlier: recorded as
# an event, never stored as the lease's speed nor folded into the speed observations.
SPEED_OUTLIER_FACTOR = 1000.0
# Whatever the workload, no speed above this is believed (own commands have no prediction to compare).
MAX_ITERS_PER_S = MAX_STORED_ITERS_PER_S
MAX_REPORTED_ITERS = 2**62  # done_iters above this is malformed (the job row holds a 64-bit integer)
MAX_STOP_CHARS = 24  # "agent_" + stop must fit Allocation.end_reason
REPORT_FIELDS = [
    "agent_started_at",
    "accounted_until",
    "iters_per_s",
    "exit_code",
    "exited_at",
    "log_tail",
    "startup_s",
]
# A start-up longer than this is not believed (a clock jump, a job that waited on something else).
MAX_STARTUP_S = 86400.0


@dataclass(frozen=True)
class LeaseReport:
    """One validated report from an agent; (lease_id, seq) is its idempotency key."""

    lease_id: UUID
    seq: int
    kind: str
    at: datetime
    data: dict[str, Any] = field(default_factory=dict)


def reports_apply(reports: list[LeaseReport], *, now: datetime, jobs: dict[int, Job]) -> set[int]:
    """Apply new reports; `jobs` holds their leases' jobs (and maybe others), rows locked by the
    caller (`jobs_lock`; a lease's job never changes). Returns the jobs one of whose leases reported
    its exit for the first time."""
    conf = scheduler_conf()
    lease_ids = {r.lease_id for r in reports}
    # The jobs are locked (in id order, like every other writer); their leases are read after that: a
    # round or a cancel may have ended a lease between the caller's first read and the lock. A job
    # spread over servers has one lease per server, all created at once (GENIE's placement fit); each
    # lease comes with their number and its rank among them (rank 0 reports the job's progress).
    allocations = leases_with_rank(lease_ids=lease_ids)
    events: list[JobEvent] = []
    dirty_jobs: set[int] = set()
    exited_jobs: set[int] = set()
    measurements: list[SpeedMeasurement] = []
    startups: list[StartupMeasurement] = []
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
            _startup(job, allocation, r, out=startups)
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
                exited_jobs.add(job.pk)
            dirty_jobs.add(job.pk)
            # A job that ends folds its leases' measured speeds into the workload's correction: they
            # must be stored first (exits are rare, so this extra statement is too).
            speed_observations_record(measurements)
            measurements.clear()
            # The batch's events so far (this lease's start, its progress) are stored before the
            # exit's transition, which job_finish stores at once: the timeline orders events of one
            # instant by id, and a start that failed read "failed" before "lease_started".
            job_events_record(events)
            events.clear()
            state = job.state
            events.extend(_exited(job, allocation, r, now=now))
            if job.state != state and job.state in TERMINAL_JOB_STATES:
                # Its end (job_finish) wrote the job's progress and GPU time with it: no second update,
                # unless a later report of this batch changes them again.
                dirty_jobs.discard(job.pk)
    # One statement each, whatever the batch holds. Only the fields reports own: ended_at / end_reason
    # belong to job_finish and the round.
    update_from_values(
        Allocation,
        [
            {"pk": a.pk, **{f: getattr(a, f) for f in REPORT_FIELDS}}
            for a in sorted(allocations.values(), key=lambda a: a.pk)
            if a.lease_id in lease_ids
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
    workload_startups_learn(startups)
    job_events_record(events)
    return exited_jobs


def _startup(job: Job, allocation: Allocation, r: LeaseReport, *, out: list[StartupMeasurement]) -> None:
    """A lease's measured start-up (`startup_s`, launch to first progress, agent seconds), once per
    lease, in the job's own time like its speeds; a catalog workload's teaches its profile. An agent
    that does not measure it sends none: the lease keeps none, the round uses the workload's."""
    measured = r.data.get("startup_s")
    if allocation.startup_s is not None or not _finite(measured) or not 0 <= measured <= MAX_STARTUP_S:
        return
    allocation.startup_s = float(measured) / _time_scale(r)
    if job.workload_id is not None:
        out.append(StartupMeasurement(workload_id=job.workload_id, startup_s=allocation.startup_s))


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


def _lost_work_s(job: Job, allocation: Allocation, *, now: datetime) -> float:
    """The work a restart now loses on this lease (its job's workload is attached: jobs_lock)."""
    return lease_lost_work_s(
        started_at=allocation.started_at,
        agent_started_at=allocation.agent_started_at,
        ended_at=now,
        checkpoint_every_s=checkpoint_every_s_of(
            job_checkpoint_every_s=job.checkpoint_every_s,
            workload_checkpoint_every_s=job.workload.checkpoint_every_s if job.workload_id else None,
        ),
        time_scale=getattr(allocation, "server_time_scale", 1.0),
    )


def _job_finish(**kwargs: Any) -> None:
    """job_finish run inside the caller's transaction (reports are applied in one, jobs locked) without
    its own atomic block, whose savepoint cost an exit two statements more (SAVEPOINT, RELEASE): an
    error there rolls the whole transaction back either way, since nothing here catches it."""
    if not connection.in_atomic_block:  # a caller without a transaction: job_finish's own
        job_finish(**kwargs)
        return
    job_finish.__wrapped__(**kwargs)


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
            _job_finish(
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
        job_requeue(job=job, reason=reason, now=now, lost_work_s=_lost_work_s(job, allocation, now=now))
        return [event]
    if allocation.num_servers > 1 and not oom and not (exit_code == 0 and all_done):
        silent = silent_sibling_servers(
            allocation=allocation,
            heard_since=now - timedelta(seconds=node_conf().not_responding_after_s),
        )
        if silent:
            # A part of a job on several servers fails when another part's server is lost: that part's
            # fence stops it and the collective errors out here, often before the liveness sweep marks
            # the server DOWN. The node failure is the cause, so the job goes back to the queue whole,
            # as the sweep would send it (Slurm: NODE_FAIL), not FAILED. Its next start waits for every
            # earlier lease's exit or fence (selectors/lease_starts.py): nothing runs twice.
            event.data["silent_servers"] = silent
            job_requeue(
                job=job,
                reason="node_down",
                now=now,
                lost_work_s=_lost_work_s(job, allocation, now=now),
                via=JobState.NODE_FAIL,
            )
            return [event]
    if oom:
        _job_finish(
            job=job, state=JobState.OUT_OF_MEMORY, now=now, exit_code=exit_code, reason="oom", data=info
        )
    elif exit_code == 0 and all_done:
        if job.workload_id is None and job.total_iters is not None:
            job.done_iters = job.total_iters  # an own command's work is done when it exits 0
        _job_finish(job=job, state=JobState.COMPLETED, now=now, exit_code=0, data=info)
    else:
        if exit_code is None:  # the agent could not start or lost the process; `error` says why
            reason = "start_failed" if error.startswith("start failed") else "lost"
        elif exit_code == 0:
            reason = "incomplete"
        else:
            reason = f"signal_{signal}" if signal else f"exit_{exit_code}"
        _job_finish(
            job=job,
            state=JobState.FAILED,
            now=now,
            exit_code=exit_code,
            reason=reason,
            message=error,
            data=info,
        )
    return []
