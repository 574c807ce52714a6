"""A job's lifecycle: the table of its allowed state changes; the only writer of Job.state and JobEvent.

Every change of a job's state goes through this module, checked against TRANSITIONS: submission
(job_create), one job's change (job_transition: finish, cancel, timeout), the requeue (jobs_requeue:
an agent's shutdown, a node failure), a round's bulk form (jobs_transition_bulk, one statement) and a
bench's synthetic past (jobs_history_insert). The caller holds the job rows locked (select_for_update),
as every writer of a job does, and does the rest of the use case (leases, follow-ups, an early round):
this module imports models, selectors and infra only (a bottom module: no use-case service).

PREEMPTED and NODE_FAIL are passing states: a job goes through them within one transaction (a round
moves it or requeues it; a node failure requeues it), so its events tell the way (RUNNING ->
PREEMPTED -> PENDING) while its row goes from RUNNING to where it ends up.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from types import MappingProxyType
from typing import Any

from django.db import DatabaseError, connection
from django.db.models import Value
from django.db.models.functions import Coalesce
from django.utils import timezone

from infra.bulk_sql import model_row_insert_with, model_rows_insert, update_from_values
from infra.vendor import is_postgresql
from scheduler_app.models import Job, JobEvent, JobState, PendingReason
from scheduler_app.selectors import JobLike

logger = logging.getLogger(__name__)

NEW = ""  # the state a job comes from when it is submitted (its first event's from_state)


@dataclass(frozen=True)
class Transition:
    """One allowed change of state: the kind of the event that records it, and when it happens."""

    kind: str
    why: str


_S = JobState
_T = Transition
# The allowed changes, (from, to) -> the event that records it and why it happens. A change not listed
# is refused (JobTransitionError); a terminal state has no way out.
TRANSITIONS: Mapping[tuple[str, str], Transition] = MappingProxyType(
    {
        (NEW, _S.PENDING): _T("submitted", "submitted: it waits in the queue (maybe held, or for others)"),
        (_S.PENDING, _S.RUNNING): _T("scheduled", "a round placed it"),
        (_S.PENDING, _S.CANCELLED): _T("cancelled", "cancelled before it ran"),
        (_S.PENDING, _S.COMPLETED): _T(
            "completed", "a lease the service had ended (preempted, node failure) finished its work meanwhile"
        ),
        (_S.RUNNING, _S.PENDING): _T(
            "requeued", "stopped by no fault of its own (its agent shut down; running without a lease)"
        ),
        (_S.RUNNING, _S.PREEMPTED): _T("preempted", "a round took its resources, to move it or requeue it"),
        (_S.PREEMPTED, _S.RUNNING): _T("rescheduled", "the same round placed it elsewhere (a move)"),
        (_S.PREEMPTED, _S.PENDING): _T("requeued", "the round left it waiting, with its progress"),
        (_S.RUNNING, _S.NODE_FAIL): _T("node_fail", "a server it ran on went DOWN"),
        (_S.NODE_FAIL, _S.PENDING): _T("requeued", "back to the queue with its progress, to restart whole"),
        (_S.RUNNING, _S.COMPLETED): _T("completed", "its processes exited 0 with all its work done"),
        (_S.RUNNING, _S.FAILED): _T(
            "failed", "a process exited non-zero, was lost or never started, or exited 0 short of its work"
        ),
        (_S.RUNNING, _S.OUT_OF_MEMORY): _T("out_of_memory", "a process was killed for lack of memory"),
        (_S.RUNNING, _S.TIMEOUT): _T("timeout", "its run time reached its time limit"),
        (_S.RUNNING, _S.CANCELLED): _T("cancelled", "cancelled while running: its agents stop it"),
    }
)
# A row whose state stays as it is may still change its pending reason (a round, a hold): not a
# transition, but allowed only in a live state.
_REASON_ONLY_STATES = frozenset({_S.PENDING, _S.RUNNING})


class JobStateError(Exception):
    """The job's state does not allow the change (e.g. cancelling a finished job)."""


class JobTransitionError(JobStateError):
    """A change of state that TRANSITIONS does not allow, or a row that was not in the state expected."""


def transition_check(from_state: str, to_state: str) -> Transition:
    """The table's entry for from_state -> to_state; JobTransitionError when there is none."""
    transition = TRANSITIONS.get((from_state, to_state))
    if transition is None:
        raise JobTransitionError(f"a job cannot go from {from_state or 'nothing'} to {to_state}")
    return transition


# ---------------------------------------------------------------------------------------------------
# Events: a job's append-only history
# ---------------------------------------------------------------------------------------------------


def job_event(
    job: JobLike,
    kind: str,
    *,
    reason: str = "",
    message: str = "",
    data: dict[str, Any] | None = None,
    at: datetime | None = None,
) -> JobEvent:
    """An unsaved event that changes no state (a lease started, a hold), for job_events_record."""
    return _event(job, kind, reason=reason, message=message, data=data, at=at)


