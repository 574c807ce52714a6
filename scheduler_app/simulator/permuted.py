"""A stable proportional plan is the next round's too when only the order among its running jobs changed.

Under a policy that orders by progress (srtf, las, sjf: their keys move as jobs run) the simulator
reuses a plan only while the policy orders the jobs exactly as the plan does (reuse.py, `holds`).
Running jobs overtake one another all the time (srtf's remaining times shrink at their own rates,
las's attained GPU-seconds grow by each job's GPU count), and each such round was decided again
although, under `proportional`, its plan is the last one with its decisions in the new order:

`ProportionalAllocator.allocate` on the same jobs, where the jobs its stable plan P placed all come
first in the new order (each running on P's Placement for it, at P's reason and speed, no node count
and no fixed demand) and GPU admission leaves every other job out, takes `hold_current`'s path: every
running job is admitted (their GPUs fit, as in P), `take_current` holds each on its GPUs at its share
(k x cores and memory per GPU), every other job gets its pending `insufficient_gpus`, and the plan is
stable (no node counts). Holding takes the same per-job tests as in P's round (its GPUs free: P's
placements are disjoint; the share it asks, one product per job), and each job's cores and memory fit
what its turn leaves: P's round found each fitting at its turn within EPS, so every server holds all of
its jobs' shares within EPS, and a job's turn leaves at least the capacity less the others' shares.
That last step needs sums that do not depend on their order: it is taken only where every capacity
and per-GPU share is a multiple of 2^-20 below 2^30 (24 cores and 500 GB on 8 GPUs: 3 and 62.5), so
every partial sum is exact. Each held job's decision is then the one keeping it on its current
Placement (`PlanBuilder.kept`, the same values as P's), and `with_interference` left P as it was
(a stable plan: no job's workload has a kappa), so it leaves this one too.

`tune` (TuneAllocator itself, its own round and order) the same way, where each job P placed runs
on one server at its best case (reason `best_case`, the GPUs it asks, a best case on the grid): a
stable tune plan held every admitted job at its best case within what its turn left (`settles`), all
of them are admitted again and come first in tune's order (GPU count, then policy order), and
`hold_current`'s inlined strict try holds each on its GPUs at its best case (it asks what it holds),
which leaves `settled` as it was: the plan is stable and `allocate` returns it without the repack
test. Tests:
tests/scheduler_app/simulator/test_permuted.py (the plan equals the allocator's at every round).
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence

from scheduler_app.core import reasons
from scheduler_app.core.allocators.proportional import ProportionalAllocator
from scheduler_app.core.allocators.tune import ORDER_GPUS, TuneAllocator, TuneRound
from scheduler_app.core.placement.plan import DemandCache
from scheduler_app.core.restarts import RestartPolicy
from scheduler_app.core.throughput import cluster_shape, with_penalty
from scheduler_app.core.types import ClusterSnapshot, JobView, Outcome, RoundPlan
from scheduler_app.simulator.reuse import ReusingAllocator

_GRID = float(2**20)  # every capacity and share a multiple of 1 / _GRID ...
_BOUND = float(2**30)  # ... and below this: sums of a server's shares are exact in any order
# id(snapshot) -> (snapshot, whether its servers pass `_exact_shares`, its best cases); a simulation
# shares one snapshot.
_EXACT: dict[int, tuple[ClusterSnapshot, bool, DemandCache]] = {}


def _on_grid(x: float) -> bool:
    return abs(x) < _BOUND and (x * _GRID).is_integer()


def _exact_shares(snapshot: ClusterSnapshot) -> bool:
    """Whether every server gives each GPU the same cores and memory (`hold_current`'s condition) and
    every capacity and share is on the grid, so that holding a plan's jobs in any order works out the
    same free cores and memory, float for float."""
    return _snapshot_entry(snapshot)[1]


def _snapshot_entry(snapshot: ClusterSnapshot) -> tuple[ClusterSnapshot, bool, DemandCache]:
    hit = _EXACT.get(id(snapshot))
    if hit is not None and hit[0] is snapshot:
        return hit
    servers = snapshot.servers
    ok = bool(servers) and all(s.num_gpus for s in servers)
    if ok:
        c0 = servers[0].num_cpus / servers[0].num_gpus
        m0 = servers[0].mem_gb / servers[0].num_gpus
        ok = _on_grid(c0) and _on_grid(m0)
        for s in servers:
            if (
                not ok
                or s.num_cpus / s.num_gpus != c0
                or s.mem_gb / s.num_gpus != m0
                or not _on_grid(float(s.free_cpus))
                or not _on_grid(float(s.free_mem_gb))
            ):
                ok = False
                break
    if len(_EXACT) >= 64:
        _EXACT.clear()
    entry = _EXACT[id(snapshot)] = (snapshot, ok, DemandCache(cluster_shape(snapshot)))
    return entry


def permuted_plan(
    plan: RoundPlan,
    progress: Hashable,
    jobs: Sequence[JobView],
    policy: object,
    allocator: ReusingAllocator,
    snapshot: ClusterSnapshot,
    now_s: float,
    restarts: RestartPolicy | None,
) -> RoundPlan | None:
    """`plan`'s decisions in the policy's order of `jobs` now, where that is the round's plan (the
    module docstring says when); None where the round is to be decided. `plan` is the steady plan
    `holds` just found out of order: the last plan applied (or it less the jobs it finished), and
    `jobs` the same jobs' views now."""
    inner = allocator.inner
    if restarts is not None or progress != () or not plan.stable or len(plan.decisions) != len(jobs):
        return None
    kind = type(inner)
    if kind is TuneAllocator:
        if inner.order != ORDER_GPUS or inner.round_class is not TuneRound:  # type: ignore[attr-defined]
            return None
        tune = True
    elif kind is ProportionalAllocator:
        tune = False
    else:
        return None
    _, exact, demands = _snapshot_entry(snapshot)
    if not exact:
        return None
    ordered = policy.order(jobs, snapshot, now_s)  # type: ignore[attr-defined]
    by_id = {d.job_id: d for d in plan.decisions}
    left = snapshot.free_gpu_count
    out = []
    running = True  # still in the prefix of the jobs P placed
    proportional, insufficient, best_case = reasons.PROPORTIONAL, reasons.INSUFFICIENT_GPUS, reasons.BEST_CASE
    for job in ordered:
        decision = by_id.get(job.job_id)
        if decision is None:
            return None
        placement = decision.placement
        if placement is not None:
            if (
                not running
                or placement is not job.current
                or decision.outcome is not Outcome.PLACED
                or decision.reason != (best_case if tune else proportional)
                or job.num_nodes is not None
                or job.cpus_per_gpu_override is not None
                or job.mem_gb_per_gpu_override is not None
            ):
                return None
            shares = placement.shares
            if tune:
                best = demands.best(job)
                if (
                    len(shares) != 1
                    or len(shares[0].gpu_indices) != job.num_gpus
                    or placement.speedup != best.speed
                    or not _on_grid(best.cpus_per_gpu)
                    or not _on_grid(best.mem_gb_per_gpu)
                ):
                    return None
            else:
                speed = 1.0 if len(shares) == 1 else with_penalty(1.0, job.profile, len(shares), job.num_gpus)
                if placement.speedup != speed:
                    return None  # not the Placement hold_current's `placed` gives back
            left -= job.num_gpus
        else:
            running = False
            if (
                job.current is not None
                or decision.outcome is not Outcome.PENDING
                or decision.reason != insufficient
                or job.num_gpus <= left  # GPU admission would take it
                or job.num_nodes is not None
            ):
                return None
        out.append(decision)
    if left < 0:
        return None
    return RoundPlan(tuple(out), True)
