"""Tiny local policies, allocators and profiles so that simulator tests do not depend on the real ones."""

from __future__ import annotations

from collections.abc import Sequence

from scheduler_app.core import reasons
from scheduler_app.core.allocators import Allocator
from scheduler_app.core.policies import Policy
from scheduler_app.core.types import (
    ClusterSnapshot,
    Decision,
    JobView,
    Outcome,
    Placement,
    RoundPlan,
    SensitivityProfile,
    ServerShare,
)

CPU_GRID = (1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 9.0, 12.0, 24.0)
MEM_GRID = (20.83, 62.5, 125.0, 187.5, 250.0)


def toy_profile(name: str = "toy", *, iter_time_s: float = 1.0, speedup: float = 1.0) -> SensitivityProfile:
    """A flat profile: `iter_time_s` per iteration at the proportional point (1 s: iterations = seconds)."""
    return SensitivityProfile(
        name=name,
        workload_class="image",
        cpu_per_gpu_grid=CPU_GRID,
        mem_gb_per_gpu_grid=MEM_GRID,
        tput=tuple(tuple(1.0 for _ in MEM_GRID) for _ in CPU_GRID),
        best_cpus_per_gpu=3.0,
        best_mem_gb_per_gpu=62.5,
        speedup=speedup,
        iter_time_s=iter_time_s,
    )


class FifoPolicy(Policy):
    """Arrival order, ties by job id."""

    name = "test-fifo"

    def order(self, jobs: Sequence[JobView], snapshot: ClusterSnapshot, now_s: float) -> list[JobView]:
        return sorted(jobs, key=lambda j: (j.arrival_s, j.job_id))


class LeastServicePolicy(Policy):
    """Least attained GPU-seconds first (LAS), ties by arrival then id."""

    name = "test-las"

    def order(self, jobs: Sequence[JobView], snapshot: ClusterSnapshot, now_s: float) -> list[JobView]:
        return sorted(jobs, key=lambda j: (j.attained_service_gpu_s, j.arrival_s, j.job_id))


class StickyProportionalAllocator(Allocator):
    """GPU-proportional shares, first fit over servers; a job keeps last round's GPUs when they are free.

    Single-server placements only (enough for these tests). `speedup` is what every placement gets.
    """

    name = "test-proportional"

    def __init__(self, speedup: float = 1.0) -> None:
        self.speedup = speedup

    def allocate(self, ordered_jobs: Sequence[JobView], snapshot: ClusterSnapshot) -> RoundPlan:
        free = {s.server_id: set(s.free_gpus) for s in snapshot.servers}
        servers = {s.server_id: s for s in snapshot.servers}
        max_gpus = max(s.num_gpus for s in snapshot.servers)
        decisions: dict[int, Decision] = {}
        admitted: list[JobView] = []
        remaining = sum(len(g) for g in free.values())
        for job in ordered_jobs:
            if job.num_gpus > max_gpus:
                decisions[job.job_id] = Decision(job.job_id, Outcome.INFEASIBLE, reasons.EXCEEDS_CLUSTER_GPUS)
            elif job.num_gpus <= remaining:
                admitted.append(job)
                remaining -= job.num_gpus
            else:
                decisions[job.job_id] = Decision(job.job_id, Outcome.PENDING, reasons.INSUFFICIENT_GPUS)
        # Sticky pass first, so that a later job cannot take an earlier-running job's GPUs.
        chosen: dict[int, tuple[int, tuple[int, ...]]] = {}
        for job in admitted:
            cur = job.current
            if cur is not None and len(cur.shares) == 1:
                share = cur.shares[0]
                if set(share.gpu_indices) <= free[share.server_id]:
                    free[share.server_id] -= set(share.gpu_indices)
                    chosen[job.job_id] = (share.server_id, share.gpu_indices)
        for job in admitted:
            if job.job_id in chosen:
                continue
            for server_id in sorted(free):
                if len(free[server_id]) >= job.num_gpus:
                    gpus = tuple(sorted(free[server_id])[: job.num_gpus])
                    free[server_id] -= set(gpus)
                    chosen[job.job_id] = (server_id, gpus)
                    break
            else:
                decisions[job.job_id] = Decision(job.job_id, Outcome.PENDING, reasons.FRAGMENTED)
        for job_id, (server_id, gpus) in chosen.items():
            server = servers[server_id]
            share = ServerShare(
                server_id=server_id,
                gpu_indices=gpus,
                num_cpus=int(server.cpus_per_gpu * len(gpus)),
                mem_gb=server.mem_gb_per_gpu * len(gpus),
            )
            placement = Placement(job_id=job_id, shares=(share,), speedup=self.speedup)
            decisions[job_id] = Decision(job_id, Outcome.PLACED, reasons.PROPORTIONAL, placement)
        return RoundPlan(decisions=tuple(decisions[j.job_id] for j in ordered_jobs))


class RotatingAllocator(StickyProportionalAllocator):
    """Moves every running job to the next GPU of its server each round (forces restarts)."""

    name = "test-rotating"

    def allocate(self, ordered_jobs: Sequence[JobView], snapshot: ClusterSnapshot) -> RoundPlan:
        plan = super().allocate(ordered_jobs, snapshot)
        views = {j.job_id: j for j in ordered_jobs}
        num_gpus = snapshot.servers[0].num_gpus
        out = []
        for d in plan.decisions:
            cur = views[d.job_id].current
            if d.placement is not None and cur is not None:
                old = cur.shares[0]
                gpu = (old.gpu_indices[0] + 1) % num_gpus
                moved = ServerShare(old.server_id, (gpu,), old.num_cpus, old.mem_gb)
                placement = Placement(d.job_id, (moved,), d.placement.speedup)
                d = Decision(d.job_id, d.outcome, d.reason, placement)
            out.append(d)
        return RoundPlan(decisions=tuple(out))


class NeverAllocator(Allocator):
    """Leaves every job pending (to check that the simulator cannot loop forever)."""

    name = "test-never"

    def allocate(self, ordered_jobs: Sequence[JobView], snapshot: ClusterSnapshot) -> RoundPlan:
        pending = (Decision(j.job_id, Outcome.PENDING, reasons.INSUFFICIENT_GPUS) for j in ordered_jobs)
        return RoundPlan(decisions=tuple(pending))
