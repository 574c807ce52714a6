"""Job services: submission and the append-only event history."""

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.contrib.auth.models import AbstractBaseUser
from django.core.exceptions import ValidationError
from django.db import transaction
from django.utils import timezone

from cluster_app.selectors import cluster_capacity
from profiles_app.models import Workload
from scheduler_app.models import Job, JobEvent, JobState, PendingReason, Team


@dataclass(frozen=True)
class JobRequest:
    """What a user asks for; validated by job_submit before anything is written."""

    name: str
    num_gpus: int
    total_iters: int
    workload: Workload | None = None
    command: str = ""
    team: Team | None = None
    cpus_per_gpu: float | None = None
    mem_gb_per_gpu: float | None = None
    qos_deadline_at: datetime | None = None
    qos_max_latency_s: float | None = None
    priority: int = 0
    time_limit_s: int | None = None


def _validate(request: JobRequest, owner: AbstractBaseUser) -> None:
    """Raise ValidationError with per-field messages; nothing is written on bad input."""
    errors: dict[str, list[str]] = {}

    def add(field: str, message: str) -> None:
        errors.setdefault(field, []).append(message)

    if not request.name.strip():
        add("name", "Give the job a name.")
    if request.workload is None and not request.command.strip():
        add("workload", "Choose a catalog workload or give a command to run.")
    if request.num_gpus < 1:
        add("num_gpus", "A job needs at least one GPU.")
    else:
        total_gpus = cluster_capacity()["gpus"]
        if total_gpus and request.num_gpus > total_gpus:
            add("num_gpus", f"The cluster has only {total_gpus} GPUs.")
    if request.total_iters < 1:
        add("total_iters", "The work must be at least one iteration.")
    if request.cpus_per_gpu is not None and request.cpus_per_gpu <= 0:
        add("cpus_per_gpu", "CPU cores per GPU must be positive.")
    if request.mem_gb_per_gpu is not None and request.mem_gb_per_gpu <= 0:
        add("mem_gb_per_gpu", "Memory per GPU must be positive.")
    if request.qos_deadline_at is not None and request.qos_max_latency_s is not None:
        add("qos_max_latency_s", "Give either a deadline or a maximum latency, not both.")
    if request.qos_max_latency_s is not None and request.qos_max_latency_s <= 0:
        add("qos_max_latency_s", "The maximum latency must be positive.")
    if request.team is not None and not request.team.members.filter(pk=owner.pk).exists():
        add("team", f"You are not a member of team {request.team.name}.")
    if errors:
        raise ValidationError(errors)


def job_event(
    job: Job,
    kind: str,
    *,
    from_state: str = "",
    to_state: str = "",
    reason: str = "",
    message: str = "",
    data: dict[str, Any] | None = None,
    at: datetime | None = None,
) -> JobEvent:
    """An unsaved JobEvent, for bulk_create by services that record many at once."""
    return JobEvent(
        job_id=job.pk,
        kind=kind,
        from_state=from_state,
        to_state=to_state,
        reason=reason,
        message=message,
        data=data or {},
        at=at or timezone.now(),
    )


def job_event_append(
    *,
    job: Job,
    kind: str,
    from_state: str = "",
    to_state: str = "",
    reason: str = "",
    message: str = "",
    data: dict[str, Any] | None = None,
    at: datetime | None = None,
) -> JobEvent:
    """Append one event to a job's history (never updated or deleted afterwards)."""
    event = job_event(
        job, kind, from_state=from_state, to_state=to_state, reason=reason, message=message, data=data, at=at
    )
    event.save()
    return event


@transaction.atomic
def job_submit(*, owner: AbstractBaseUser, request: JobRequest) -> Job:
    """Validate and queue a job; it starts PENDING and its history starts with a `submitted` event."""
    _validate(request, owner)
    job = Job.objects.create(
        owner=owner,
        team=request.team,
        name=request.name.strip(),
        workload=request.workload,
        command=request.command.strip(),
        num_gpus=request.num_gpus,
        cpus_per_gpu=request.cpus_per_gpu,
        mem_gb_per_gpu=request.mem_gb_per_gpu,
        total_iters=request.total_iters,
        qos_deadline_at=request.qos_deadline_at,
        qos_max_latency_s=request.qos_max_latency_s,
        priority=request.priority,
        time_limit_s=request.time_limit_s,
        state=JobState.PENDING,
        pending_reason=PendingReason.PRIORITY,
    )
    job_event_append(job=job, kind="submitted", to_state=JobState.PENDING, at=job.submitted_at)
    return job
