"""GPU-proportional allocation (Synergy's "+fair" baseline): every GPU brings its server's CPU/memory share.

Reference: msr-fiddle/synergy simulator/schedulers/*_synergy_new.py with `fair=True` and
resources/cluster.py. Admission is GPU-only in policy order (a later, smaller job may be admitted
past a big one that does not fit); each admitted job then gets, on every server it lands on, that
server's cores and memory divided by its GPU count, times the GPUs it holds there.

Placement: the reference's evaluated "+fair" configurations run without "+place", i.e. its first
fit over the free GPUs in cluster order (`_top_synergy_gpus`), so that is our default;
`placement="packed"` selects its placement-sensitive variant (fewest-free-GPU server first).
Fixed-demand jobs (user overrides) get exactly their demand or stay pending (`fragmented`).
Stickiness (core/placement): an admitted job keeps the GPUs it held last round when they still
hold its share, and the others are placed around them when they can be. A job with a node count
(`num_nodes`) is placed on exactly that many servers, or stays pending.
"""

from __future__ import annotations

from collections.abc import Sequence

from scheduler_app.core import reasons
from scheduler_app.core.allocators.base import Allocator, register_allocator
from scheduler_app.core.placement import (
    EPS,
    FIRST_FIT,
    Score,
    has_fixed_demand,
    infeasible_reason,
    score_named,
)
from scheduler_app.core.placement.scores import FirstFit
from scheduler_app.core.placement.setup import RoundSetup, placed_as_held, running_first
from scheduler_app.core.placement.state import RoundState
from scheduler_app.core.throughput import with_penalty
from scheduler_app.core.types import ClusterSnapshot, Decision, JobView, Outcome, Placement, RoundPlan


@register_allocator("proportional")
class ProportionalAllocator(Allocator):
    """Admit by GPU count in policy order; place each admitted job at its GPU-proportional share.

    Its plan is stable (RoundPlan.stable) when every admitted job is placed, none is infeasible, no
    job has a node count, and each placed job's share fitted what was free on its servers at its turn
    (within EPS, the test of the strict home try). Deciding the same jobs again, each on its placement
    here: admission is the same (GPU counts only); each admitted job claims its GPUs (disjoint, free)
    and, taken in the same order, finds the same cores and memory free at its turn, down to the float
    operations (the same subtractions of k x share, job by job); so its strict home try holds it there
    (it fits, and asks exactly what its share holds), `take` gives it its own GPUs back at the same
    cores and memory, and `placed` hands back its Placement. The pending jobs stay unadmitted. With
    some jobs gone (every job placed): every job left is still admitted, and finds as much free or more
    at its turn (a chain of float subtractions with terms left out is never smaller), so the same holds.
    """

    waits_unadmitted = True  # a job not admitted only gets its pending decision

    def __init__(self, placement: str | Score = FIRST_FIT) -> None:
        self.placement = score_named(placement)

    def extend(
        self, previous: RoundPlan, ordered_jobs: Sequence[JobView], snapshot: ClusterSnapshot
    ) -> RoundPlan | None:
        """Allocator.extend: the stable plan with the arrivals decided behind its jobs (`extend_stable`).
        A subclass with its own `allocate` decides every round."""
        if type(self).allocate is not ProportionalAllocator.allocate:
            return None
        return extend_stable(self, previous, ordered_jobs, snapshot)

    def allocate(self, ordered_jobs: Sequence[JobView], snapshot: ClusterSnapshot) -> RoundPlan:
        round_ = RoundSetup(ordered_jobs, snapshot)
        builder, demands = round_.builder, round_.demands
        infeasible, admitted = round_.infeasible, round_.admitted
        start = hold_current(round_)
        held = _NONE_HELD if start else hold_interleaved(round_, self.placement)
        if not start and not held:
            round_.claim_admitted(remember_others=False)
        state = round_.state
        free_cpus, free_mem_gb = state.free_cpus, state.free_mem_gb
        # RoundPlan.stable, kept up to date as jobs are placed (the class docstring says why).
        stable = not state.has_node_counts
        # One pass deciding every job (not admit() then the admitted): this is the cheapest round.
        for pos in range(start, len(ordered_jobs)):
            if pos in held:
                continue
            job = ordered_jobs[pos]
            why = infeasible[pos]
            if why is not None:
                builder.infeasible(pos, why)
                stable = False
                continue
            if not admitted[pos]:
                builder.pending(pos, reasons.INSUFFICIENT_GPUS)
                continue
            if has_fixed_demand(job):
                dc, dm = state.fixed_demand(job)
                speed, reason = demands.fixed_point(job).speed, reasons.FIXED_DEMAND
            else:
                dc, dm = state.prop_cpus, state.prop_mem_gb
                speed, reason = 1.0, reasons.PROPORTIONAL
            plan = state.find(self.placement, job.num_gpus, dc, dm, job.job_id)
            if plan is None:
                # Only possible when fixed demands (or uneven servers) ate other jobs' shares, or
                # when the job's node count (num_nodes) finds too few servers with its GPUs free.
                state.release(job.job_id)
                builder.pending(pos, state.node_pending_reason(job) or reasons.FRAGMENTED)
                stable = False
                continue
            if stable:
                for i, k in plan:
                    if k * dc[i] > free_cpus[i] + EPS or k * dm[i] > free_mem_gb[i] + EPS:
                        stable = False
            round_.placed(pos, state.take(plan, dc, dm, job.job_id), speed, reason)
        return builder.build(stable=stable)


