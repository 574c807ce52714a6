"""Fixtures of the user-page tests: no real rounds, a small cluster, logged-in clients, jobs in states."""

from __future__ import annotations

import pytest
from django.test import Client

from scheduler_app.models import Allocation, AllocationGpu, Job, JobState, PendingReason
from tests.api.helpers import make_server, workload
from tests.factories import AllocationFactory, JobFactory, hold_gpus


@pytest.fixture(autouse=True)
def no_rounds(settings, monkeypatch) -> list[str]:
    """Submissions and cancels ask for an early round: record the ask instead of touching Redis."""
    settings.ATTUNE_SCHEDULER = {**settings.ATTUNE_SCHEDULER, "policy": "fifo", "inline_rounds": False}
    asked: list[str] = []
    monkeypatch.setattr(
        "scheduler_app.services.round_requests.scheduling_round_request",
        lambda *, trigger: asked.append(trigger),
    )
    return asked


@pytest.fixture
def cluster(db):
    """One 4-GPU server and the res18 catalog workload."""
    workload("res18")
    return make_server("gpu01", gpus=4, cpus=12, mem_gb=250)


@pytest.fixture
def client_of():
    def login(user) -> Client:
        client = Client()
        client.force_login(user)
        return client

    return login


def running_job(owner, server, *, gpus: int = 1, **kwargs) -> tuple[Job, Allocation]:
    """A RUNNING job holding `gpus` free GPUs of `server` through one active allocation."""
    job = JobFactory(owner=owner, num_gpus=gpus, state=JobState.RUNNING, **kwargs)
    allocation = AllocationFactory(job=job, server=server, num_cpus=3 * gpus, mem_gb=62.5 * gpus)
    busy = set(
        AllocationGpu.objects.filter(gpu__server=server, released_at__isnull=True).values_list(
            "gpu_id", flat=True
        )
    )
    free = [g for g in server.gpus.order_by("index") if g.pk not in busy][:gpus]
    hold_gpus(allocation, *free)
    return job, allocation


def pending_job(owner, **kwargs) -> Job:
    """A PENDING job (Priority) unless `state` says otherwise."""
    kwargs.setdefault("state", JobState.PENDING)
    kwargs.setdefault(
        "pending_reason",
        PendingReason.PRIORITY if kwargs["state"] == JobState.PENDING else PendingReason.NONE,
    )
    return JobFactory(owner=owner, **kwargs)


def pending_array(owner, indices, limit=None) -> list[Job]:
    """An array's PENDING tasks (its id: the first task's), as job_submit makes them."""
    first, *rest = indices
    head = pending_job(owner)
    Job.objects.filter(pk=head.pk).update(array_job_id=head.pk, array_task_id=first, array_task_limit=limit)
    for i in rest:
        pending_job(owner, array_job_id=head.pk, array_task_id=i, array_task_limit=limit)
    return list(Job.objects.filter(array_job_id=head.pk).order_by("array_task_id"))
