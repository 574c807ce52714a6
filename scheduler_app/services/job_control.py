"""Use cases of a job after submission: ending it (finish, cancel, time limit), requeueing it, holding
and releasing it, and ending leases; its state changes themselves are services/job_lifecycle.py's."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from datetime import datetime
from functools import cache
from typing import Any

from django.contrib.auth.models import AbstractBaseUser
from django.core.exceptions import PermissionDenied, ValidationError
from django.db import connection, transaction
from django.db.models import F, OuterRef, Subquery, Value
from django.db.models.functions import Greatest
from django.utils import timezone

from cluster_app.agent_wake import agents_wake_on_commit, wake_enabled
from infra.vendor import is_postgresql
from scheduler_app.models import TERMINAL_JOB_STATES, Allocation, AllocationGpu, Job, JobState, PendingReason
from scheduler_app.selectors import jobs_run_time_s
from scheduler_app.services.admission import admission_predict_released
from scheduler_app.services.job_end import job_end_followups
from scheduler_app.services.job_lifecycle import (
    JobStateError,
    job_event_append,
    job_transition,
    jobs_requeue,
    transition_check,
)
from scheduler_app.services.job_requests import MAX_ARRAY_TASKS, MAX_DURATION_S
from scheduler_app.services.round_requests import scheduling_round_request_on_commit

logger = logging.getLogger(__name__)

__all__ = [  # JobStateError is the lifecycle's; the views catch it from here, with the use cases
    "JobStateError",
    "allocations_end",
    "job_allocations_end",
    "job_array_update",
    "job_cancel",
    "job_finish",
    "job_hold",
    "job_release",
    "job_release_allowed",
    "job_requeue",
    "jobs_time_limit_enforce",
]


def allocations_end(
    *,
    allocation_ids: Iterable[int],
    reason: str,
    now: datetime,
    server_ids: Iterable[int] | None = None,
    lost_work_s: Mapping[int, float] | None = None,
) -> int:
    """End the given active leases and release their GPUs, in the caller's transaction.

    The GPUs are released in the same transaction as the lease ends, so a GPU is never seen free
    while its lease still counts as active, nor the other way round. Their servers' agents are woken
    after commit (`server_ids`: those servers, when the caller read them already). `lost_work_s`:
    lease id -> the work it loses, for leases a restart ends (a move, a preemption), stored with the
    end. Returns the leases ended.
    """
    ids = list(allocation_ids)
    if not ids:
        return 0
    if is_postgresql():
        return _leases_end_statement(column="id", keys=ids, reason=reason, now=now, lost_work_s=lost_work_s)
    # Greatest: a caller's `now` may predate a lease that a concurrent round created while the caller
    # waited for the job lock; a lease never ends before it starts (check constraint).
    ended = Allocation.objects.filter(pk__in=ids, ended_at__isnull=True).update(
        ended_at=Greatest(Value(now), F("started_at")), end_reason=reason
    )
    _lost_work_store("id", lost_work_s)
    # Each hold is released when its lease ended (not at `now`, which may predate the lease's start).
    AllocationGpu.objects.filter(allocation_id__in=ids, released_at__isnull=True).update(
        released_at=Subquery(Allocation.objects.filter(pk=OuterRef("allocation_id")).values("ended_at")[:1])
    )
    if ended and wake_enabled():  # their agents stop the processes now, not at their next sync
        if server_ids is None:
            server_ids = Allocation.objects.filter(pk__in=ids).values_list("server_id", flat=True)
        agents_wake_on_commit(server_ids)
    return ended


def job_allocations_end(
    *, job_ids: Iterable[int], reason: str, now: datetime, lost_work_s: Mapping[int, float] | None = None
) -> int:
    """End every active lease of the given jobs (see allocations_end; `lost_work_s`: job id -> the work
    each of its leases loses, for a restart)."""
    jobs = list(job_ids)
    if is_postgresql():
        if not jobs:
            return 0
        return _leases_end_statement(
            column="job_id", keys=jobs, reason=reason, now=now, lost_work_s=lost_work_s
        )
    active = Allocation.objects.filter(job_id__in=jobs, ended_at__isnull=True)
    leases = list(active.values_list("id", "server_id", "job_id"))
    lost = (
        {lease: lost_work_s[job] for lease, _, job in leases if job in lost_work_s} if lost_work_s else None
    )
    return allocations_end(
        allocation_ids=[lease for lease, _, _ in leases],
        reason=reason,
        now=now,
        server_ids=[server for _, server, _ in leases],
        lost_work_s=lost,
    )


def _lost_work_store(column: str, lost_work_s: Mapping[int, float] | None) -> None:
    """Elsewhere than PostgreSQL (the embedded SQLite): the ended leases' lost work, one update each."""
    for key, lost in (lost_work_s or {}).items():
        Allocation.objects.filter(**{column: key}).update(lost_work_s=lost)


