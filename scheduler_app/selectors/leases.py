"""Active leases: what each running job holds, and how many GPUs each server has busy."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from datetime import datetime

from django.db.models import Count

from scheduler_app.core.types import (
    ServerShare,
)
from scheduler_app.models import (
    Allocation,
    AllocationGpu,
)
from scheduler_app.selectors.restart_facts import lease_run_started_at


@dataclass(frozen=True)
class ActiveLease:
    """An allocation that has not ended, with the GPUs it holds (ids and indices on its server)."""

    allocation_id: int
    job_id: int
    server_id: int
    num_cpus: int
    mem_gb: float
    speedup: float
    gpu_ids: tuple[int, ...]
    gpu_indices: tuple[int, ...]
    iters_per_s: float | None = None  # the agent's last measure of the job's speed on this lease
    run_started_at: datetime | None = None  # when its run began (restart_facts.lease_run_started_at)

    def share(self) -> ServerShare:
        return ServerShare(self.server_id, self.gpu_indices, self.num_cpus, self.mem_gb)


def active_leases() -> list[ActiveLease]:
    """Every active allocation with its held GPUs: two queries, whatever the cluster size."""
    gpus: dict[int, list[tuple[int, int]]] = defaultdict(list)
    for allocation_id, gpu_id, index in AllocationGpu.objects.filter(released_at__isnull=True).values_list(
        "allocation_id", "gpu_id", "gpu__index"
    ):
        gpus[allocation_id].append((index, gpu_id))
    leases = []
    rows = Allocation.objects.filter(ended_at__isnull=True).values_list(
        "id",
        "job_id",
        "server_id",
        "num_cpus",
        "mem_gb",
        "speedup",
        "iters_per_s",
        "started_at",
        "agent_started_at",
    )
    for alloc_id, job_id, server_id, cpus, mem_gb, speedup, ips, started_at, agent_started_at in rows:
        held = sorted(gpus.get(alloc_id, ()))
        leases.append(
            ActiveLease(
                allocation_id=alloc_id,
                job_id=job_id,
                server_id=server_id,
                num_cpus=cpus,
                mem_gb=mem_gb,
                speedup=speedup,
                gpu_ids=tuple(g for _, g in held),
                gpu_indices=tuple(i for i, _ in held),
                iters_per_s=ips,
                run_started_at=lease_run_started_at(started_at=started_at, agent_started_at=agent_started_at),
            )
        )
    return leases


def server_busy_gpu_count(*, server_id: int) -> int:
    """GPUs of one server held by active leases: what one agent's register or return needs, where the
    whole cluster's count (`server_busy_gpus`) cost 20 ms at 1,000 servers, for each of them after a
    restart of the control plane."""
    return AllocationGpu.objects.filter(released_at__isnull=True, allocation__server_id=server_id).count()


def server_busy_gpus() -> dict[int, int]:
    """Server id -> GPUs held by active leases."""
    return dict(
        AllocationGpu.objects.filter(released_at__isnull=True)
        .values_list("allocation__server_id")
        .annotate(n=Count("id"))
        .values_list("allocation__server_id", "n")
    )