def transition_event(
    job: JobLike,
    from_state: str,
    to_state: str,
    *,
    reason: str = "",
    message: str = "",
    data: dict[str, Any] | None = None,
    at: datetime | None = None,
) -> JobEvent:
    """An unsaved event recording from_state -> to_state (the table's kind); refused if not in the table."""
    kind = transition_check(from_state, to_state).kind
    return _event(
        job, kind, from_state=from_state, to_state=to_state, reason=reason, message=message, data=data, at=at
    )


def job_interruption_events(
    job: JobLike,
    *,
    via: str,
    to_state: str,
    reason: str,
    next_reason: str,
    at: datetime,
    data: dict[str, Any] | None = None,
    next_data: dict[str, Any] | None = None,
) -> list[JobEvent]:
    """The two events of a running job that loses its resources through a passing state `via`
    (PREEMPTED, NODE_FAIL): the interruption, then where it goes next (`to_state`: the queue, or
    RUNNING again elsewhere)."""
    return [
        transition_event(job, job.state, via, reason=reason, at=at, data=data),
        transition_event(job, via, to_state, reason=next_reason, at=at, data=next_data),
    ]


def job_event_append(
    *,
    job: JobLike,
    kind: str,
    reason: str = "",
    message: str = "",
    data: dict[str, Any] | None = None,
    at: datetime | None = None,
) -> JobEvent:
    """Append one event that changes no state to a job's history (never updated or deleted afterwards)."""
    event = job_event(job, kind, reason=reason, message=message, data=data, at=at)
    event.save()
    return event


def job_events_record(events: Iterable[JobEvent]) -> None:
    """Store unsaved events (job_event, transition_event), one statement whatever their number."""
    model_rows_insert(JobEvent, [vars(event) for event in events])


def _event(job: JobLike, kind: str, *, from_state: str = "", to_state: str = "", **rest: Any) -> JobEvent:
    return JobEvent(
        job_id=job.pk,
        kind=kind,
        from_state=from_state,
        to_state=to_state,
        reason=rest["reason"],
        message=rest["message"],
        data=rest["data"] or {},
        at=rest["at"] or timezone.now(),
    )


# ---------------------------------------------------------------------------------------------------
# State changes
# ---------------------------------------------------------------------------------------------------


def job_create(**fields: Any) -> Job:
    """Store a newly submitted job, PENDING (the only way in: NEW -> PENDING); its `submitted` event is
    the caller's (transition_event(job, NEW, PENDING, ...)), so that an array's go in one statement."""
    transition_check(NEW, JobState.PENDING)
    job = Job(state=JobState.PENDING, **fields)
    # Written out, not create(): the ORM's preparing of the row's 30-odd values cost a submission more
    # CPU than the rest of its transaction's statements (bench.submit_cost). No signal listens to Job.
    (job.pk,) = model_rows_insert(Job, [vars(job)])
    _stored(job)
    return job


def job_create_with_event(*, data: dict[str, Any], **fields: Any) -> tuple[Job, JobEvent]:
    """job_create, and the job's `submitted` event (its `data`, at its submission) stored with it in
    one statement: a single job's submission, one round trip to the database where two cost it (and
    the database) a statement each."""
    job = Job(state=JobState.PENDING, **fields)
    event = transition_event(job, NEW, JobState.PENDING, data=data, at=job.submitted_at)
    job.pk, event.pk = model_row_insert_with(Job, vars(job), JobEvent, vars(event), "job_id")
    event.job_id = job.pk
    _stored(job)
    _stored(event)
    return job, event


def _stored(row: Job | JobEvent) -> None:
    """Mark a row inserted by hand as the ORM marks one it saved."""
    row._state.adding, row._state.db = False, connection.alias


def jobs_create_bulk(rows: Sequence[dict[str, Any]]) -> list[Job]:
    """Store many newly submitted jobs (an array's tasks after its first) in one statement, PENDING,
    like job_create; their `submitted` events are the caller's."""
    transition_check(NEW, JobState.PENDING)
    return Job.objects.bulk_create([Job(state=JobState.PENDING, **row) for row in rows], batch_size=1000)


def jobs_history_insert(histories: Sequence[tuple[Job, Sequence[tuple[str, datetime]]]]) -> list[Job]:
    """Store jobs that come with a past (a bench's synthetic cluster): each unsaved job with its way from
    NEW as (state, at) steps, e.g. [(PENDING, submitted), (RUNNING, started), (COMPLETED, finished)].
    Each step must be a transition of the table (JobTransitionError, nothing written, otherwise); a job
    is left in its last step's state, and each step is an event. Two bulk inserts; returns the jobs."""
    for job, steps in histories:
        ways = list(zip([NEW, *(state for state, _ in steps)], (state for state, _ in steps), strict=False))
        if not ways:
            raise JobTransitionError(f"job {job.name}: a history starts with its submission")
        for from_state, to_state in ways:
            transition_check(from_state, to_state)
        job.state = ways[-1][1]
    jobs = Job.objects.bulk_create([job for job, _ in histories], batch_size=1000)
    events = []
    for job, (_, steps) in zip(jobs, histories, strict=True):
        previous = NEW
        for state, at in steps:
            events.append(transition_event(job, previous, state, at=at))
            previous = state
    job_events_record(events)
    return jobs


