"""A round's working pieces besides the free capacity: held shares, the plan being built, a demand memo."""

from __future__ import annotations

from collections.abc import Sequence

from scheduler_app.core.throughput import OperatingPoint, ServerShape, best_case, relative_speed
from scheduler_app.core.types import Decision, JobView, Outcome, Placement, RoundPlan, ServerShare

EPS = 1e-6  # tolerance when comparing cores and GB (floats) across the placement code

Plan = list[tuple[int, int]]  # (server position, number of GPUs) pairs


class HeldShare:
    """The part of a job's allocation on one server, while the round is being decided (mutable)."""

    __slots__ = ("cpus", "gpu_indices", "mem_gb", "server_pos")

    def __init__(self, server_pos: int, gpu_indices: tuple[int, ...], cpus: float, mem_gb: float) -> None:
        self.server_pos = server_pos
        self.gpu_indices = gpu_indices
        self.cpus = cpus
        self.mem_gb = mem_gb

    @property
    def num_gpus(self) -> int:
        return len(self.gpu_indices)


class PlanBuilder:
    """Collects one Decision per input job and returns them in input order."""

    def __init__(self, ordered_jobs: Sequence[JobView]) -> None:
        self._jobs = ordered_jobs
        self._decisions: list[Decision | None] = [None] * len(ordered_jobs)

    def placed(self, pos: int, shares: tuple[ServerShare, ...], speedup: float, reason: str) -> None:
        job_id = self._jobs[pos].job_id
        self._decisions[pos] = Decision(job_id, Outcome.PLACED, reason, Placement(job_id, shares, speedup))

    def pending(self, pos: int, reason: str) -> None:
        self._decisions[pos] = Decision(self._jobs[pos].job_id, Outcome.PENDING, reason)

    def infeasible(self, pos: int, reason: str) -> None:
        self._decisions[pos] = Decision(self._jobs[pos].job_id, Outcome.INFEASIBLE, reason)

    def is_decided(self, pos: int) -> bool:
        return self._decisions[pos] is not None

    def build(self) -> RoundPlan:
        missing = [self._jobs[p].job_id for p, d in enumerate(self._decisions) if d is None]
        if missing:
            raise RuntimeError(f"allocator left jobs without a decision: {missing}")
        return RoundPlan(tuple(self._decisions))  # type: ignore[arg-type]


class DemandCache:
    """Per-call memo of each job's best case on the cluster shape, keyed by (id(profile), num_gpus).

    Hashing a frozen profile walks its whole matrix, so within one allocate() call we look it up
    by identity (the jobs keep their profiles alive for the whole call) and fall back to the
    module-level caches in throughput.py only once per distinct profile object.
    """

    def __init__(self, shape: ServerShape | None) -> None:
        self.shape = shape
        self._best: dict[tuple[int, int], OperatingPoint] = {}

    def best(self, job: JobView) -> OperatingPoint:
        key = (id(job.profile), job.num_gpus)
        point = self._best.get(key)
        if point is None:
            assert self.shape is not None, "a feasible job implies a non-empty cluster"
            point = self._best[key] = best_case(job.profile, job.num_gpus, self.shape)
        return point

    def fixed_point(self, job: JobView) -> OperatingPoint:
        """The per-GPU point of a fixed-demand job on the cluster shape, and its speed there."""
        assert self.shape is not None
        c = job.cpus_per_gpu_override
        m = job.mem_gb_per_gpu_override
        cpus = self.shape.cpus_per_gpu if c is None else float(c)
        mem_gb = self.shape.mem_gb_per_gpu if m is None else float(m)
        speed = relative_speed(job.profile, job.num_gpus, self.shape, cpus, mem_gb)
        return OperatingPoint(cpus, mem_gb, speed)
