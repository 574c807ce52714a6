"""Job submission (the jobs and their first events, admission, an early round; the request and its
validation in job_requests.py) and the dependency hold of the rounds."""

from collections import defaultdict
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from django.contrib.auth.models import AbstractBaseUser
from django.db import transaction

from scheduler_app.models import TERMINAL_JOB_STATES, Job, JobState, PendingReason
from scheduler_app.selectors import (
    JobLike,
    dependency_pending_reason,
    dependency_waits,
    job_relation_known,
)
from scheduler_app.services.admission import admission_predict_all
from scheduler_app.services.job_lifecycle import (
    NEW,
    job_create,
    job_create_with_event,
    job_event,
    job_events_record,
    jobs_create_bulk,
    transition_event,
)
from scheduler_app.services.job_requests import (
    JobRequest,
    job_request_validate,
    job_run_as,
    job_work_dir,
)
from scheduler_app.services.pending_reasons import pending_reasons_mark
from scheduler_app.services.round_requests import scheduling_round_request_on_commit


@transaction.atomic
def job_submit(*, owner: AbstractBaseUser, request: JobRequest, admission: bool = True) -> list[Job]:
    """Submit a job, or one job per task of an array (`request.array`), all or nothing: the one way in
    for the API, the web form, the demo, the seeds and the benches. Returns the jobs (one, or every
    task in index order).

    Validated before anything is written; each starts PENDING and its history starts with a
    `submitted` event. The tasks of an array are ordinary jobs that share everything but their index:
    `array_job` is the first task (Slurm's ArrayJobID) and `array_task_id` the index their process
    sees as ATTUNE_ARRAY_TASK_ID. With `admission` (the default) their starts and finishes are
    predicted with one forecast (admission feedback, which may refuse an unattainable QoS target: see
    services/admission.py) and an early round is asked for; without it (a caller filling a queue in
    bulk, which says so) the jobs wait for the next round.
    """
    jobs = _jobs_store(owner=owner, request=request)
    if admission:
        admission_predict_all(jobs=jobs)
        scheduling_round_request_on_commit(trigger="submit")
    return jobs


def _jobs_store(*, owner: AbstractBaseUser, request: JobRequest) -> list[Job]:
    """Validate the request and store its jobs with their `submitted` events and dependencies."""
    array, dependencies = job_request_validate(request, owner)
    depends_on = sorted(dependencies)
    if request.hold:
        reason = PendingReason.HELD_USER
    elif any(state != JobState.COMPLETED for state in dependencies.values()):
        reason = PendingReason.DEPENDENCY
    else:
        reason = PendingReason.PRIORITY
    fields: dict[str, Any] = dict(
        owner=owner,
        team=request.team,
        name=request.name.strip(),
        workload=request.workload,
        command=request.command.strip(),
        # A browser's textarea (and a Windows editor) sends CRLF, on which bash fails (sbatch
        # refuses such scripts): the script is stored with Unix line endings.
        script=request.script.replace("\r\n", "\n"),
        run_as=job_run_as(owner) if request.workload is None else "",
        work_dir=job_work_dir(request),
        output_path=request.output_path,
        error_path=request.error_path,
        num_gpus=request.num_gpus,
        num_nodes=request.num_nodes,
        cpus_per_gpu=request.cpus_per_gpu,
        mem_gb_per_gpu=request.mem_gb_per_gpu,
        total_iters=request.total_iters,
        qos_deadline_at=request.qos_deadline_at,
        qos_max_latency_s=request.qos_max_latency_s,
        qos_min_rate_iters_per_s=request.qos_min_rate_iters_per_s,
        priority=request.priority,
        time_limit_s=request.time_limit_s,
        checkpoint_every_s=request.checkpoint_every_s,
        held=request.hold,
        pending_reason=reason,
    )
    task_ids = array.task_ids
    if not task_ids:
        # A single job and its event in one statement (the common submission: one round trip).
        first, event = job_create_with_event(data=_submitted_data(fields, None, depends_on), **fields)
        jobs, events = [first], [event]
    else:
        # The first task is its array's id: it refers to itself; the others, in one statement (an
        # array has up to 1,000 tasks), refer to it.
        # The limit is on every task (a round reads it from the live ones), set with the index.
        first = job_create(**fields)
        first.array_job, first.array_task_id, first.array_task_limit = first, task_ids[0], array.limit
        first.save(update_fields=["array_job", "array_task_id", "array_task_limit"])
        jobs = [first]
        jobs += jobs_create_bulk(
            [
                dict(fields, array_job=first, array_task_id=t, array_task_limit=array.limit)
                for t in task_ids[1:]
            ]
        )
        # One statement for the events of every task (an array has up to 1,000).
        events = [
            transition_event(
                job, NEW, JobState.PENDING, data=_submitted_data(fields, job, depends_on), at=job.submitted_at
            )
            for job in jobs
        ]
        job_events_record(events)
    if depends_on:  # one statement for every task's
        through = Job.depends_on.through
        through.objects.bulk_create(
            [through(from_job_id=job.pk, to_job_id=dep) for job in jobs for dep in depends_on]
        )
    # The answer's job (the first) keeps its history as stored: no read of it again.
    job_relation_known(first, "events", events[:1])
    return jobs


def _submitted_data(fields: dict[str, Any], task: Job | None, depends_on: list[int]) -> dict[str, Any]:
    """A `submitted` event's data: its array and task (`task`, an array's), dependencies, hold."""
    data: dict[str, Any] = {}
    if task is not None:
        data.update(array_job=task.array_job_id, array_task_id=task.array_task_id)
    if depends_on:
        data["depends_on"] = depends_on
    if fields["held"]:
        data["held"] = True
    return data


def job_dependencies_hold(*, jobs: Sequence[JobLike], now: datetime) -> set[int]:
    """Round hook: the ids of PENDING jobs that wait for a dependency to complete (leave them out).

    Each gets the pending reason Dependency, or DependencyNeverSatisfied once a dependency has ended
    without completing (it then stays in the queue, as with Slurm, until its owner cancels it); the
    change to the latter is recorded as an event naming the dependency.
    """
    pending = {job.pk: job for job in jobs if job.state == JobState.PENDING}
    waits = dependency_waits(job_ids=pending)
    by_reason: dict[str, list[JobLike]] = defaultdict(list)
    for job_id, dependencies in waits.items():
        by_reason[dependency_pending_reason(dependencies.values())].append(pending[job_id])
    events = []
    for reason, held in by_reason.items():
        for job in pending_reasons_mark(held, reason):
            if reason != PendingReason.DEPENDENCY_NEVER_SATISFIED:
                continue
            message = ", ".join(
                f"job {dep} ended {state}"
                for dep, state in sorted(waits[job.pk].items())
                if state in TERMINAL_JOB_STATES
            )
            events.append(
                job_event(job, "dependency_never_satisfied", reason=reason, message=message, at=now)
            )
    job_events_record(events)
    return set(waits)
