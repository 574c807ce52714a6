"""A round's working pieces besides the free capacity: held shares, the plan being built, a demand memo."""

from __future__ import annotations

from collections.abc import Sequence

from scheduler_app.core.throughput import OperatingPoint, ServerShape, best_case, relative_speed
from scheduler_app.core.types import (
    Decision,
    JobView,
    Outcome,
    Placement,
    RoundPlan,
    SensitivityProfile,
    ServerShare,
)

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


# id(placement) -> the decision keeping a job on that Placement object (PlanBuilder.kept); bounded.
_KEPT: dict[int, Decision] = {}
_KEPT_MAX = 8192
# (job id, reason) -> the pending decision (PlanBuilder.pending): a frozen value of those two alone,
# so every round's waiting jobs share one object each instead of building it again; bounded.
_PENDING: dict[tuple[int, str], Decision] = {}
_PENDING_MAX = 16384


class PlanBuilder:
    """Collects one Decision per input job and returns them in input order."""

    def __init__(self, ordered_jobs: Sequence[JobView]) -> None:
        self._jobs = ordered_jobs
        self._decisions: list[Decision | None] = [None] * len(ordered_jobs)

    def placed(self, pos: int, shares: tuple[ServerShare, ...], speedup: float, reason: str) -> None:
        job_id = self._jobs[pos].job_id
        self._decisions[pos] = Decision(job_id, Outcome.PLACED, reason, Placement(job_id, shares, speedup))

    def kept(self, pos: int, placement: Placement, reason: str) -> None:
        """Placed on `placement` itself: the job's current one (of this job), equal to what `placed`
        would build. The decision of an earlier round that kept it so is the same frozen value, so it
        is taken from `_KEPT` (most running jobs of every decided round) instead of built again."""
        decision = _KEPT.get(id(placement))
        if decision is None or decision.placement is not placement or decision.reason != reason:
            decision = Decision(self._jobs[pos].job_id, Outcome.PLACED, reason, placement)
            if len(_KEPT) >= _KEPT_MAX:
                _KEPT.clear()
            _KEPT[id(placement)] = decision  # it holds the placement: the id is not reused meanwhile
        self._decisions[pos] = decision

    def pending(self, pos: int, reason: str) -> None:
        key = (self._jobs[pos].job_id, reason)
        decision = _PENDING.get(key)
        if decision is None:
            if len(_PENDING) >= _PENDING_MAX:
                _PENDING.clear()
            decision = _PENDING[key] = Decision(key[0], Outcome.PENDING, reason)
        self._decisions[pos] = decision

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


# Best cases shared by every round on a cluster shape (keyed by the shape's values): (id(profile),
# GPUs) -> (profile, point), the profile kept so that its id cannot be reused by another while its
# entry stands. best_case is pure, so a round reads the same point
# from here as from its own memo; sharing it saves each round a best_case call per profile (which
# hashes the profile's whole matrix). Cleared whole when it reaches the bound (long-lived services
# with profiles made per job).
_BestMemo = dict[tuple[int, int], tuple[SensitivityProfile, OperatingPoint]]
_SHARED_BEST: dict[tuple[int, float, float], _BestMemo] = {}
_SHARED_BEST_MAX = 4096
# Callers' memos of what a (decision, job view) pair gives on a shape (DemandCache.memo): the same
# sharing and bound.
_SHARED_MEMO: dict[tuple[int, float, float], dict[int, tuple]] = {}
MEMO_MAX = 8192


class DemandCache:
    """Memo of each job's best case on the cluster shape, keyed by (id(profile), num_gpus).

    Hashing a frozen profile walks its whole matrix, so we look it up by identity and fall back to
    the module-level caches in throughput.py only once per distinct profile object and shape (the
    memo is shared by every DemandCache of a shape's values: `_SHARED_BEST`).
    """

    def __init__(self, shape: ServerShape | None) -> None:
        self.shape = shape
        if shape is None:
            self._best: _BestMemo = {}
            self.memo: dict[int, tuple] = {}
        else:
            key = (shape.num_gpus, shape.num_cpus, shape.mem_gb)
            best = _SHARED_BEST.get(key)
            if best is None:
                best = _SHARED_BEST[key] = {}
                _SHARED_MEMO[key] = {}
            self._best = best
            # id(frozen key object) -> (that object, ..., what a pure function of them gave on this
            # shape); the object kept so that its id is not reused. Bounded as the best cases are.
            self.memo = _SHARED_MEMO[key]

    def best(self, job: JobView) -> OperatingPoint:
        profile = job.profile
        key = (id(profile), job.num_gpus)
        entry = self._best.get(key)
        if entry is not None and entry[0] is profile:
            return entry[1]
        assert self.shape is not None, "a feasible job implies a non-empty cluster"
        point = best_case(profile, job.num_gpus, self.shape)
        if len(self._best) >= _SHARED_BEST_MAX:
            self._best.clear()
        self._best[key] = (profile, point)
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