def extend_stable(
    allocator: ProportionalAllocator,
    previous: RoundPlan,
    ordered_jobs: Sequence[JobView],
    snapshot: ClusterSnapshot,
) -> RoundPlan | None:
    """`allocator.allocate(ordered_jobs, snapshot)` where `previous` is a stable plan whose jobs come
    first in `ordered_jobs`, each on the very Placement `previous` gives it, and the others arrived
    (Allocator.extend); None where that is not the round's shape or the plan would not be stable.

    That round is `hold_current`'s: each of the plan's jobs, admitted, holds its share on its GPUs,
    its decision its current Placement (`RoundState.take_kept`, the same float operations as
    `take_current`'s in the same order: the plan's own decision, equal to the one `placed` makes);
    the arrivals are then decided in policy order on the state that leaves, as `allocate` does. Only
    where the plan stays stable (every admitted arrival placed, fitting what is free at its turn, none
    infeasible), without fixed demands or node counts, on servers giving every GPU the same share.
    """
    decisions = previous.decisions
    n = len(decisions)
    if not previous.stable or len(ordered_jobs) <= n:
        return None
    arrivals = ordered_jobs[n:]
    infeasible: list[str | None] = [None] * len(ordered_jobs)
    admitted = [True] * n + [False] * len(arrivals)
    # The set-up is the caller's: these lists, filled in below before the round reads them.
    round_ = RoundSetup(ordered_jobs, snapshot, admission=(infeasible, admitted))
    state = round_.state
    prop_cpus, prop_mem_gb = state.prop_cpus, state.prop_mem_gb
    share = uniform_share(state)
    if share is None:
        return None
    c0, m0 = share
    reason = reasons.PROPORTIONAL
    used = 0
    held: list[tuple[Placement, int, float, float]] = []
    for decision, job in zip(decisions, ordered_jobs, strict=False):
        if not placed_as_held(decision, job, reason):
            return None
        placement = decision.placement
        shares = placement.shares
        speed = 1.0 if len(shares) == 1 else with_penalty(1.0, job.profile, len(shares), job.num_gpus)
        if placement.speedup != speed:
            return None  # not the Placement `placed` would make for it
        held.append((placement, job.num_gpus, c0, m0))
        used += job.num_gpus
    total_gpus = snapshot.total_gpus
    left = snapshot.free_gpu_count - used  # GPU admission's count once the plan's jobs are admitted
    for pos, job in enumerate(arrivals, start=n):
        if job.current is not None or job.num_nodes is not None or has_fixed_demand(job):
            return None
        if infeasible_reason(job, snapshot, total_gpus) is not None:
            return None  # dropped: the plan is not stable
        if job.num_gpus <= left:
            admitted[pos] = True
            left -= job.num_gpus
    # The plan's jobs hold their GPUs (checked as they are taken), so they fit the free count and are
    # feasible (no fixed demand or node count): all admitted, as `gpu_admission` would.
    if not state.take_kept(held):
        return None
    state.rebucket()
    builder, free_cpus, free_mem_gb = round_.builder, state.free_cpus, state.free_mem_gb
    out: list[Decision] = []
    for pos in range(n, len(ordered_jobs)):
        job = ordered_jobs[pos]
        if not admitted[pos]:
            out.append(Decision(job.job_id, Outcome.PENDING, reasons.INSUFFICIENT_GPUS))
            continue
        plan = state.find(allocator.placement, job.num_gpus, prop_cpus, prop_mem_gb, job.job_id)
        if plan is None:
            return None
        for i, k in plan:
            if k * prop_cpus[i] > free_cpus[i] + EPS or k * prop_mem_gb[i] > free_mem_gb[i] + EPS:
                return None  # beyond what was free (within EPS): not stable
        round_.placed(pos, state.take(plan, prop_cpus, prop_mem_gb, job.job_id), 1.0, reason)
        decision = builder.decision(pos)
        assert decision is not None
        out.append(decision)
    return RoundPlan(decisions + tuple(out), True)


