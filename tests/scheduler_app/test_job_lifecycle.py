"""A job's lifecycle: every transition of the table taken on a job row, every other one refused, and no
code but services/job_lifecycle.py writing a job's state or its events."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
from django.db import connection, transaction
from django.utils import timezone

from scheduler_app.models import Job, JobEvent, JobState, PendingReason
from scheduler_app.services.job_lifecycle import (
    NEW,
    TRANSITIONS,
    JobTransitionError,
    job_create,
    job_create_with_event,
    job_interruption_events,
    job_transition,
    jobs_history_insert,
    jobs_requeue,
    jobs_transition_bulk,
    transition_check,
)
from tests.factories import JobFactory, WorkloadFactory

pytestmark = pytest.mark.django_db

STATES = [s.value for s in JobState]
REFUSED = [(a, b) for a in [NEW, *STATES] for b in STATES if (a, b) not in TRANSITIONS]


def job_in(state: str) -> Job:
    return JobFactory(state=state, pending_reason=PendingReason.NONE)


def row(job: Job) -> tuple[str, str]:
    return Job.objects.filter(pk=job.pk).values_list("state", "pending_reason").get()


def test_the_table_names_real_states_and_leaves_no_way_out_of_an_end():
    assert REFUSED  # the table does not allow everything
    terminal = {
        JobState.COMPLETED,
        JobState.FAILED,
        JobState.CANCELLED,
        JobState.TIMEOUT,
        JobState.OUT_OF_MEMORY,
    }
    for (from_state, to_state), transition in TRANSITIONS.items():
        assert from_state in [NEW, *STATES] and to_state in STATES
        assert from_state not in terminal, (from_state, to_state)
        assert transition.kind and transition.why
    # Every state can be reached from a submission.
    reached, frontier = {NEW}, [NEW]
    while frontier:
        here = frontier.pop()
        for a, b in TRANSITIONS:
            if a == here and b not in reached:
                reached.add(b)
                frontier.append(b)
    assert reached == {NEW, *STATES}


@pytest.mark.parametrize(("from_state", "to_state"), list(TRANSITIONS), ids="->".join)
def test_each_transition_of_the_table_is_taken_on_a_job_row(user, from_state, to_state):
    at = timezone.now()
    if from_state == NEW:
        job = job_create(owner=user, name="new", workload=WorkloadFactory(), num_gpus=1, total_iters=10)
        assert row(job)[0] == JobState.PENDING
        return
    job = job_in(from_state)
    event = job_transition(job, to_state, reason="test", at=at)
    assert row(job)[0] == to_state == job.state
    stored = JobEvent.objects.get(job=job)
    assert stored.pk == event.pk
    assert (stored.kind, stored.from_state, stored.to_state, stored.reason) == (
        TRANSITIONS[from_state, to_state].kind,
        from_state,
        to_state,
        "test",
    )


def test_a_job_created_with_its_event_is_stored_as_the_orm_would_store_it(user, django_assert_num_queries):
    workload = WorkloadFactory()
    fields = dict(owner=user, name="new", workload=workload, num_gpus=2, total_iters=10, held=True)
    with django_assert_num_queries(1 if connection.vendor == "postgresql" else 2):
        job, event = job_create_with_event(data={"held": True}, **fields)
    created = job_create(**fields)
    assert not job._state.adding and job.owner is user and job.workload is workload
    columns = [f.attname for f in Job._meta.concrete_fields if f.attname not in ("id", "submitted_at")]
    stored, orm = (Job.objects.filter(pk=pk).values(*columns).get() for pk in (job.pk, created.pk))
    assert stored == orm and stored["state"] == JobState.PENDING
    assert Job.objects.get(pk=job.pk).submitted_at == job.submitted_at
    assert (event.pk, event.job_id) == (JobEvent.objects.get(job=job).pk, job.pk)
    assert JobEvent.objects.filter(pk=event.pk).values(
        "kind", "from_state", "to_state", "at", "data"
    ).get() == {
        "kind": "submitted",
        "from_state": NEW,
        "to_state": JobState.PENDING,
        "at": job.submitted_at,
        "data": {"held": True},
    }


@pytest.mark.parametrize(("from_state", "to_state"), [t for t in TRANSITIONS if t[0] != NEW], ids="->".join)
def test_each_transition_of_the_table_is_taken_in_bulk(user, from_state, to_state):
    job = job_in(from_state)
    jobs_transition_bulk({job.pk: (from_state, to_state, PendingReason.RESOURCES)}, now=timezone.now())
    assert row(job) == (to_state, PendingReason.RESOURCES)


@pytest.mark.parametrize("from_state", [NEW, *STATES])
def test_every_change_not_in_the_table_is_refused(user, from_state):
    refused = [b for a, b in REFUSED if a == from_state]
    assert refused
    for to_state in refused:
        with pytest.raises(JobTransitionError):
            transition_check(from_state, to_state)
    if from_state == NEW:
        return  # no row: a job comes into being only through job_create (NEW -> PENDING)
    job = job_in(from_state)
    for to_state in refused:
        with pytest.raises(JobTransitionError, match=f"from {from_state} to {to_state}"):
            job_transition(job, to_state, reason="test")
        assert job.state == from_state
        if from_state != to_state:
            # The bulk form too (a state that stays may only change its reason, and only while live).
            with pytest.raises(JobTransitionError), transaction.atomic():
                jobs_transition_bulk({job.pk: (from_state, to_state, PendingReason.NONE)}, now=timezone.now())
    assert row(job)[0] == from_state
    assert not JobEvent.objects.filter(job=job).exists()


def test_the_bulk_form_changes_a_live_jobs_reason_alone_but_never_rewrites_an_ended_one(user):
    pending, done = job_in(JobState.PENDING), job_in(JobState.COMPLETED)
    jobs_transition_bulk(
        {pending.pk: (JobState.PENDING, JobState.PENDING, PendingReason.QUOTA)}, now=timezone.now()
    )
    assert row(pending) == (JobState.PENDING, PendingReason.QUOTA)
    with pytest.raises(JobTransitionError, match="never rewritten"):
        jobs_transition_bulk({done.pk: (JobState.COMPLETED, JobState.COMPLETED, "")}, now=timezone.now())


def test_the_bulk_form_refuses_a_row_not_in_the_state_its_change_expects(user):
    started, moved = job_in(JobState.PENDING), job_in(JobState.RUNNING)  # `moved` is not PENDING
    changes = {
        started.pk: (JobState.PENDING, JobState.RUNNING, PendingReason.NONE),
        moved.pk: (JobState.PENDING, JobState.RUNNING, PendingReason.NONE),
    }
    with pytest.raises(JobTransitionError, match="1 of 2 jobs"), transaction.atomic():
        jobs_transition_bulk(changes, now=timezone.now())
    assert row(started)[0] == JobState.PENDING  # the caller's transaction rolled back


def test_the_requeue_goes_through_a_passing_state_with_its_events(user):
    running, other = job_in(JobState.RUNNING), job_in(JobState.RUNNING)
    running.done_iters = 40
    now = timezone.now()
    jobs_requeue(jobs=[running, other], reason="node_down", now=now, via=JobState.NODE_FAIL)
    assert row(running) == row(other) == (JobState.PENDING, PendingReason.PRIORITY)
    events = list(
        JobEvent.objects.filter(job=running).values_list("kind", "from_state", "to_state", "reason")
    )
    assert events == [
        ("node_fail", JobState.RUNNING, JobState.NODE_FAIL, "node_down"),
        ("requeued", JobState.NODE_FAIL, JobState.PENDING, PendingReason.PRIORITY),
    ]
    assert JobEvent.objects.get(job=running, kind="node_fail").data == {"done_iters": 40}


def test_the_requeue_refuses_a_job_that_is_not_running(user):
    ended = job_in(JobState.COMPLETED)
    with pytest.raises(JobTransitionError):
        jobs_requeue(jobs=[ended], reason="agent_shutdown", now=timezone.now())
    assert row(ended)[0] == JobState.COMPLETED and not JobEvent.objects.filter(job=ended).exists()


def test_an_interruption_that_is_no_way_of_the_table_is_refused(user):
    pending = job_in(JobState.PENDING)
    with pytest.raises(JobTransitionError):  # PENDING -> PREEMPTED is not a transition
        job_interruption_events(
            pending,
            via=JobState.PREEMPTED,
            to_state=JobState.PENDING,
            reason="x",
            next_reason="y",
            at=timezone.now(),
        )


def test_a_history_is_stored_only_if_each_step_is_a_transition(user):
    workload, at = WorkloadFactory(), timezone.now()

    def new(name: str) -> Job:
        return Job(owner=user, name=name, workload=workload, num_gpus=1, total_iters=10)

    steps = [(JobState.PENDING, at), (JobState.RUNNING, at), (JobState.COMPLETED, at)]
    (done,) = jobs_history_insert([(new("done"), steps)])
    assert row(done)[0] == JobState.COMPLETED
    assert list(JobEvent.objects.filter(job=done).order_by("id").values_list("kind", flat=True)) == [
        "submitted",
        "scheduled",
        "completed",
    ]
    with pytest.raises(JobTransitionError, match="from PENDING to FAILED"):
        jobs_history_insert(
            [(new("ok"), steps[:2]), (new("bad"), [(JobState.PENDING, at), (JobState.FAILED, at)])]
        )
    assert not Job.objects.filter(name__in=["ok", "bad"]).exists()


# ---------------------------------------------------------------------------------------------------
# The rule stays true: no other module writes a job's state or its events
# ---------------------------------------------------------------------------------------------------

ROOT = Path(__file__).resolve().parents[2]
OWNER = Path("scheduler_app/services/job_lifecycle.py")
SKIP_PARTS = {"tests", "migrations", ".venv", "node_modules", "__pycache__"}
# SQL that sets a job's state (any table's `SET state =`; servers' and notifications' are written by
# the ORM, so the pattern stays simple).
SQL_SET_STATE = re.compile(r"\bSET\s+state\s*=|,\s*state\s*=\s*v\.", re.IGNORECASE)
WRITE_CALLS = {"create", "update", "bulk_create", "bulk_update", "update_or_create", "get_or_create"}


def _is_job_target(expr: ast.expr) -> bool:
    """A job or the Job model: a name or receiver whose last part says job (not a server, a run...)."""
    text = ast.unparse(expr)
    return bool(re.search(r"(^|\.|_)jobs?(\[.*\])?$|^Job(\.|$)", text, re.IGNORECASE))


def state_writes(source: str, filename: str = "<source>") -> list[str]:
    """Where `source` writes a job's state or a JobEvent: `job.state = ...`, `Job(state=...)`,
    `Job.objects...update(state=...)` (and create, bulk_create, bulk_update with "state"),
    `job.save(update_fields=[..."state"...])`, `JobEvent(...)`, `JobEvent.objects...` writes,
    `event.save()` of a JobEvent built here, and SQL that sets `state`."""
    found: list[str] = []
    tree = ast.parse(source, filename)
    for node in ast.walk(tree):
        where = f"{filename}:{getattr(node, 'lineno', 0)}"
        if isinstance(node, ast.Assign | ast.AugAssign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                for part in ast.walk(target):
                    if (
                        isinstance(part, ast.Attribute)
                        and part.attr == "state"
                        and _is_job_target(part.value)
                    ):
                        found.append(f"{where}: {ast.unparse(target)} assigned")
        elif isinstance(node, ast.Call):
            func = node.func
            name = (
                func.id
                if isinstance(func, ast.Name)
                else func.attr
                if isinstance(func, ast.Attribute)
                else ""
            )
            receiver = func.value if isinstance(func, ast.Attribute) else None
            keywords = {k.arg for k in node.keywords}
            strings = {
                c.value for c in ast.walk(node) if isinstance(c, ast.Constant) and isinstance(c.value, str)
            }
            if name == "JobEvent" or (
                name in WRITE_CALLS and receiver is not None and ast.unparse(receiver).startswith("JobEvent.")
            ):
                found.append(f"{where}: a JobEvent written")
            elif name == "Job" and "state" in keywords:
                found.append(f"{where}: Job(state=...)")
            elif name in WRITE_CALLS and receiver is not None and ast.unparse(receiver).startswith("Job."):
                if "state" in keywords or (name == "bulk_update" and "state" in strings):
                    found.append(f"{where}: Job.objects...{name}(state)")
            elif name == "save" and receiver is not None and _is_job_target(receiver) and "state" in strings:
                found.append(f"{where}: {ast.unparse(receiver)}.save(update_fields=[state])")
        elif (
            isinstance(node, ast.Constant)
            and isinstance(node.value, str)
            and SQL_SET_STATE.search(node.value)
        ):
            found.append(f"{where}: SQL sets state")
    return found


def project_files() -> list[Path]:
    return [
        path
        for path in ROOT.rglob("*.py")
        if not SKIP_PARTS & set(path.relative_to(ROOT).parts) and path.relative_to(ROOT) != OWNER
    ]


@pytest.mark.parametrize(
    "snippet",
    [
        "job.state = JobState.RUNNING",
        "self.job.state, job.pending_reason = 'PENDING', 'None'",
        "Job.objects.filter(pk=1).update(state='PENDING')",
        "Job.objects.create(owner=u, state='PENDING')",
        "Job(owner=u, state='RUNNING')",
        "Job.objects.bulk_update(jobs, ['state'])",
        "job.save(update_fields=['state', 'finished_at'])",
        "JobEvent.objects.bulk_create(events)",
        "JobEvent(job=job, kind='x')",
        "cursor.execute('UPDATE scheduler_app_job SET state = %s')",
        "cursor.execute(f'UPDATE {t} AS j SET pending_reason = v.reason, state = v.state')",
    ],
)
def test_the_scan_finds_each_kind_of_write(snippet):
    assert state_writes(snippet), snippet


@pytest.mark.parametrize(
    "snippet",
    [
        "server.state = NodeState.DOWN",
        "self.state = RoundState(snapshot, jobs)",
        "Server.objects.filter(pk=1).update(state='DOWN')",
        "Job.objects.filter(state='PENDING').update(pending_reason='Quota')",
        "job.save(update_fields=['held', 'pending_reason'])",
    ],
)
def test_the_scan_leaves_other_writes_alone(snippet):
    assert not state_writes(snippet), snippet


def test_no_module_but_the_lifecycle_writes_a_jobs_state_or_its_events():
    assert (ROOT / OWNER).exists()
    assert state_writes((ROOT / OWNER).read_text(), str(OWNER))  # the scan sees the owner's own writes
    found = [
        w for path in project_files() for w in state_writes(path.read_text(), str(path.relative_to(ROOT)))
    ]
    assert not found, "job state or events written outside services/job_lifecycle.py:\n" + "\n".join(found)
