"""Helpers for service and API tests of the live driver: servers with tokens, jobs, rounds, leases, and
the agent's one call (a sync)."""

from __future__ import annotations

import json
from collections.abc import Iterable
from datetime import datetime
from typing import Any

from django.utils import timezone
from rest_framework.response import Response
from rest_framework.test import APIClient

from cluster_app.models import NodeState, Server
from cluster_app.services import agent_credential_issue
from profiles_app.models import SpeedObservation, Workload
from profiles_app.services.speeds import SPEED_MIN_REPORTS
from scheduler_app.models import Allocation, Job, JobState
from scheduler_app.services.jobs import JobRequest, job_submit
from tests.factories import ServerFactory, WorkloadFactory


def make_server(
    name: str, *, gpus: int = 8, cpus: int = 24, mem_gb: float = 500.0, state: str = NodeState.IDLE
) -> Server:
    return ServerFactory(name=name, num_gpus=gpus, num_cpus=cpus, mem_gb=mem_gb, state=state)


SYNC = "/api/v1/agent/sync"


def agent_client(server: Server) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {agent_credential_issue(server=server)}")
    return client


def usage_sample(**fields: Any) -> dict[str, Any]:
    """A sync's `sample`: an almost idle node sampled now, without GPU figures, unless `fields` say."""
    return {
        "sampled_at": timezone.now().isoformat(),
        "cpu_util_pct": 1.0,
        "mem_used_gb": 1.0,
        "gpus": [],
        **fields,
    }


def sync(
    client: APIClient,
    *,
    running: Iterable[Any] = (),
    reports: Iterable[dict[str, Any]] = (),
    sample: dict[str, Any] | None = None,
) -> Response:
    """POST one sync (docs/agent-protocol.md): `sample` (default: usage_sample()), the leases the agent
    runs and its reports. Sent as JSON text, so that NUL and lone surrogates travel as JSON escapes."""
    body = {
        "sample": sample if sample is not None else usage_sample(),
        "running": [str(lease) for lease in running],
        "reports": list(reports),
    }
    return client.post(SYNC, data=json.dumps(body), content_type="application/json")


def synced(client: APIClient, **kwargs: Any) -> dict[str, Any]:
    """sync(), asserting a 200; its answer (state, commands, acked, rejected, sync_interval_s, wait)."""
    response = sync(client, **kwargs)
    assert response.status_code == 200, response.content[:2000]
    return response.json()


def workload(name: str = "res18") -> Workload:
    return WorkloadFactory(name=name)


def submit(
    owner,
    *,
    gpus: int = 1,
    iters: int = 1000,
    name: str = "job",
    command: str = "",
    priority: int = 0,
    **kwargs,
) -> Job:
    """A job (an array's first task) in the queue, admission off: a test runs the rounds it needs."""
    wl = None if command else kwargs.pop("workload", None) or workload()
    return job_submit(
        admission=False,
        owner=owner,
        request=JobRequest(
            name=name,
            num_gpus=gpus,
            total_iters=iters,
            workload=wl,
            command=command,
            priority=priority,
            **kwargs,
        ),
    )[0]


def started(job: Job) -> Job:
    """The job RUNNING, as a round would leave it but without a lease: the shortcut of tests that end a
    job as a running one (the lifecycle ends a job FAILED, TIMEOUT or OUT_OF_MEMORY only from RUNNING)."""
    Job.objects.filter(pk=job.pk).update(
        state=JobState.RUNNING, pending_reason="None", started_at=timezone.now()
    )
    job.refresh_from_db()
    return job


def active(job: Job) -> list[Allocation]:
    return list(job.allocations.filter(ended_at__isnull=True).order_by("server__name"))


def lease_of(job: Job) -> Allocation:
    (allocation,) = active(job)
    return allocation


def earlier_lease(job: Job, *, started_at: datetime, ended_at: datetime) -> Allocation:
    """An ended lease of `job` before its current one (same server and shares), preempted: the run
    time its time limit was already charged."""
    current = lease_of(job)
    return Allocation.objects.create(
        job=job,
        server=current.server,
        round=current.round,
        num_gpus=current.num_gpus,
        num_cpus=current.num_cpus,
        mem_gb=current.mem_gb,
        speedup=1.0,
        started_at=started_at,
        ended_at=ended_at,
        end_reason="preempted",
    )


def observe(job: Job, *, predicted: float, measured: float, samples: int = SPEED_MIN_REPORTS) -> None:
    """What the agent path (services/agents.py _observe_speed) stores for the job's lease."""
    now = timezone.now()
    SpeedObservation.objects.create(
        workload=job.workload,
        job=job,
        allocation=lease_of(job),
        cpus_per_gpu=3,
        mem_gb_per_gpu=62.5,
        predicted_iters_per_s=predicted,
        measured_iters_per_s=measured,
        samples=samples,
        first_at=now,
        at=now,
    )
