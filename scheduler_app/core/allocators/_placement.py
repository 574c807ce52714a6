"""Shared placement machinery for the allocators: free-resource state, server choice, plan assembly.

Stable API (the opt allocator imports it too):
- `infeasible_reason(job, snapshot)` -> reason code or None: can this job ever fit this cluster?
  (`infeasible_reasons(jobs, snapshot)` for a whole list.)
- `gpu_admission(ordered_jobs, infeasible, free_gpu_count)` -> list[bool]: Synergy's GPU-only
  admission in policy order.
- `RoundState(snapshot)`: free GPUs / cores / memory per server for one round, mutated as jobs are
  placed; `find_packed` / `find_first_fit` (or `find` / `find_uniform`) choose servers, `take`
  commits a plan, `adjust` gives back or claims cores and memory of a share already held.
- `PlanBuilder`: one Decision per job, in input order.
- `DemandCache(shape)`: per-call memo of each job's (capped) best case and fixed-demand point.

Per-GPU demands are passed as two sequences indexed by server position (`dc[i]` cores and `dm[i]`
GB per GPU on server i), so one code path serves a uniform vector (`state.uniform(x)`), the
per-server proportional share (`state.prop_cpus`, `state.prop_mem_gb`) and fixed demands.
Cores are tracked as floats (a capped best case can be 4.8 cores per GPU); a share reports
floor(cores) as its integer core count, so the sum of reported cores never exceeds what was free.
GPU indices are taken lowest first, servers are named by their position in `snapshot.servers`.
"""

from __future__ import annotations

import math
from bisect import insort
from collections.abc import Sequence

from scheduler_app.core import reasons
from scheduler_app.core.throughput import OperatingPoint, ServerShape, best_case, relative_speed
from scheduler_app.core.types import (
    ClusterSnapshot,
    Decision,
    JobView,
    Outcome,
    Placement,
    RoundPlan,
    ServerShare,
)

EPS = 1e-6

FIRST_FIT = "first_fit"
PACKED = "packed"
PLACEMENT_STRATEGIES = (FIRST_FIT, PACKED)

Plan = list[tuple[int, int]]  # (server position, number of GPUs) pairs


def has_fixed_demand(job: JobView) -> bool:
    """True when the user fixed the per-GPU cores or memory of this job."""
    return job.cpus_per_gpu_override is not None or job.mem_gb_per_gpu_override is not None


def infeasible_reason(job: JobView, snapshot: ClusterSnapshot, total_gpus: int | None = None) -> str | None:
    """Why `job` can never fit this cluster (even empty), or None if it could.

    A fixed demand is infeasible when the cluster cannot hold `num_gpus` GPUs each with that
    per-GPU share, counting every server's full capacity (a split job needs the share on every
    server it touches); a dimension that is not overridden gets each server's proportional share,
    which always fits.
    """
    if job.num_gpus < 1:
        raise ValueError(f"job {job.job_id}: num_gpus must be >= 1, got {job.num_gpus}")
    if job.num_gpus > (snapshot.total_gpus if total_gpus is None else total_gpus):
        return reasons.EXCEEDS_CLUSTER_GPUS
    if not has_fixed_demand(job):
        return None
    c = job.cpus_per_gpu_override
    m = job.mem_gb_per_gpu_override
    holdable = 0
    for s in snapshot.servers:
        k = s.num_gpus
        if c is not None and c > 0:
            k = min(k, math.floor((s.num_cpus + EPS) / c))
        if m is not None and m > 0:
            k = min(k, math.floor((s.mem_gb + EPS) / m))
        holdable += k
    return reasons.EXCEEDS_SERVER_RESOURCES if holdable < job.num_gpus else None


def infeasible_reasons(jobs: Sequence[JobView], snapshot: ClusterSnapshot) -> list[str | None]:
    """`infeasible_reason` for every job (the cluster's GPU total is computed once)."""
    total_gpus = snapshot.total_gpus
    return [infeasible_reason(job, snapshot, total_gpus) for job in jobs]


def gpu_admission(
    ordered_jobs: Sequence[JobView], infeasible: Sequence[str | None], free_gpu_count: int
) -> list[bool]:
    """Synergy's runnable set: in policy order, admit a job if its GPU count fits what is left.

    Only GPUs are checked, so a later smaller job may be admitted past a big one that does not fit.
    Infeasible jobs are never admitted. Reference: simulator/schedulers/*_synergy_new.py
    (`jobs_this_round`).
    """
    admitted = [False] * len(ordered_jobs)
    left = free_gpu_count
    for pos, job in enumerate(ordered_jobs):
        if infeasible[pos] is None and job.num_gpus <= left:
            admitted[pos] = True
            left -= job.num_gpus
    return admitted


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