def _leases_end_statement(
    *, column: str, keys: list[int], reason: str, now: datetime, lost_work_s: Mapping[int, float] | None
) -> int:
    """`allocations_end` on PostgreSQL in one statement: the active leases whose `column` ("id" or
    "job_id") is in `keys` ended (with the work each loses, where `lost_work_s` has it for its key),
    their GPU holds released at the lease's end, their servers woken after commit. Three ORM
    statements were a quarter of an agent's sync that reports a job's exit."""
    keys = sorted(set(keys))
    lost = [(lost_work_s or {}).get(key) for key in keys]
    with connection.cursor() as cursor:
        cursor.execute(_leases_end_sql(column), {"keys": keys, "lost": lost, "now": now, "reason": reason})
        ended = cursor.fetchall()
    if ended and wake_enabled():  # their agents stop the processes now, not at their next sync
        agents_wake_on_commit(server_id for _, server_id in ended)
    return len(ended)


@cache
def _leases_end_sql(column: str) -> str:
    if column not in ("id", "job_id"):
        raise ValueError(f"leases are ended by id or job_id, not {column}")
    qn = connection.ops.quote_name
    leases, holds = qn(Allocation._meta.db_table), qn(AllocationGpu._meta.db_table)
    # Greatest: a caller's `now` may predate a lease that a concurrent round created while the caller
    # waited for the job lock; a lease never ends before it starts (check constraint). Each hold is
    # released when its lease ended. The holds' UPDATE reads the leases' new end from the first CTE:
    # a sibling CTE sees the table as it was before the statement.
    # The lost work travels as an array beside the keys (NULL: not a restart, the column is kept).
    return (
        f"WITH ended AS ("
        f" UPDATE {leases} a SET ended_at = GREATEST(%(now)s, a.started_at), end_reason = %(reason)s,"
        f" lost_work_s = COALESCE(v.lost, a.lost_work_s)"
        f" FROM unnest(%(keys)s::bigint[], %(lost)s::float8[]) AS v(key, lost)"
        f" WHERE a.{column} = v.key AND a.ended_at IS NULL"
        f" RETURNING a.id, a.server_id, a.ended_at),"
        f" released AS ("
        f" UPDATE {holds} h SET released_at = ended.ended_at FROM ended"
        f" WHERE h.allocation_id = ended.id AND h.released_at IS NULL)"
        f" SELECT id, server_id FROM ended"
    )


@transaction.atomic
def job_finish(
    *,
    job: Job,
    state: str,
    now: datetime | None = None,
    exit_code: int | None = None,
    reason: str = "",
    message: str = "",
    data: dict[str, Any] | None = None,
) -> Job:
    """End a job in a terminal `state`: its leases end (GPUs released), an event, an early round, and
    its end's follow-ups (services/job_end.py: now, or by the applier within seconds).

    The caller holds the job row locked (select_for_update). A change the lifecycle's table does not
    allow is refused (JobTransitionError) before anything is written.
    """
    if state not in TERMINAL_JOB_STATES:
        raise ValueError(f"{state} is not a terminal job state")
    transition_check(job.state, state)  # refused before anything is written
    now = now or timezone.now()
    job_allocations_end(job_ids=[job.pk], reason=state.lower(), now=now)
    job.finished_at = now
    job.pending_reason = PendingReason.NONE
    if exit_code is not None:
        job.exit_code = exit_code
    job_transition(
        job,
        state,
        reason=reason,
        message=message,
        data=data,
        at=now,
        fields=["finished_at", "pending_reason", "exit_code", "done_iters", "attained_service_gpu_s"],
    )
    # The learning, the admission outcome and the notification: now, or by the applier (job_end.py).
    job_end_followups(job=job, state=state, reason=reason, data=data)
    scheduling_round_request_on_commit(trigger="job_end")
    return job