def hold_current(round_: RoundSetup) -> int:
    """The common round, cheaply: where the jobs that ran last round come first in the policy order,
    each admitted and its placement holding its share (`RoundState.take_current`), place them there
    without claims, as claiming them and sending each home would: their strict home try holds each
    (the same test as take_current's), in this order, leaving the same free GPUs, cores and memory
    and no claim standing, so the jobs after them are placed by the same plain rule on the same
    state. Returns how many jobs it placed; 0 (state as it was) where the round has not that shape.

    Only on a cluster whose servers give every GPU the same share (take_current takes one per-GPU
    demand for all the servers of a placement), without node counts.
    """
    jobs, state = round_.jobs, round_.state
    if state.has_node_counts:
        return 0
    count = running_first(jobs, range(len(jobs)))
    if not count:
        return 0
    share = uniform_share(state)
    if share is None:
        return 0
    c0, m0 = share
    infeasible, admitted, demands = round_.infeasible, round_.admitted, round_.demands
    items: list[_Held] = []
    for pos in range(count):
        job = jobs[pos]
        if infeasible[pos] is not None or not admitted[pos]:
            return 0
        if has_fixed_demand(job):
            dc, dm = state.fixed_demand(job)
            items.append((pos, dc[0], dm[0], demands.fixed_point(job).speed, reasons.FIXED_DEMAND))
        else:
            items.append((pos, c0, m0, 1.0, reasons.PROPORTIONAL))
    return count if _hold(round_, items) else 0


_NONE_HELD: frozenset[int] = frozenset()


def hold_interleaved(round_: RoundSetup, score: Score) -> frozenset[int]:
    """`hold_current` for the round where newcomers come between the running jobs in the policy
    order (srtf's and las's usual round: a short or new job goes ahead of the running ones), each
    admitted newcomer ahead of a running job asking one GPU unless `score` is first fit: hold every
    admitted running job on its GPUs first, in order, and return their positions (empty, state as
    it was, where the round has not that shape). The rest of the round then decides the others in
    order as `allocate` does.

    Why that is the claims' round (claim the admitted jobs' GPUs, then decide every job in order):
    - every server starts with at least its share for each free GPU, and each claimant reserves no
      more than its share (both checked), so at any turn of that walk a server with a GPU that
      nobody claims or took also has room for one more share beside the reservations;
    - GPU admission (at most the free GPUs in all) leaves one such GPU for each admitted newcomer;
    - so a one-GPU newcomer is placed in the UNRESERVED stage, by the score over the servers'
      unclaimed free GPUs, on its lowest such GPU: once the claimants are held those are exactly the
      free GPUs, in the same order, and the score picks the same;
    - first fit takes, server by server in cluster order, every GPU that has room for its share:
      there, every unclaimed free GPU (the first of them, in the same order once the claimants are
      held), so a wider newcomer too gets the same GPUs (packed would first look for one server
      holding it whole, where it may take claimed GPUs);
    - a claimant's strict home try, at its turn, finds its share free and asks no more than it held
      (`take_current`'s test): it goes home with the same shares;
    - newcomers behind the last running job find the same GPUs free either way, and every fit test
      (within EPS) the same answer: the cores and memory left differ at most by the rounding of the
      same shares subtracted in another order.
    Only without node counts or fixed demands among the admitted jobs, on servers giving every GPU
    the same share.
    """
    jobs, state = round_.jobs, round_.state
    share = None if state.has_node_counts else uniform_share(state)
    if share is None:
        return _NONE_HELD
    c0, m0 = share
    infeasible, admitted = round_.infeasible, round_.admitted
    running: list[int] = []
    wide_newcomer = -1  # position of the last admitted newcomer asking more than one GPU
    for pos, job in enumerate(jobs):
        if infeasible[pos] is not None or not admitted[pos]:
            continue
        if has_fixed_demand(job):
            return _NONE_HELD
        current = job.current
        if current is not None:
            for held in current.shares:  # it reserves what it held: no more than its share
                k = len(held.gpu_indices)
                if held.num_cpus > k * c0 or held.mem_gb > k * m0:
                    return _NONE_HELD
            running.append(pos)
        elif job.num_gpus != 1:
            wide_newcomer = pos
    if not running:
        return _NONE_HELD
    if wide_newcomer > -1 and wide_newcomer < running[-1] and type(score) is not FirstFit:
        return _NONE_HELD  # a wider newcomer ahead of a running job may take claimed GPUs
    free_cpus, free_mem_gb = state.free_cpus, state.free_mem_gb
    for i, n in enumerate(state.num_free):
        if n * c0 > free_cpus[i] or n * m0 > free_mem_gb[i]:
            return _NONE_HELD  # a server short of its shares: a newcomer's room is not certain
    reason = reasons.PROPORTIONAL
    if not _hold(round_, [(pos, c0, m0, 1.0, reason) for pos in running]):
        return _NONE_HELD
    return frozenset(running)


