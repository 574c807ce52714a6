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


class HeldJob:
    """A job placed earlier in this round (tune, opt); peers may still shrink it, so it stays mutable."""

    __slots__ = ("job", "point", "pos", "reason", "revertible", "seq", "shares", "speed", "weight")

    def __init__(
        self,
        job: JobView,
        pos: int,
        seq: int,
        shares: list[HeldShare],
        point: OperatingPoint | None,
        speed: float,
        reason: str,
        revertible: bool,
        weight: float = 1.0,
    ) -> None:
        self.job = job
        self.pos = pos  # position in the policy order (where its decision goes)
        self.seq = seq  # placement order, the last tie-break among peers
        self.shares = shares
        self.point = point  # the uniform per-GPU point it holds; None at proportional / fixed demand
        self.speed = speed
        self.reason = reason
        self.revertible = revertible
        self.weight = weight  # opt's weight of its throughput (its GPUs, or 1)

    def peer_key(self) -> tuple[int, float, float, int]:
        """Reference order for taking surplus back: fewest servers, most CPU/GPU, most memory/GPU."""
        num_gpus = self.job.num_gpus
        cpus = sum(s.cpus for s in self.shares)
        mem_gb = sum(s.mem_gb for s in self.shares)
        return (len(self.shares), -cpus / num_gpus, -mem_gb / num_gpus, self.seq)


class PlanBuilder:
    """Collects one Decision per input job and returns them in input order."""

    def __init__(self, ordered_jobs: Sequence[JobView]) -> None:
        self._jobs = ordered_jobs
        self._decisions: list[Decision | None] = [None] * len(ordered_jobs)

    def placed(self, pos: int, shares: tuple[ServerShare, ...], speedup: float, reason: str) -> None:
        job_id = self._jobs[pos].job_id
        self._decisions[pos] = Decision(job_id, Outcome.PLACED, reason, Placement(job_id, shares, speedup))

    def kept(self, pos: int, placement: Placement, reason: str) -> None:
        """Placed on `placement` itself: the job's current one, equal to what `placed` would build."""
        self._decisions[pos] = Decision(self._jobs[pos].job_id, Outcome.PLACED, reason, placement)

    def pending(self, pos: int, reason: str) -> None:
        self._decisions[pos] = Decision(self._jobs[pos].job_id, Outcome.PENDING, reason)

    def infeasible(self, pos: int, reason: str) -> None:
        self._decisions[pos] = Decision(self._jobs[pos].job_id, Outcome.INFEASIBLE, reason)

    def decision(self, pos: int) -> Decision | None:
        """The decision recorded for the job at `pos` so far (None: none yet)."""
        return self._decisions[pos]

    def is_decided(self, pos: int) -> bool:
        return self._decisions[pos] is not None

    def build(self, *, stable: bool = False) -> RoundPlan:
        """The plan; `stable` is the allocator's word that it repeats (RoundPlan.stable)."""
        missing = [self._jobs[p].job_id for p, d in enumerate(self._decisions) if d is None]
        if missing:
            raise RuntimeError(f"allocator left jobs without a decision: {missing}")
        return RoundPlan(tuple(self._decisions), stable)  # type: ignore[arg-type]


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