@transaction.atomic
def job_requeue(
    *,
    job: Job,
    reason: str,
    now: datetime | None = None,
    lost_work_s: float | None = None,
    via: str | None = None,
) -> Job:
    """Send a running job back to the queue with its progress (jobs_requeue): its leases end (with the
    work they lose, `lost_work_s`: a restart), an early round. For stops that are nobody's fault (the
    agent shut down). The caller holds the job row locked and writes the progress it changed
    (report_apply does). `via`: the passing state it goes through (NODE_FAIL: a server it ran on was
    lost)."""
    now = now or timezone.now()
    transition_check(job.state, JobState.PENDING)  # refused before its leases end
    lost = {job.pk: lost_work_s} if lost_work_s is not None else None
    job_allocations_end(job_ids=[job.pk], reason=reason, now=now, lost_work_s=lost)
    jobs_requeue(jobs=[job], reason=reason, now=now, via=via)
    scheduling_round_request_on_commit(trigger="requeue")
    return job


@transaction.atomic
def job_cancel(*, job: Job, by: AbstractBaseUser | None = None) -> Job:
    """Cancel a pending or running job: CANCELLED at once, its leases end and agents stop them on
    their next poll (the `cancel` command)."""
    # Lock the row: a round or an agent report may be changing this job right now.
    job = Job.objects.select_for_update().get(pk=job.pk)
    if job.state in TERMINAL_JOB_STATES:
        raise JobStateError(f"job {job.pk} is already {job.state}")
    by_name = getattr(by, "username", "") if by is not None else ""
    return job_finish(
        job=job,
        state=JobState.CANCELLED,
        reason="cancelled_by_user",
        message=f"cancelled by {by_name}" if by_name else "cancelled",
        data={"cancelled_by_id": by.pk} if by is not None else None,  # notifications: who cancelled
    )


@transaction.atomic
def job_hold(*, job: Job, by: AbstractBaseUser) -> Job:
    """Keep a PENDING job out of the queue until it is released (Slurm's `scontrol hold`).

    Its owner's hold (JobHeldUser) the owner or staff may release; staff holding someone else's job
    make it JobHeldAdmin, which only staff may release. Holding a held job again changes nothing,
    except that staff turn an owner's hold into theirs.
    """
    job = Job.objects.select_for_update().get(pk=job.pk)
    if job.state != JobState.PENDING:
        raise JobStateError(f"job {job.pk} is {job.state}: only a pending job can be held")
    by_admin = bool(by.is_staff) and by.pk != job.owner_id
    reason = PendingReason.HELD_ADMIN if by_admin else PendingReason.HELD_USER
    if job.held and (job.pending_reason == PendingReason.HELD_ADMIN or not by_admin):
        return job
    job.held, job.pending_reason = True, reason
    job.save(update_fields=["held", "pending_reason"])
    job_event_append(job=job, kind="held", reason=reason, message=f"held by {by.get_username()}")
    return job


def job_release_allowed(job: Job, by: AbstractBaseUser) -> bool:
    """An administrator's hold only staff may release; an owner's hold, whoever may see the job."""
    return bool(by.is_staff) or job.pending_reason != PendingReason.HELD_ADMIN


@transaction.atomic
def job_release(*, job: Job, by: AbstractBaseUser) -> Job:
    """Put a held job back in the queue (`scontrol release`) and ask for an early round."""
    job = Job.objects.select_for_update().get(pk=job.pk)
    if not job.held:
        raise JobStateError(f"job {job.pk} is not held")
    if not job_release_allowed(job, by):
        raise PermissionDenied(f"job {job.pk} was held by an administrator: only staff can release it")
    job.held, job.pending_reason = False, PendingReason.PRIORITY
    job.save(update_fields=["held", "pending_reason"])
    message = f"released by {by.get_username()}"
    job_event_append(job=job, kind="released", reason=PendingReason.PRIORITY, message=message)
    admission_predict_released(job=job)
    scheduling_round_request_on_commit(trigger="release")
    return job