# (position, per-GPU cores, per-GPU GB, speed before the spread penalty, reason): a job to hold.
_Held = tuple[int, float, float, float, str]


def _hold(round_: RoundSetup, items: list[_Held]) -> bool:
    """Hold each job of `items`, in turn, on its current placement at its per-GPU demand
    (`take_current`) and decide it there (`RoundSetup.placed`); False, and the state as it was,
    where one is not held so. Where every one is held exactly as its Placement says (what this
    allocator gave it last round), `take_kept` takes them all in one pass, with the same float
    operations, and each keeps its own Placement: what `placed` finds for it then."""
    jobs, state = round_.jobs, round_.state
    kept: list[tuple[Placement, int, float, float]] = []
    for pos, c, m, speed, _ in items:
        job = jobs[pos]
        cur = job.current
        assert cur is not None
        if len(cur.shares) > 1:
            speed = with_penalty(speed, job.profile, len(cur.shares), job.num_gpus)
        if cur.speedup != speed or cur.job_id != job.job_id:
            break  # it gets a new Placement: every job is taken one by one below
        kept.append((cur, job.num_gpus, c, m))
    else:
        if state.take_kept(kept):
            state.rebucket()
            builder = round_.builder
            for (pos, _, _, _, reason), (cur, _, _, _) in zip(items, kept, strict=True):
                builder.kept(pos, cur, reason)
            return True
        state = _undo(round_)
    held = []
    for pos, c, m, speed, reason in items:
        job = jobs[pos]
        shares = state.take_current(job.current, job.num_gpus, c, m)  # type: ignore[arg-type]
        if shares is None:
            _undo(round_)
            return False
        held.append((pos, shares, speed, reason))
    for pos, shares, speed, reason in held:
        round_.placed(pos, shares, speed, reason)
    return True


def uniform_share(state: RoundState) -> tuple[float, float] | None:
    """The per-GPU cores and GB every server gives (its proportional share), where they all give the
    same: the holds' condition (they take one per-GPU demand for all the servers of a placement)."""
    prop_cpus, prop_mem_gb = state.prop_cpus, state.prop_mem_gb
    if not prop_cpus:
        return None
    c0, m0 = prop_cpus[0], prop_mem_gb[0]
    if any(c != c0 for c in prop_cpus) or any(m != m0 for m in prop_mem_gb):
        return None
    return c0, m0


def _undo(round_: RoundSetup) -> RoundState:
    """Forget what was held: the round starts again from a fresh state (returned)."""
    round_.state = RoundState(round_.snapshot, round_.jobs)
    return round_.state
