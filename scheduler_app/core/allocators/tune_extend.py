"""Tune's plan for a stable plan's jobs and the jobs arrived behind them, without deciding it again.

A stable plan (RoundPlan.stable, `TuneRound.settled`) holds every admitted job at its best case, each
on its own GPUs, none left out. When jobs arrive behind such a plan's jobs (after them in the policy
order and in tune's order: no more GPUs than any of them) and every one of its jobs still runs where
the plan put it, tune's round takes the common shape of `hold_current`: the plan's jobs come first
and each is held on its GPUs at its best case (strictly, asking no more than it holds), in tune's
order, with the same float operations whatever the arrivals; each keeps its current Placement, so its
decision is the plan's own. The arrivals are then placed on the state those holds leave. Where each
admitted arrival fits its best case by the plain rule, and holding it there keeps the plan stable
(`settles`), the sticky plan is stable and tune returns it as it is (TuneAllocator.allocate): the
plan's decisions followed by the arrivals'. Anything else (an arrival at less than its best case, a
node count, a fixed demand, an arrival ahead of a running job in tune's order, a job no longer on
the plan's placement) answers None, and the round is decided in full.

What it saves: the full round's set-up over every job (feasibility, admission, node counts), the
claims' or holds' checks per running job beyond the float operations themselves, and building each
running job's decision again.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

from scheduler_app.core import reasons
from scheduler_app.core.placement import (
    DemandCache,
    HeldJob,
    HeldShare,
    PlanBuilder,
    RoundState,
    has_fixed_demand,
    infeasible_reason,
)
from scheduler_app.core.placement.plan import MEMO_MAX
from scheduler_app.core.placement.setup import placed_as_held
from scheduler_app.core.throughput import OperatingPoint, with_penalty
from scheduler_app.core.types import ClusterSnapshot, Decision, JobView, Outcome, Placement, RoundPlan


class StickyRound(Protocol):
    """What this module uses of tune's round (TuneRound, a RoundSetup)."""

    state: RoundState
    demands: DemandCache
    builder: PlanBuilder
    held: list[HeldJob]
    settled: bool

    def try_place(
        self,
        pos: int,
        dc: Sequence[float],
        dm: Sequence[float],
        point: OperatingPoint | None,
        speed: float,
        reason: str,
    ) -> bool: ...

    def placed(
        self, pos: int, shares: Sequence[HeldShare], speed: float, reason: str, scale: float = 1.0
    ) -> None: ...


# Builds the allocator's sticky round for these jobs on this snapshot with the admission given.
MakeRound = Callable[[Sequence[JobView], ClusterSnapshot, tuple[list[str | None], list[bool]]], StickyRound]


def extend_stable(
    make_round: MakeRound, previous: RoundPlan, ordered_jobs: Sequence[JobView], snapshot: ClusterSnapshot
) -> RoundPlan | None:
    """Tune's plan (TuneAllocator.allocate) for `ordered_jobs` (policy order) on `snapshot`, where
    `previous` is a stable plan whose jobs are the first of `ordered_jobs`, in its order, each
    running on the very Placement `previous` gives it, and the rest arrived (none has a placement);
    None where that is not the round's shape or the plan would not be stable (module docstring)."""
    decisions = previous.decisions
    n = len(decisions)
    if not previous.stable or len(ordered_jobs) <= n:
        return None
    arrivals = ordered_jobs[n:]
    infeasible: list[str | None] = [None] * len(ordered_jobs)
    admitted = [True] * n + [False] * len(arrivals)
    # The round's set-up is the caller's: these lists, filled in below before the round reads them.
    tune = make_round(ordered_jobs, snapshot, (infeasible, admitted))
    state = tune.state
    best_of = tune.demands.best
    best_case = reasons.BEST_CASE
    fewest = None  # the fewest GPUs of a job of the plan (tune's order puts more GPUs first)
    monotone = True  # GPU counts never grow along the plan's order: tune's order is the plan's
    last = None
    used = 0
    held: list[tuple[Placement, int, float, float]] = []  # what hold_current would take, in order
    # The tests below are pure functions of the (frozen) decision and job view on this shape: a pair
    # that passed them in an earlier extension (the same objects: a steady plan's decisions, the
    # simulator's views of jobs that did not move) is answered from the shape's memo.
    memo = tune.demands.memo
    for decision, job in zip(decisions, ordered_jobs, strict=False):
        entry = memo.get(id(decision))
        if entry is not None and entry[0] is decision and entry[1] is job:
            item = entry[2]
            g = item[1]
        else:
            if not placed_as_held(decision, job, best_case):
                return None
            placement = decision.placement
            g = job.num_gpus
            best = best_of(job)
            speed = best.speed
            if placement.speedup != speed:
                return None  # its decision would not be its current Placement (RoundSetup.is_current)
            shares_now = placement.shares
            if len(shares_now) > 1 and with_penalty(speed, job.profile, len(shares_now), g) != speed:
                return None  # a spread job's penalty: the plan would not be stable
            item = (placement, g, best.cpus_per_gpu, best.mem_gb_per_gpu)
            if len(memo) >= MEMO_MAX:
                memo.clear()
            memo[id(decision)] = (decision, job, item)
        held.append(item)
        if last is not None and g > last:
            monotone = False
        last = g
        fewest = g if fewest is None or g < fewest else fewest
        used += g
    if not monotone:  # tune's order: more GPUs first, ties in the plan's order (a stable sort)
        held.sort(key=lambda item: -item[1])
    total_gpus = snapshot.total_gpus
    left = snapshot.free_gpu_count - used  # GPU admission's count once the plan's jobs are admitted
    for pos, job in enumerate(arrivals, start=n):
        if job.current is not None or job.num_nodes is not None or has_fixed_demand(job):
            return None
        why = infeasible_reason(job, snapshot, total_gpus)
        if why is not None:
            infeasible[pos] = why
        elif job.num_gpus <= left:
            if fewest is not None and job.num_gpus > fewest:
                return None  # ahead of a running job in tune's order: not the held shape
            admitted[pos] = True
            left -= job.num_gpus
    # The plan's jobs were admitted (each holds its GPUs among the free ones, checked as it is held
    # below, so together they fit the free count) and are feasible (no fixed demand or node count,
    # and no more GPUs than the cluster's free ones).
    # hold_current's strict tries (without reservations), each keeping the job's own Placement.
    if not state.take_kept(held):
        return None
    state.rebucket()
    uniform = state.uniform
    runnable = sorted((-arrivals[p - n].num_gpus, p) for p in range(n, len(ordered_jobs)) if admitted[p])
    for _, pos in runnable:
        job = ordered_jobs[pos]
        best = best_of(job)
        bc, bm = uniform(best.cpus_per_gpu), uniform(best.mem_gb_per_gpu)
        if not tune.try_place(pos, bc, bm, best, best.speed, best_case) or not tune.settled:
            return None  # below its best case (or room made): not a stable plan
    builder = tune.builder
    for h in tune.held:  # the arrivals
        tune.placed(h.pos, h.shares, h.speed, h.reason)
    added: list[Decision] = []
    for pos in range(n, len(ordered_jobs)):
        job = arrivals[pos - n]
        why = infeasible[pos]
        if why is not None:
            added.append(Decision(job.job_id, Outcome.INFEASIBLE, why))
        elif not admitted[pos]:
            added.append(Decision(job.job_id, Outcome.PENDING, reasons.INSUFFICIENT_GPUS))
        else:
            decision = builder.decision(pos)
            assert decision is not None
            added.append(decision)
    return RoundPlan(decisions + tuple(added), True)