def job_transition(
    job: Job,
    to_state: str,
    *,
    reason: str = "",
    message: str = "",
    data: dict[str, Any] | None = None,
    at: datetime | None = None,
    fields: Sequence[str] = (),
) -> JobEvent:
    """Move one job (row locked by the caller) to `to_state`, with its event; `fields` are the other
    fields the caller set on `job` and that are saved with it. Refused (JobTransitionError, nothing
    written) when the table has no such change."""
    previous = job.state
    event = transition_event(job, previous, to_state, reason=reason, message=message, data=data, at=at)
    job.state = to_state
    # Hand-built statements, not save(): a job's end in an agent's sync paid 0.7 ms of the web tier's
    # CPU for the ORM's two (bench.sync_cost, 2026-11-29). No signal listens to Job or JobEvent.
    names = ["state", *fields]
    if not update_from_values(Job, [{"pk": job.pk, **{f: getattr(job, f) for f in names}}], names):
        raise DatabaseError("Save with update_fields did not affect any rows.")  # as save() words it
    (event.pk,) = model_rows_insert(JobEvent, [vars(event)])
    logger.info("job %s: %s -> %s %s", job.pk, previous, to_state, reason)
    return event


def jobs_requeue(*, jobs: Sequence[Job], reason: str, now: datetime, via: str | None = None) -> None:
    """The requeue: each job (RUNNING, row locked, its leases ended by the caller) goes back to the queue
    with its progress (pending reason Priority), in one statement, with its events: `requeued` straight
    from RUNNING, or through the passing state `via` (NODE_FAIL: `node_fail`, recording the progress kept,
    then `requeued`). Refused, nothing written, if any job's way is not in the table."""
    events: list[JobEvent] = []
    for job in jobs:
        if via is None:
            events.append(transition_event(job, job.state, JobState.PENDING, reason=reason, at=now))
        else:
            events += job_interruption_events(
                job,
                via=via,
                to_state=JobState.PENDING,
                reason=reason,
                next_reason=PendingReason.PRIORITY,
                at=now,
                data={"done_iters": job.done_iters},
            )
    jobs_transition_bulk(
        {job.pk: (job.state, JobState.PENDING, PendingReason.PRIORITY) for job in jobs}, now=now
    )
    for job in jobs:
        job.state, job.pending_reason = JobState.PENDING, PendingReason.PRIORITY
    job_events_record(events)
    if jobs:
        logger.info("jobs %s: -> PENDING (%s)", [job.pk for job in jobs], reason)


def jobs_transition_bulk(changes: Mapping[int, tuple[str, str, str]], *, now: datetime) -> None:
    """Give each job its new state and pending reason: job id -> (state it is in, new state, new
    reason), the rows locked by the caller. A job set RUNNING keeps its first start (started_at is set
    only if empty). The caller records the events (transition_event).

    Each change is checked against the table (a state that stays may change its reason while live),
    and only a row still in the state given is written: a row found in another raises
    JobTransitionError, which rolls back the caller's transaction. On PostgreSQL one UPDATE ... FROM
    unnest(ids, states, new states, reasons), whatever the number of jobs (a round's bulk form);
    elsewhere one UPDATE per distinct change.
    """
    if not changes:
        return
    for job_id, (from_state, to_state, _) in changes.items():
        if from_state == to_state:
            if from_state not in _REASON_ONLY_STATES:
                raise JobTransitionError(f"job {job_id} is {from_state}: its row is never rewritten")
        else:
            transition_check(from_state, to_state)
    if is_postgresql():
        written = _transition_statement(changes, now=now)
    else:
        groups: dict[tuple[str, str, str], list[int]] = defaultdict(list)
        for job_id, change in changes.items():
            groups[change].append(job_id)
        written = 0
        for (from_state, to_state, reason), ids in groups.items():
            values: dict[str, Any] = {"state": to_state, "pending_reason": reason}
            if to_state == JobState.RUNNING:
                values["started_at"] = Coalesce("started_at", Value(now))
            written += Job.objects.filter(pk__in=ids, state=from_state).update(**values)
    if written != len(changes):
        raise JobTransitionError(
            f"{len(changes) - written} of {len(changes)} jobs were not in the state their change expects"
        )


def _transition_statement(changes: Mapping[int, tuple[str, str, str]], *, now: datetime) -> int:
    ids = list(changes)
    from_states, to_states, reasons = ([changes[i][k] for i in ids] for k in range(3))
    with connection.cursor() as cursor:
        cursor.execute(
            f"UPDATE {Job._meta.db_table} AS j SET state = v.state, pending_reason = v.reason,"
            " started_at = CASE WHEN v.state = %s THEN COALESCE(j.started_at, %s) ELSE j.started_at END"
            " FROM unnest(%s::bigint[], %s::varchar[], %s::varchar[], %s::varchar[])"
            " AS v(id, from_state, state, reason)"
            " WHERE j.id = v.id AND j.state = v.from_state",
            [JobState.RUNNING.value, now, ids, from_states, to_states, reasons],
        )
        return cursor.rowcount
