"""Keep running jobs where they run unless a change pays for its restarts (docs/restarts.md).

The allocators re-decide every job each round. This guard wraps that decision: it runs it once as
is; if the plan restarts no running job (moves, preemptions, resizes that cannot be made live) that
plan stands, which is the common steady-state case and costs nothing more. Otherwise it also decides
with running jobs pinned where they are (their GPUs, cores and memory taken out of the snapshot) and
keeps the plan that restarts jobs only when its gain over the horizon is at least (1 + margin) times
the restart costs it causes (core/restarts.py `plan_value`). Restarts that gain their own jobs nothing
(a repacking to the same speed, a preemption) are weighed apart: the plan decided with those jobs kept
too competes, and the best of the three plans wins. A job within the minimum run time is pinned in
all. What must not wait overrides the guard:
- a job whose placement is gone (its server lost or drained) is never pinned;
- a job over its team's quota (a borrower) is never pinned, so the quota's owner gets its GPUs back;
- a job with a deadline that would be missed by waiting out the minimum run time (its slack is less
  than that) gets the unguarded plan, if that plan starts it;
- so does a job the policy says must not wait (`must_not_wait`: SWAF's aged jobs, policies/aging.py):
  pinned jobs finishing one by one would otherwise let the smaller jobs after it take every GPU
  freed, and its wait would have no bound.
A cancel ends a job outside any round. Pure, like the rest of the core.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import fields, replace
from operator import attrgetter

from scheduler_app.core import reasons
from scheduler_app.core.guard_trace import GuardTrace
from scheduler_app.core.restarts import Change, PlanValuer, RestartPolicy, change_of, is_restart, resizes_live
from scheduler_app.core.throughput import relative_speed, shape_of
from scheduler_app.core.types import (
    ClusterSnapshot,
    Decision,
    JobView,
    Outcome,
    Placement,
    RoundPlan,
    ServerShare,
    ServerView,
)

# Decide a round for `jobs` (policy order) on `snapshot`, with `team_used_gpus` GPUs of each team's
# quota already held by pinned jobs.
Decide = Callable[[Sequence[JobView], ClusterSnapshot, Mapping[int, int]], RoundPlan]


# JobView's fields in __init__'s order, to copy a view with one field changed: `dataclasses.replace`
# builds a keyword per field and checks each, 13 us a view, 80 ms of a round's core at 6,000 jobs
# (bench.round_cost); the same __init__ over the fields' tuple, read at once, a third of that.
_JOB_VIEW_FIELDS = attrgetter(*(f.name for f in fields(JobView)))
_NUM_NODES_AT = [f.name for f in fields(JobView)].index("num_nodes")
_CURRENT_AT = [f.name for f in fields(JobView)].index("current")
assert all(f.init and not f.kw_only for f in fields(JobView)), "one_server_views passes them by position"


def one_server_views(jobs: Sequence[JobView], snapshot: ClusterSnapshot) -> list[JobView]:
    """Jobs that fit on one server and did not ask for a node count, asked for exactly one server.

    "Fit" is against the largest server's GPUs: a job bigger than every server still spreads (and
    then pays GENIE's cross-server cost). Jobs with GPU choices keep their choices, on one server.
    """
    largest = max((s.num_gpus for s in snapshot.servers), default=0)
    views = []
    for job in jobs:
        choices = job.gpu_choices
        if job.num_nodes is None and job.num_gpus <= largest and (not choices or max(choices) <= largest):
            values = list(_JOB_VIEW_FIELDS(job))
            values[_NUM_NODES_AT] = 1
            job = JobView(*values)  # replace(job, num_nodes=1), faster
        views.append(job)
    return views


def guarded_plan(
    decide: Decide,
    ordered: Sequence[JobView],
    snapshot: ClusterSnapshot,
    now_s: float,
    policy: RestartPolicy,
    *,
    never_pinned: frozenset[int] | set[int] = frozenset(),
    must_not_wait: frozenset[int] = frozenset(),
    trace: GuardTrace | None = None,
) -> RoundPlan:
    """The round's plan with running jobs kept in place unless moving them pays (module docstring).

    `never_pinned`: jobs that must give their resources up if the plan says so (borrowers over quota).
    `must_not_wait`: pending jobs started as soon as the unguarded plan starts them (aged jobs).
    Where resizes are free, the allocator sees each running job as holding its GPUs at no more than
    their proportional cores and memory: its stickiness then keeps GPUs, not surplus cores, so a
    newcomer packs onto a server whose GPUs are free but whose cores a young 1-GPU job was given
    (tune gives such a job up to a whole server's), instead of taking a server of its own.
    `trace`: filled with what the guard decided from the lease ages, the plan values and the jobs
    that must not wait, when it pinned or weighed anything (core/guard_replay.py: a later round
    with the same inputs but for progress and the clock replays those steps alone).
    """
    # Each running job's proportional floor, worked out once for the round's every decision.
    floors: dict[int, Placement | None] = {}
    if policy.resize_in_place:
        servers = {s.server_id: s for s in snapshot.servers}
        views = {
            j.job_id: _floor_view(j, servers, floors) if resizes_live(j.current, policy) else j
            for j in ordered
        }
        raw_decide = decide

        def decide(jobs: Sequence[JobView], snap: ClusterSnapshot, used: Mapping[int, int]) -> RoundPlan:
            return raw_decide([views[j.job_id] for j in jobs], snap, used)

    free_plan = decide(ordered, snapshot, {})
    free = free_plan.placements()
    running = _pinnable(
        [j for j in ordered if j.current is not None and j.job_id not in never_pinned], snapshot
    )
    changed = [j for j in running if is_restart(change_of(j.current, free.get(j.job_id)), policy, j.current)]
    if not changed:
        return free_plan
    young = [
        j for j in running if j.lease_started_s is not None and now_s - j.lease_started_s < policy.min_run_s
    ]
    young_ids = {j.job_id for j in young}
    free_decisions = {d.job_id: d for d in free_plan.decisions}
    if any(j.job_id in young_ids for j in changed):
        plan = _pinned_plan(decide, ordered, snapshot, young, free_decisions, young_ids, policy, floors)
    else:
        plan = free_plan
    unweighed = plan
    restarted = _restarted(plan, running, young_ids, policy)
    kept: RoundPlan | None = None
    candidates: list[RoundPlan] = []
    if restarted:
        kept = _pinned_plan(decide, ordered, snapshot, running, free_decisions, young_ids, policy, floors)
        candidates = [plan]
        # The moving plan's restarts that gain their own jobs nothing (the same speed or less elsewhere,
        # or a preemption) pay only if they make room that others use: the same plan decided with
        # those jobs kept where they are is weighed too, and the better of the two wins.
        placements = plan.placements()
        selfless = [j for j in restarted if not _gains(j, placements.get(j.job_id))]
        if selfless:
            stay = young_ids | {j.job_id for j in selfless}
            pinned = [j for j in running if j.job_id in stay]  # policy order, as _pinned_plan wants
            candidates.append(
                _pinned_plan(decide, ordered, snapshot, pinned, free_decisions, young_ids, policy, floors)
            )
        plan = weighed_best(kept, candidates, ordered, now_s, policy, snapshot)
    urgent = urgent_jobs(plan, free_plan, ordered, now_s, policy, must_not_wait)
    if trace is not None:
        trace.record(running, young_ids, free_plan, unweighed, kept, candidates, plan, urgent)
    if not urgent:
        if trace is not None:
            trace.result = plan
        return plan
    # What cannot wait gets its resources, and only those: the running jobs that hold none of the GPUs
    # the unguarded plan gives the urgent jobs stay pinned (none of them restarts for nothing); the
    # whole unguarded plan only where that does not start every urgent job.
    needed = {g for job_id in urgent for g in _gpu_keys(free[job_id])}
    stay = [j for j in running if not needed & set(_gpu_keys(j.current))]
    narrow = _pinned_plan(decide, ordered, snapshot, stay, free_decisions, young_ids, policy, floors)
    result = narrow if urgent <= narrow.placements().keys() else free_plan
    if trace is not None:
        trace.result = result
    return result


def guarded_replay(
    trace: GuardTrace,
    ordered: Sequence[JobView],
    snapshot: ClusterSnapshot,
    now_s: float,
    policy: RestartPolicy,
    must_not_wait: Callable[[frozenset[int]], frozenset[int]],
) -> RoundPlan | None:
    """`guarded_plan`'s plan for a round whose inputs are the traced round's but for progress and the
    clock (the same order, jobs, placements and snapshot, and allocations that give the same plans:
    simulator/reuse.py), redoing only what it reads of them (core/guard_trace.py): the same lease
    ages under the minimum run time, the weighing of the traced plans on `ordered`'s progress at
    `now_s`, and the jobs that cannot wait. None where one of them would take the guard down another
    path (other young jobs; jobs that cannot wait other than those traced): decide the round then.
    `must_not_wait(ids)`: the policy's answer for those of the jobs (Policy.must_not_wait: whether
    each job has waited long enough, a property of the job and the clock), asked only for the jobs
    that could be urgent."""
    assert trace.recorded and trace.free_plan is not None and trace.unweighed is not None
    by_id = {j.job_id: j for j in ordered}
    min_run_s = policy.min_run_s
    for job_id in trace.running_ids:
        started = by_id[job_id].lease_started_s
        young = started is not None and now_s - started < min_run_s
        if young != (job_id in trace.young_ids):
            return None
    plan = trace.unweighed
    if trace.kept is not None:
        plan = weighed_best(trace.kept, trace.candidates, ordered, now_s, policy, snapshot)
    if plan is trace.free_plan or not trace.left_out(plan, ordered):
        return plan  # no pending job the allocator starts that this plan leaves waiting: none urgent
    left_out = trace.left_out(plan, ordered)
    urgent = urgent_jobs(plan, trace.free_plan, ordered, now_s, policy, must_not_wait(left_out))
    if not urgent:
        return plan
    if plan is trace.chosen and urgent == trace.urgent:
        return trace.result
    return None


def weighed_best(
    kept: RoundPlan,
    candidates: Sequence[RoundPlan],
    ordered: Sequence[JobView],
    now_s: float,
    policy: RestartPolicy,
    snapshot: ClusterSnapshot,
) -> RoundPlan:
    """Of `kept` (every running job past its minimum run time kept) and the `candidates` that restart
    some, the one worth most net of (1 + margin) times its restart costs: kept unless one pays."""
    valuer = PlanValuer(ordered, now_s, policy, snapshot)
    kept_value = valuer.value(kept.placements())
    best, best_advantage = kept, 0.0
    for candidate in candidates:
        advantage = _advantage(candidate, kept_value, valuer, policy)
        if advantage > best_advantage:
            best, best_advantage = candidate, advantage
    return best


def _restarted(
    plan: RoundPlan, running: Sequence[JobView], young_ids: set[int], policy: RestartPolicy
) -> list[JobView]:
    """The running jobs past their minimum run time that `plan` restarts (moves, preempts or resizes
    where that cannot be done live)."""
    placements = plan.placements()
    return [
        j
        for j in running
        if j.job_id not in young_ids
        and is_restart(change_of(j.current, placements.get(j.job_id)), policy, j.current)
    ]


def _gains(job: JobView, placement: Placement | None) -> bool:
    """Whether `placement` runs the job faster than it runs now (a move or resize for its own sake)."""
    assert job.current is not None
    return placement is not None and placement.speedup > job.current.speedup * (1.0 + 1e-9)


def _advantage(plan: RoundPlan, kept_value: float, valuer: PlanValuer, policy: RestartPolicy) -> float:
    """How much more `plan` is worth than keeping every running job, beyond (1 + margin) times the
    restart costs it causes: it is made only when this is positive (gain > (1 + margin) x cost)."""
    moving, charged = valuer.pair(plan.placements())
    cost = moving - charged
    return (moving - kept_value) - (1.0 + policy.margin) * cost


def _pinned_plan(
    decide: Decide,
    ordered: Sequence[JobView],
    snapshot: ClusterSnapshot,
    pinned: Sequence[JobView],
    free_decisions: Mapping[int, Decision],
    young_ids: set[int],
    policy: RestartPolicy,
    floor_memo: dict[int, Placement | None] | None = None,
) -> RoundPlan:
    """Decide the others around `pinned`, which keep their GPUs.

    Where resizes are free, a pinned job holds only its GPU-proportional cores and memory (never
    more than it has) while the others are decided, then takes back what they left of its surplus:
    a young job's extra cores must not keep a newcomer off its server (tune gives a 1-GPU job a whole
    server's cores; pinning them would push every later job to other servers and fragment them).
    """
    pinned_ids = {j.job_id for j in pinned}
    team_used: dict[int, int] = {}
    for job in pinned:
        if job.team_id is not None:
            team_used[job.team_id] = team_used.get(job.team_id, 0) + job.num_gpus
    servers = {s.server_id: s for s in snapshot.servers}
    memo = {} if floor_memo is None else floor_memo  # job id -> floor (of the same snapshot, views)
    floors = {
        j.job_id: _memo_floor(j, servers, memo) if resizes_live(j.current, policy) else j.current
        for j in pinned
    }
    reduced = _without(snapshot, [p for p in floors.values() if p is not None])
    rest = decide([j for j in ordered if j.job_id not in pinned_ids], reduced, team_used)
    left = _without(reduced, list(rest.placements().values()))
    cpus_left = {s.server_id: s.free_cpus for s in left.servers}
    mem_left = {s.server_id: s.free_mem_gb for s in left.servers}
    by_id = {d.job_id: d for d in rest.decisions}
    for job in pinned:  # policy order: the first pinned job takes its cores back first
        assert job.current is not None
        free = free_decisions.get(job.job_id)
        # It grows back towards the allocator's own choice when that kept its GPUs (a resize, free in
        # place), else towards what it has.
        target = job.current
        if (
            resizes_live(job.current, policy)
            and free is not None
            and change_of(job.current, free.placement) in (Change.KEPT, Change.RESIZED)
        ):
            assert free.placement is not None
            target = free.placement
        floor = floors[job.job_id]
        assert floor is not None
        regrown = _regrow(job, floor, target, servers, cpus_left, mem_left)
        if free is not None and regrown == free.placement:
            by_id[job.job_id] = free  # what the allocator chose for it anyway: its own reason stands
        else:
            why = reasons.MIN_RUN_TIME if job.job_id in young_ids else reasons.RESTART_COST
            by_id[job.job_id] = Decision(job.job_id, Outcome.PLACED, why, regrown)
    return RoundPlan(tuple(by_id[j.job_id] for j in ordered))


def _floor_view(
    job: JobView, servers: Mapping[int, ServerView], memo: dict[int, Placement | None]
) -> JobView:
    """The job as the allocator sees it where resizes are free: holding its `_proportional_floor`
    (the view itself when that is what it holds, or it does not run)."""
    if job.current is None:
        return job
    floor = _memo_floor(job, servers, memo)
    if floor is job.current:
        return job
    values = list(_JOB_VIEW_FIELDS(job))
    values[_CURRENT_AT] = floor
    return JobView(*values)  # replace(job, current=floor), faster (every running job of most rounds)


def _memo_floor(
    job: JobView, servers: Mapping[int, ServerView], memo: dict[int, Placement | None]
) -> Placement | None:
    """`_proportional_floor`, once per job of one round (`memo`: job id -> floor)."""
    if job.job_id in memo:
        return memo[job.job_id]
    floor = memo[job.job_id] = _proportional_floor(job, servers)
    return floor


def _proportional_floor(job: JobView, servers: Mapping[int, ServerView]) -> Placement | None:
    """`job.current` with each share's cores and memory cut to the GPU-proportional share of its
    server (never raised); a job with a fixed demand keeps what it has."""
    current = job.current
    if current is None or job.cpus_per_gpu_override is not None or job.mem_gb_per_gpu_override is not None:
        return current
    if any(share.server_id not in servers for share in current.shares):
        return current  # its server is gone: the allocator ignores the stale placement anyway
    shares = []
    cut = False
    for share in current.shares:
        server = servers[share.server_id]
        n = len(share.gpu_indices)
        prop_cpus = int(server.num_cpus / server.num_gpus * n + 1e-9)
        prop_mem_gb = server.mem_gb / server.num_gpus * n
        if prop_cpus < share.num_cpus or prop_mem_gb < share.mem_gb:
            cut = True
            share = ServerShare(
                share.server_id,
                share.gpu_indices,
                min(share.num_cpus, prop_cpus),
                min(share.mem_gb, prop_mem_gb),
            )
        shares.append(share)
    # Nothing above proportional (most running jobs of a busy cluster): the placement itself, as is.
    return Placement(current.job_id, tuple(shares), current.speedup) if cut else current


def _regrow(
    job: JobView,
    floor: Placement,
    target: Placement,
    servers: Mapping[int, ServerView],
    cpus_left: dict[int, int],
    mem_left: dict[int, float],
) -> Placement:
    """`floor` grown towards `target` (the same GPUs) as far as its servers have cores and memory left,
    with the speed-up that follows (relative to the target's); `target` itself when all of it fits."""
    if floor.shares == target.shares:
        return target
    shares = []
    ratio = 1.0
    for low, want in zip(floor.shares, target.shares, strict=True):
        sid = want.server_id
        cpus = low.num_cpus + min(want.num_cpus - low.num_cpus, max(0, cpus_left[sid]))
        mem_gb = low.mem_gb + min(want.mem_gb - low.mem_gb, max(0.0, mem_left[sid]))
        cpus_left[sid] -= cpus - low.num_cpus
        mem_left[sid] -= mem_gb - low.mem_gb
        shares.append(replace(want, num_cpus=cpus, mem_gb=mem_gb))
        if (cpus, mem_gb) != (want.num_cpus, want.mem_gb):
            n = len(want.gpu_indices)
            shape = shape_of(servers[sid])
            aimed = relative_speed(job.profile, job.num_gpus, shape, want.num_cpus / n, want.mem_gb / n)
            becomes = relative_speed(job.profile, job.num_gpus, shape, cpus / n, mem_gb / n)
            if aimed > 0:
                ratio = min(ratio, becomes / aimed)  # data-parallel: the slowest part sets the pace
    if tuple(shares) == target.shares:
        return target
    return Placement(target.job_id, tuple(shares), target.speedup * min(1.0, ratio))


def urgent_jobs(
    plan: RoundPlan,
    free_plan: RoundPlan,
    ordered: Sequence[JobView],
    now_s: float,
    policy: RestartPolicy,
    must_not_wait: frozenset[int],
) -> set[int]:
    """The pending jobs with a deadline that cannot wait out the minimum run time (their slack is
    less), or that the policy says must not wait, which the unguarded plan starts and the guarded
    one does not."""
    if plan is free_plan:
        return set()
    placed, free = plan.placements(), free_plan.placements()
    urgent = set()
    for job in ordered:
        if job.current is not None or job.job_id in placed or job.job_id not in free:
            continue
        if job.job_id in must_not_wait:
            urgent.add(job.job_id)
            continue
        if job.deadline_s is None:
            continue
        need_s = job.remaining_iters * job.profile.iter_time_s + job.startup_s
        if job.deadline_s - now_s - need_s < policy.min_run_s:
            urgent.add(job.job_id)
    return urgent


def _gpu_keys(placement: Placement | None) -> list[tuple[int, int]]:
    """(server id, GPU index) of every GPU `placement` holds."""
    if placement is None:
        return []
    return [(share.server_id, g) for share in placement.shares for g in share.gpu_indices]


def _pinnable(running: Sequence[JobView], snapshot: ClusterSnapshot) -> list[JobView]:
    """The running jobs whose current placement still exists in `snapshot`, in order, each fitting
    beside those before it (a server lost or drained, or shrunk, frees its jobs to move)."""
    servers = {s.server_id: s for s in snapshot.servers}
    gpus_left = {s.server_id: set(s.free_gpus) for s in snapshot.servers}
    cpus_left = {s.server_id: s.free_cpus for s in snapshot.servers}
    mem_left = {s.server_id: s.free_mem_gb for s in snapshot.servers}
    kept = []
    for job in running:
        assert job.current is not None
        shares = job.current.shares
        if job.current.num_gpus not in (job.num_gpus, *job.gpu_choices):
            continue  # not a placement this job can keep (a stale view): decided afresh
        if all(
            share.server_id in servers
            and gpus_left[share.server_id].issuperset(share.gpu_indices)
            and cpus_left[share.server_id] >= share.num_cpus
            and mem_left[share.server_id] >= share.mem_gb - 1e-9
            for share in shares
        ):
            for share in shares:
                gpus_left[share.server_id].difference_update(share.gpu_indices)
                cpus_left[share.server_id] -= share.num_cpus
                mem_left[share.server_id] -= share.mem_gb
            kept.append(job)
    return kept


def _without(snapshot: ClusterSnapshot, placements: Sequence[Placement]) -> ClusterSnapshot:
    """`snapshot` less the GPUs, cores and memory that `placements` hold."""
    gpus: dict[int, set[int]] = {}
    cpus: dict[int, int] = {}
    mem: dict[int, float] = {}
    for placement in placements:
        for share in placement.shares:
            gpus.setdefault(share.server_id, set()).update(share.gpu_indices)
            cpus[share.server_id] = cpus.get(share.server_id, 0) + share.num_cpus
            mem[share.server_id] = mem.get(share.server_id, 0.0) + share.mem_gb
    servers: list[ServerView] = []
    for server in snapshot.servers:
        sid = server.server_id
        if sid not in gpus:
            servers.append(server)
            continue
        servers.append(
            replace(
                server,
                free_gpus=tuple(g for g in server.free_gpus if g not in gpus[sid]),
                free_cpus=server.free_cpus - cpus[sid],
                free_mem_gb=max(0.0, server.free_mem_gb - mem[sid]),
            )
        )
    return ClusterSnapshot(tuple(servers))
