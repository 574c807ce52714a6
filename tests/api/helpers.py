"""Helpers for service and API tests of the live driver: servers with tokens, jobs, rounds, leases."""

from __future__ import annotations

from rest_framework.test import APIClient

from cluster_app.models import NodeState, Server
from cluster_app.services import agent_credential_issue
from profiles_app.models import Workload
from scheduler_app.models import Allocation, Job
from scheduler_app.services.jobs import JobRequest, job_submit
from tests.factories import ServerFactory, WorkloadFactory


def make_server(
    name: str, *, gpus: int = 8, cpus: int = 24, mem_gb: float = 500.0, state: str = NodeState.IDLE
) -> Server:
    return ServerFactory(name=name, num_gpus=gpus, num_cpus=cpus, mem_gb=mem_gb, state=state)


def agent_client(server: Server) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {agent_credential_issue(server=server)}")
    return client


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
    wl = None if command else kwargs.pop("workload", None) or workload()
    return job_submit(
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
    )


def active(job: Job) -> list[Allocation]:
    return list(job.allocations.filter(ended_at__isnull=True).order_by("server__name"))


def lease_of(job: Job) -> Allocation:
    (allocation,) = active(job)
    return allocation