@transaction.atomic
def job_update(
    *, job: Job, by: AbstractBaseUser, time_limit_s: int | None = None, array_task_limit: int | None = None
) -> Job:
    """Change a pending or running job's time limit, or its array's limit on tasks running at once
    (Slurm's `scontrol update TimeLimit=` and `ArrayTaskThrottle=`); None leaves a field as it is.

    As with Slurm, only staff may raise a time limit (setting one on a job without any lowers it): the
    forecast and the rounds planned the queue around the limit given. A running job already past its
    new limit ends at the next enforcement (TIMEOUT). An array limit applies to every task of the
    job's array; 0 removes it. Lowered, it stops no running task: the next ones wait until the
    running ones are fewer than the limit. Raises ValidationError per field, PermissionDenied for a
    raise by its owner, JobStateError for an ended job.
    """
    job = Job.objects.select_for_update().get(pk=job.pk)
    if job.state not in (JobState.PENDING, JobState.RUNNING):
        raise JobStateError(f"job {job.pk} is {job.state}: only a pending or running job can be updated")
    errors: dict[str, list[str]] = {}
    changes: list[str] = []
    data: dict[str, Any] = {}
    if time_limit_s is not None and time_limit_s != job.time_limit_s:
        if not 1 <= time_limit_s <= MAX_DURATION_S:
            errors["time_limit_s"] = [f"A time limit is from 1 second to {MAX_DURATION_S // 86400} days."]
        elif not by.is_staff and job.time_limit_s is not None and time_limit_s > job.time_limit_s:
            raise PermissionDenied(
                f"job {job.pk}: only staff can raise a time limit ({job.time_limit_s} s now); "
                "you may lower it"
            )
        else:
            was = "none" if job.time_limit_s is None else f"{job.time_limit_s} s"
            changes.append(f"time limit {was} -> {time_limit_s} s")
            data["time_limit_s"] = [job.time_limit_s, time_limit_s]
    new_array_limit = job.array_task_limit if array_task_limit is None else (array_task_limit or None)
    if array_task_limit is not None:
        if job.array_job_id is None:
            errors["array_task_limit"] = [f"job {job.pk} is not a task of an array."]
        elif not 0 <= array_task_limit <= MAX_ARRAY_TASKS:
            errors["array_task_limit"] = [f"An array's limit is from 1 to {MAX_ARRAY_TASKS} (0: none)."]
        elif new_array_limit != job.array_task_limit:
            was = job.array_task_limit or "none"
            changes.append(f"array {job.array_job_id}'s tasks at once {was} -> {new_array_limit or 'none'}")
            data["array_task_limit"] = [job.array_task_limit, new_array_limit]
    if errors:
        raise ValidationError(errors)
    if not changes:
        return job
    if "time_limit_s" in data:
        job.time_limit_s = time_limit_s
        job.save(update_fields=["time_limit_s"])
    if "array_task_limit" in data:
        Job.objects.filter(array_job_id=job.array_job_id).update(array_task_limit=new_array_limit)
        job.array_task_limit = new_array_limit
    job_event_append(
        job=job, kind="updated", message=f"{', '.join(changes)} by {by.get_username()}", data=data
    )
    # A raised array limit lets tasks start; a new time limit changes the forecast (a round refreshes it).
    scheduling_round_request_on_commit(trigger="update")
    return job


def job_array_update(
    *, job: Job, by: AbstractBaseUser, time_limit_s: int | None = None, array_task_limit: int | None = None
) -> tuple[list[int], dict[int, str]]:
    """job_update on every pending or running task of `job`'s array, in index order (scontrol update
    JobId=ARRAYID): the ids changed, and each refused task's reason (one refused, the others still
    change, each in its own transaction, as the CLI's `update --array` sends them)."""
    live = (JobState.PENDING, JobState.RUNNING)
    tasks = Job.objects.filter(array_job_id=job.array_job_id, state__in=live).order_by("array_task_id")
    updated: list[int] = []
    refused: dict[int, str] = {}
    for task in tasks:
        try:
            job_update(job=task, by=by, time_limit_s=time_limit_s, array_task_limit=array_task_limit)
        except ValidationError as exc:
            refused[task.pk] = " ".join(exc.messages)
        except (PermissionDenied, JobStateError) as exc:
            refused[task.pk] = str(exc)
        else:
            updated.append(task.pk)
    return updated, refused


def jobs_time_limit_enforce(*, now: datetime | None = None) -> list[int]:
    """End RUNNING jobs whose run time has reached their `time_limit_s` (TIMEOUT, as Slurm does).

    Run time counts only the time the job held resources, so a job paused by preemption is not
    charged for waiting. Their leases end here; agents stop the processes on their next poll, as for
    a cancel. Returns the ids of the jobs ended.
    """
    now = now or timezone.now()
    running = Job.objects.filter(state=JobState.RUNNING, time_limit_s__isnull=False)
    limits = dict(running.values_list("pk", "time_limit_s"))
    used_s = jobs_run_time_s(job_ids=limits, now=now)
    over = [job_id for job_id, limit_s in limits.items() if used_s.get(job_id, 0.0) >= limit_s]
    ended = []
    for job_id in over:
        with transaction.atomic():
            job = Job.objects.select_for_update().get(pk=job_id)
            if job.state != JobState.RUNNING:
                continue  # it ended or was requeued meanwhile
            job_finish(
                job=job,
                state=JobState.TIMEOUT,
                now=now,
                reason="time_limit",
                message=f"time limit of {job.time_limit_s} s reached",
            )
            ended.append(job_id)
    return ended