class RoundState:
    """Free resources of one round, per server position; mutated as jobs are placed.

    Servers are also bucketed by their free GPU count, so "the server with the fewest free GPUs
    that fits" is found without scanning full servers.
    """

    def __init__(self, snapshot: ClusterSnapshot) -> None:
        servers = snapshot.servers
        self.servers = servers
        self.num_servers = len(servers)
        self.server_ids = [s.server_id for s in servers]
        self.free_idx: list[list[int]] = [sorted(s.free_gpus) for s in servers]
        self.num_free: list[int] = [len(x) for x in self.free_idx]
        self.free_cpus: list[float] = [float(s.free_cpus) for s in servers]
        self.free_mem_gb: list[float] = [float(s.free_mem_gb) for s in servers]
        self.prop_cpus: list[float] = [s.num_cpus / s.num_gpus if s.num_gpus else 0.0 for s in servers]
        self.prop_mem_gb: list[float] = [s.mem_gb / s.num_gpus if s.num_gpus else 0.0 for s in servers]
        self.free_gpu_count = sum(self.num_free)
        self.total_free_cpus = sum(self.free_cpus)
        self.total_free_mem_gb = sum(self.free_mem_gb)
        top = max(self.num_free, default=0)
        self._buckets: list[list[int]] = [[] for _ in range(top + 1)]
        for i, n in enumerate(self.num_free):
            self._buckets[n].append(i)
        self._uniform: dict[float, list[float]] = {}
        self._failed: dict[tuple[float, float], int] = {}  # (c, m) -> fewest GPUs that did not fit

    # -- demand vectors ------------------------------------------------------------------------
    def uniform(self, value: float) -> list[float]:
        """The same per-GPU value on every server, as a per-server sequence (cached per value)."""
        vec = self._uniform.get(value)
        if vec is None:
            vec = self._uniform[value] = [value] * self.num_servers
        return vec

    def fixed_demand(self, job: JobView) -> tuple[list[float], list[float]]:
        """Per-server per-GPU demand of a fixed-demand job (non-overridden side: proportional)."""
        c, m = job.cpus_per_gpu_override, job.mem_gb_per_gpu_override
        dc = self.prop_cpus if c is None else self.uniform(float(c))
        dm = self.prop_mem_gb if m is None else self.uniform(float(m))
        return dc, dm

    # -- queries -------------------------------------------------------------------------------
    def gpus_fitting(self, i: int, c: float, m: float) -> int:
        """How many GPUs server i can take at per-GPU demand (c, m) right now."""
        k = self.num_free[i]
        if c > 0:
            k = min(k, int((self.free_cpus[i] + EPS) / c))
        if m > 0:
            k = min(k, int((self.free_mem_gb[i] + EPS) / m))
        return k

    def totals_allow(self, num_gpus: int, c: float, m: float) -> bool:
        """Cheap necessary condition for a uniform per-GPU demand: the cluster-wide free totals."""
        return (
            num_gpus <= self.free_gpu_count
            and num_gpus * c <= self.total_free_cpus + EPS
            and num_gpus * m <= self.total_free_mem_gb + EPS
        )

    def find_packed(self, num_gpus: int, dc: Sequence[float], dm: Sequence[float]) -> Plan | None:
        """Synergy's placement-sensitive choice (resources/cluster.py `allocate_synergy_placement`).

        A multi-GPU job first goes whole onto the server with the fewest free GPUs that fits its
        whole vector (ties: lowest position); otherwise (and always for a single GPU) it is spread
        GPU by GPU from the servers with the fewest free GPUs, as the reference's min-heap does:
        that heap drains the emptiest fitting server before moving to the next, so we take as many
        GPUs as fit from each server in ascending (free GPUs, position) order.
        """
        buckets = self._buckets
        free_cpus, free_mem = self.free_cpus, self.free_mem_gb
        if num_gpus > 1:
            for b in range(num_gpus, len(buckets)):
                for i in buckets[b]:
                    if (
                        free_cpus[i] + EPS >= num_gpus * dc[i]
                        and free_mem[i] + EPS >= num_gpus * dm[i]
                    ):
                        return [(i, num_gpus)]
        plan: Plan = []
        need = num_gpus
        for b in range(1, len(buckets)):
            for i in buckets[b]:
                # gpus_fitting, inlined: this loop is the allocators' hot path.
                k = b
                c = dc[i]
                if c > 0:
                    kc = int((free_cpus[i] + EPS) / c)
                    if kc < k:
                        k = kc
                m = dm[i]
                if m > 0:
                    km = int((free_mem[i] + EPS) / m)
                    if km < k:
                        k = km
                if k <= 0:
                    continue
                if k >= need:
                    plan.append((i, need))
                    return plan
                plan.append((i, k))
                need -= k
        return None

    def find_first_fit(self, num_gpus: int, dc: Sequence[float], dm: Sequence[float]) -> Plan | None:
        """Synergy's first fit (resources/cluster.py `_top_synergy_gpus`, the reference's default).

        Scan the free GPUs in cluster order (server by server, lowest index first) and take a GPU
        whenever its server still has the per-GPU share, holding resources during the scan.
        """
        plan: Plan = []
        need = num_gpus
        num_free, free_cpus, free_mem = self.num_free, self.free_cpus, self.free_mem_gb
        for i in range(self.num_servers):
            k = num_free[i]
            if k == 0:
                continue
            # gpus_fitting, inlined: this loop is the allocators' hot path.
            c = dc[i]
            if c > 0:
                kc = int((free_cpus[i] + EPS) / c)
                if kc < k:
                    k = kc
            m = dm[i]
            if m > 0:
                km = int((free_mem[i] + EPS) / m)
                if km < k:
                    k = km
            if k <= 0:
                continue
            if k >= need:
                plan.append((i, need))
                return plan
            plan.append((i, k))
            need -= k
        return None

    def find(self, strategy: str, num_gpus: int, dc: Sequence[float], dm: Sequence[float]) -> Plan | None:
        """Dispatch on the placement strategy name (`packed` or `first_fit`)."""
        if strategy == PACKED:
            return self.find_packed(num_gpus, dc, dm)
        return self.find_first_fit(num_gpus, dc, dm)

    def find_uniform(self, strategy: str, num_gpus: int, c: float, m: float) -> Plan | None:
        """`find` for the same per-GPU demand (c, m) on every server, with two shortcuts.

        Both strategies fail exactly when the servers together cannot hold `num_gpus` GPUs at
        (c, m) (the spread and the first fit take all they can from every server), a condition
        monotone in the GPU count that stays true while resources are only taken. So a failure
        is remembered per (c, m) until `adjust` frees something, and the free totals are
        checked before any scan.
        """
        failed_at = self._failed.get((c, m))
        if failed_at is not None and num_gpus >= failed_at:
            return None
        plan = None
        if self.totals_allow(num_gpus, c, m):
            plan = self.find(strategy, num_gpus, self.uniform(c), self.uniform(m))
        if plan is None and (failed_at is None or num_gpus < failed_at):
            self._failed[(c, m)] = num_gpus
        return plan

    # -- mutations -----------------------------------------------------------------------------
    def take(self, plan: Plan, dc: Sequence[float], dm: Sequence[float]) -> list[HeldShare]:
        """Commit a plan: take the lowest free GPU indices and the per-GPU cores/memory on each server."""
        shares = []
        for i, k in plan:
            idx = self.free_idx[i]
            gpus = tuple(idx[:k])
            del idx[:k]
            cpus = k * dc[i]
            mem_gb = k * dm[i]
            self.free_cpus[i] -= cpus
            self.free_mem_gb[i] -= mem_gb
            self.total_free_cpus -= cpus
            self.total_free_mem_gb -= mem_gb
            self._move(i, self.num_free[i] - k)
            shares.append(HeldShare(i, gpus, cpus, mem_gb))
        return shares

    def adjust(self, share: HeldShare, cpus: float, mem_gb: float) -> None:
        """Set a held share's cores and memory to new values, returning or claiming the difference."""
        i = share.server_pos
        self.free_cpus[i] += share.cpus - cpus
        self.free_mem_gb[i] += share.mem_gb - mem_gb
        self.total_free_cpus += share.cpus - cpus
        self.total_free_mem_gb += share.mem_gb - mem_gb
        if cpus < share.cpus or mem_gb < share.mem_gb:
            self._failed.clear()  # something was freed: remembered failures may fit now
        share.cpus = cpus
        share.mem_gb = mem_gb

    def _move(self, i: int, new_free: int) -> None:
        old = self.num_free[i]
        self._buckets[old].remove(i)
        insort(self._buckets[new_free], i)
        self.num_free[i] = new_free
        self.free_gpu_count -= old - new_free

    # -- output --------------------------------------------------------------------------------
    def server_shares(self, held: Sequence[HeldShare]) -> tuple[ServerShare, ...]:
        """Frozen shares for a Placement (integer cores: floor of the float cores held)."""
        ids = self.server_ids
        return tuple(
            ServerShare(ids[h.server_pos], h.gpu_indices, int(h.cpus + EPS), h.mem_gb) for h in held
        )


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


def pending_reason(num_gpus: int, free_gpu_count: int) -> str:
    """`insufficient_gpus` when the GPUs were not there, `fragmented` when CPU/memory were missing."""
    return reasons.INSUFFICIENT_GPUS if num_gpus > free_gpu_count else reasons.FRAGMENTED


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
