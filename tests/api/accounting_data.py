"""Accounting test data: jobs and allocations at chosen times, and the report's figures computed from them.

The expected figures are computed here in Python from the very rows the tests create (each
allocation's overlap with the window times its GPUs, cores and GB), never by the code under test.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime, timedelta

import numpy as np

from cluster_app.models import Gpu, Server
from scheduler_app.models import TERMINAL_JOB_STATES, Allocation, AllocationGpu, Job, JobState
from tests.factories import JobFactory

H = timedelta(hours=1)


@dataclass
class Ledger:
    """What the tests created: allocations with their GPU counts, and jobs."""

    allocations: list[tuple[Allocation, int]] = field(default_factory=list)
    jobs: list[Job] = field(default_factory=list)
    _next_gpu: dict[int, int] = field(default_factory=dict)

    def job(
        self, owner, *, team=None, state=JobState.COMPLETED, submitted_at, started_at=None, finished_at=None
    ):
        job = JobFactory(
            owner=owner,
            team=team,
            state=state,
            submitted_at=submitted_at,
            started_at=started_at,
            finished_at=finished_at,
        )
        self.jobs.append(job)
        return job

    def allocation(
        self, job: Job, server: Server, *, gpus: int, cpus: int, mem_gb: float, started_at, ended_at=None
    ) -> Allocation:
        """An allocation holding `gpus` GPUs of `server` (the next ones round-robin; released at its end)."""
        allocation = Allocation.objects.create(
            job=job,
            server=server,
            num_gpus=gpus,
            num_cpus=cpus,
            mem_gb=mem_gb,
            started_at=started_at,
            ended_at=ended_at,
        )
        indices = [(self._next_gpu.get(server.pk, 0) + i) % server.num_gpus for i in range(gpus)]
        self._next_gpu[server.pk] = (indices[-1] + 1) % server.num_gpus
        AllocationGpu.objects.bulk_create(
            AllocationGpu(
                allocation=allocation, gpu=Gpu.objects.get(server=server, index=i), released_at=ended_at
            )
            for i in indices
        )
        self.allocations.append((allocation, gpus))
        return allocation


def _key(job: Job, by: str) -> str:
    if by == "user":
        return job.owner.username
    return job.team.name if job.team_id else "(no team)"


def expected(ledger: Ledger, *, start: datetime, end: datetime, now: datetime, by: str) -> dict[str, dict]:
    """Name -> the report's figures, computed from the ledger's rows."""
    stop = min(end, now)
    usage: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0, 0.0])
    for allocation, gpus in ledger.allocations:
        if not (
            allocation.started_at < stop and (allocation.ended_at is None or allocation.ended_at > start)
        ):
            continue
        until = min(allocation.ended_at or stop, stop)
        hours = (until - max(allocation.started_at, start)).total_seconds() / 3600
        figures = usage[_key(allocation.job, by)]
        figures[0] += hours * gpus
        figures[1] += hours * allocation.num_cpus
        figures[2] += hours * allocation.mem_gb
    ended: dict[str, dict[str, int]] = defaultdict(
        lambda: {s.value: 0 for s in JobState if s in TERMINAL_JOB_STATES}
    )
    waits: dict[str, list[float]] = defaultdict(list)
    for job in ledger.jobs:
        if job.state in TERMINAL_JOB_STATES and job.finished_at and start <= job.finished_at < end:
            ended[_key(job, by)][job.state] += 1
        if job.started_at and start <= job.started_at < end:
            waits[_key(job, by)].append((job.started_at - job.submitted_at).total_seconds())
    out = {}
    for name in set(usage) | set(ended) | set(waits):
        gpu_h, cpu_h, mem_h = usage.get(name, (0.0, 0.0, 0.0))
        jobs = ended[name]
        w = waits.get(name)
        out[name] = {
            "name": name,
            "gpu_hours": gpu_h,
            "cpu_core_hours": cpu_h,
            "mem_gb_hours": mem_h,
            "jobs": dict(jobs),
            "jobs_total": sum(jobs.values()),
            "mean_wait_s": float(np.mean(w)) if w else None,
            # numpy's default percentile interpolates linearly, as percentile_cont does.
            "p95_wait_s": float(np.percentile(w, 95)) if w else None,
        }
    return out
