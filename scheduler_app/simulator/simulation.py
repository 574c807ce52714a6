"""The round-based, trace-driven simulation loop; every decision comes from core.engine.schedule_round."""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict

from profiles_app.catalog import load_catalog
from scheduler_app.core import reasons
from scheduler_app.core.allocators import ALLOCATORS, Allocator
from scheduler_app.core.engine import extend_round, schedule_round
from scheduler_app.core.move_guard import one_server_views
from scheduler_app.core.placement import gpu_admission, infeasible_reason, infeasible_reasons
from scheduler_app.core.policies import POLICIES, Policy
from scheduler_app.core.restarts import RestartPolicy
from scheduler_app.core.types import ClusterSnapshot, Decision, Outcome, RoundPlan, SensitivityProfile
from scheduler_app.simulator.cluster import ClusterSpec
from scheduler_app.simulator.metrics import ResourceTotals, SimulationResult, jct_stats
from scheduler_app.simulator.permuted import permuted_plan
from scheduler_app.simulator.restart_costs import RestartCosts
from scheduler_app.simulator.reuse import RememberingPolicy, ReusingAllocator, holds, reusable
from scheduler_app.simulator.sim_run import SimJob, SimRun, first_finish_s
from scheduler_app.simulator.trace import TraceError, TraceJob

__all__ = [
    "EVENTS",
    "MODES",
    "ROUNDS",
    "SimJob",
    "SimRun",
    "default_first_round_s",
    "resolve_run",
    "simulate",
]

logger = logging.getLogger(__name__)

ROUNDS = "rounds"  # decide on a fixed grid every round_s (Synergy, the reference simulator)
EVENTS = "events"  # decide at every arrival and completion (GENIE), and at least every round_s
MODES = (ROUNDS, EVENTS)
# Reference static traces put job i at i ms, all under 1 s, and the reference starts their first round at 1 s.
STATIC_TRACE_MAX_ARRIVAL_S = 1.0
STATIC_FIRST_ROUND_S = 1.0


def resolve_run(policy: str | Policy, allocator: str | Allocator) -> tuple[Policy, Allocator, str, str]:
    """Instances for names (UnknownNameError, listing valid names, for unknown ones) and display names."""
    policy_obj = POLICIES.get(policy)() if isinstance(policy, str) else policy
    allocator_obj = ALLOCATORS.get(allocator)() if isinstance(allocator, str) else allocator
    policy_name = policy if isinstance(policy, str) else getattr(policy, "name", type(policy).__name__)
    allocator_name = (
        allocator if isinstance(allocator, str) else getattr(allocator, "name", type(allocator).__name__)
    )
    return policy_obj, allocator_obj, policy_name, allocator_name


def default_first_round_s(arrivals_s: Sequence[float], round_s: float) -> float:
    """Where the round grid starts, as the reference does it (runner.py init_event_queue).

    A static trace (every arrival under 1 s, job i at i ms) starts at 1 s; any other trace at its first
    arrival rounded up to a multiple of `round_s`.
    """
    first = min(arrivals_s)
    if max(arrivals_s) < STATIC_TRACE_MAX_ARRIVAL_S:
        return STATIC_FIRST_ROUND_S
    return math.ceil(first / round_s) * round_s


def _load_jobs(trace: Sequence[TraceJob], profiles: Mapping[str, SensitivityProfile]) -> list[SimJob]:
    """Per-job state in arrival order (ties by id); unknown models and duplicate ids raise TraceError."""
    sim_jobs: list[SimJob] = []
    seen_ids: set[int] = set()
    for tj in sorted(trace, key=lambda j: (j.arrival_s, j.job_id)):
        if tj.job_id in seen_ids:
            raise TraceError(f"duplicate job_id {tj.job_id} in trace")
        seen_ids.add(tj.job_id)
        try:
            profile = profiles[tj.model]
        except KeyError:
            raise TraceError(
                f"job {tj.job_id}: unknown model {tj.model!r}; valid: {', '.join(sorted(profiles))}"
            ) from None
        sim_jobs.append(SimJob(tj, profile))
    return sim_jobs


def keeps_everyone(plan: RoundPlan, active: Mapping[int, SimJob]) -> bool:
    """True when `plan` (not yet applied) leaves every job as it was: each running job on the same
    placement, speed-up included, each waiting job waiting, none dropped as infeasible."""
    if len(plan.decisions) != len(active):
        return False
    for decision in plan.decisions:
        job = active.get(decision.job_id)
        if job is None or decision.outcome is Outcome.INFEASIBLE:
            return False
        placement = decision.placement
        if placement is not job.current and placement != job.current:
            return False
    return True


def _with_waiting(
    plan: RoundPlan,
    arrived: Sequence[SimJob],
    run: SimRun,
    snapshot: ClusterSnapshot,
    policy: Policy,
    now_s: float,
) -> RoundPlan | None:
    """`plan` (a steady plan of the jobs there before) with the jobs just `arrived` pending for want of
    GPUs, when that is what deciding the round again would give (else None): the policy orders them
    after every job of `plan`, GPU admission (Synergy's runnable set) leaves each of them out, and the
    allocator answers such jobs pending without changing anyone else's decision (waits_unadmitted).
    """
    ordered = policy.order(run.views(), snapshot, now_s)
    old = len(plan.decisions)
    if len(ordered) != old + len(arrived):
        return None
    for decision, job in zip(plan.decisions, ordered, strict=False):
        if decision.job_id != job.job_id:
            return None  # an arrival goes ahead of a job of the plan (or the plan is not this order)
    infeasible = infeasible_reasons(ordered, snapshot)
    admitted = gpu_admission(ordered, infeasible, snapshot.free_gpu_count, snapshot)
    if any(admitted[old:]) or any(why is not None for why in infeasible[old:]):
        return None
    waiting = tuple(Decision(job.job_id, Outcome.PENDING, reasons.INSUFFICIENT_GPUS) for job in ordered[old:])
    # Still stable: the jobs added are left out by admission, as they will be while the others stay.
    return RoundPlan(plan.decisions + waiting, plan.stable)


def _surely_admitted(
    arrived: Sequence[SimJob], active: Mapping[int, SimJob], snapshot: ClusterSnapshot
) -> bool:
    """True when GPU admission admits one of the jobs just `arrived` whatever the order, so that
    `_with_waiting` would answer None: it admits them after the others (or the order differs, also
    None), and the others, admitted or not, leave at least the free GPUs less all of theirs. Counts
    only, instead of ordering and admitting every job."""
    left = snapshot.free_gpu_count
    for job in active.values():
        left -= job.num_gpus
    for job in arrived:
        left += job.num_gpus
    for job in arrived:
        if (
            job.num_gpus <= left
            and job.num_nodes is None
            and infeasible_reason(job.job_view(), snapshot) is None
        ):
            return True
    return False


def _next_steady(plan: RoundPlan, run: SimRun, done_now: Sequence[SimJob]) -> RoundPlan | None:
    """The plan of the next round, if it is known without deciding it (can_reuse's conditions), once
    `plan` was applied: `plan` itself when it kept everyone, or is stable (RoundPlan.stable) and left
    every job active; with jobs finished, a stable plan that placed everyone, less their decisions."""
    if not done_now:
        if run.kept:
            return plan
        return plan if plan.stable and len(plan.decisions) == len(run.active) else None
    if not plan.stable or len(plan.decisions) != len(run.active) + len(done_now):
        return None
    if any(decision.placement is None for decision in plan.decisions):
        return None  # a job left waiting might now be admitted
    done_ids = {job.job_id for job in done_now}
    return RoundPlan(tuple(d for d in plan.decisions if d.job_id not in done_ids), True)


def simulate(
    trace: Sequence[TraceJob],
    cluster: ClusterSpec,
    *,
    policy: str | Policy,
    allocator: str | Allocator,
    round_s: float = 300.0,
    finish_at_round_end: bool = False,
    restart_overhead_s: float = 0.0,
    catalog: Mapping[str, SensitivityProfile] | None = None,
    first_round_s: float | None = None,
    measured_job_ids: tuple[int, int] | None = None,
    stop_when_measured: bool = False,
    max_time_s: float | None = None,
    progress: Callable[[float], None] | None = None,
    mode: str = ROUNDS,
    restarts: RestartPolicy | None = None,
    restart_costs: RestartCosts | None = None,
) -> SimulationResult:
    """Replay `trace` on `cluster` in rounds of `round_s` seconds and measure what happens.

    `mode="events"` (GENIE's event-driven scheduling) decides again at every arrival and every
    completion, and at the latest `round_s` after the last decision (a lease's renewal), instead of on
    the fixed round grid; the first decision is at the first arrival. Not combinable with
    `finish_at_round_end`.

    Each round starts at `first_round_s + k x round_s` (default: default_first_round_s). Jobs that have
    arrived by then and are unfinished are handed to schedule_round with an all-free snapshot; a job
    placed on the same resources as last round continues its lease, one placed elsewhere (or resumed
    after a pause) restarts. A placed job runs at `speedup / iter_time_s` iterations per second.

    Restarts (docs/restarts.md): `restart_costs` (RestartCosts) charges what they cost: every start,
    the first one too, makes no progress for the job's start-up, and a restart rolls the job back to
    its last checkpoint (the run since is lost and done again). None charges nothing (the papers);
    `restart_overhead_s` is the older start-up-only charge: a restart (not a first start) makes no
    progress for that long and loses nothing (not combinable with `restart_costs`). `restarts`
    (RestartPolicy) is passed to schedule_round: running jobs move only when it pays, within the
    minimum run time not at all; a change of cores or memory on the same GPUs is then free where
    `restarts.resize_in_place` (without `restarts`, any change of resources is a restart). Each job
    gets its costs in its JobView (startup_s, checkpoint_every_s, lease_started_s on the sim clock),
    and its record counts preemptions, moves and the GPU-seconds its restarts lost.

    - `finish_at_round_end=False` (default): a job finishes at the exact moment its last iteration
      ends; its resources stay idle until the next round. Progress is fractional.
    - `finish_at_round_end=True`: the reference simulator's convention: progress per round is
      floor(run time / effective iteration time) whole iterations and a job finishes at the end of the
      round in which it reaches its total.
    When no job is runnable the clock jumps to the first round at or after the next arrival.
    JCT statistics cover the jobs with ids in [lo, hi) of `measured_job_ids` (all jobs when None);
    `stop_when_measured` ends the run once they have all finished (the reference's steady-state
    measurement). `max_time_s` stops the clock there. `progress(fraction_finished)` is called as
    jobs finish. Unknown policy/allocator names raise UnknownNameError; unknown models TraceError.
    """
    wall_start = time.perf_counter()
    if not round_s > 0:
        raise ValueError(f"round_s must be positive, got {round_s}")
    if not restart_overhead_s >= 0:
        raise ValueError(f"restart_overhead_s must be >= 0, got {restart_overhead_s}")
    if restart_overhead_s and restart_costs is not None:
        raise ValueError("pass restart_costs or restart_overhead_s, not both")
    if mode not in MODES:
        raise ValueError(f"mode must be one of {', '.join(MODES)}, got {mode!r}")
    if mode == EVENTS and finish_at_round_end:
        raise ValueError("finish_at_round_end applies to the round mode only")
    events = mode == EVENTS
    if not trace:
        raise ValueError("empty trace")
    if measured_job_ids is not None and measured_job_ids[0] >= measured_job_ids[1]:
        raise ValueError(f"measured_job_ids must be a non-empty [lo, hi) range, got {measured_job_ids}")
    policy_obj, allocator_obj, policy_name, allocator_name = resolve_run(policy, allocator)
    sim_jobs = _load_jobs(trace, load_catalog() if catalog is None else catalog)
    for job in sim_jobs:
        if restart_costs is not None:
            job.set_costs(
                restart_costs.startup_of(job.model),
                restart_costs.checkpoint_every_s,
                charges_work=True,
                first_start_waits=restart_costs.first_start_waits,
            )
        elif restart_overhead_s:
            job.set_costs(restart_overhead_s, None, charges_work=False, first_start_waits=False)
    if measured_job_ids is None:
        measured = list(sim_jobs)
    else:
        measured = [j for j in sim_jobs if measured_job_ids[0] <= j.job_id < measured_job_ids[1]]
    measured_ids = {j.job_id for j in measured}
    measured_left = len(measured)
    if first_round_s is None and events:
        t0 = sim_jobs[0].arrival_s
    elif first_round_s is None:
        t0 = default_first_round_s([j.arrival_s for j in sim_jobs], round_s)
    else:
        t0 = float(first_round_s)

    snapshot = cluster.snapshot()  # immutable: shared by every round
    if restarts is not None and restarts.one_server:
        # What the engine does to every round's views, done once: jobs that fit on one server ask for
        # one (the engine then leaves them as they are), and the order that reuse.py checks is the
        # order of the views the engine decides.
        views = one_server_views([j.job_view() for j in sim_jobs], snapshot)
        for job, view in zip(sim_jobs, views, strict=True):
            job.num_nodes = view.num_nodes
            job.view = None
    in_place = restarts is not None and restarts.resize_in_place
    # Under a static order (FIFO) and an allocator blind to progress and the clock, with no restart
    # guard (which reads lease ages and the clock), a round's plan depends only on which jobs are
    # active and where each ran (see can_reuse below).
    can_reuse = policy_obj.static_order and not allocator_obj.reads_progress and restarts is None
    # Otherwise (an order by progress or the clock, an allocator that may read them, the guard) a plan
    # that kept everyone is reused round by round while reuse.py's conditions hold, checked each round,
    # and an allocation equal to one decided before is answered from memory (reuse.py).
    recheck = not can_reuse
    if recheck and not policy_obj.static_order:
        # holds() orders a round's views; when the steady plan no longer holds, schedule_round orders
        # the same views again at the same time: answered from that first order.
        policy_obj = RememberingPolicy(policy_obj)
    # Without the guard an allocation repeats only in a round that is reused whole: nothing to remember.
    allocator_obj = ReusingAllocator(allocator_obj, remember=restarts is not None)
    reuse_key: object = None  # the steady plan's progress key (recheck)
    run = SimRun(round_s=round_s, round_end=finish_at_round_end, in_place=in_place, progress_blind=can_reuse)
    active = run.active
    num_jobs = len(sim_jobs)
    next_idx = 0  # next job of sim_jobs (sorted by arrival) to admit
    finished = rounds = k = 0
    last_reported = -1
    stopped_early = False

    # When plans depend only on which jobs are active and where each ran (can_reuse), once a plan keeps
    # every job where it was and no job arrives, finishes or is dropped, the next round's inputs are
    # the same and so is its plan (engine.schedule_round is pure), so it is reused instead of decided
    # again. Exact: every round is still applied one by one.
    steady_plan: RoundPlan | None = None
    waits_unadmitted = can_reuse and allocator_obj.waits_unadmitted
    decided = 0  # rounds decided by schedule_round (the others reused a steady plan)
    extended = 0  # of the others, rounds whose plan the allocator extended with arrivals

    def next_round_after_arrival() -> int:
        # The first round boundary at or after the next arrival (never the current round again).
        return max(k + 1, math.ceil((sim_jobs[next_idx].arrival_s - t0) / round_s))

    event_now_s = t0
    while True:
        now_s = event_now_s if events else t0 + k * round_s
        if max_time_s is not None and now_s > max_time_s:
            stopped_early = True
            logger.warning("stopped at max_time_s=%s with %d jobs unfinished", max_time_s, len(active))
            break
        first_new = next_idx
        while next_idx < num_jobs and sim_jobs[next_idx].arrival_s <= now_s:
            job = sim_jobs[next_idx]
            active[job.job_id] = job
            next_idx += 1
        if next_idx > first_new and steady_plan is not None:
            # Arrivals that only queue behind a full cluster leave the others' plan as it was.
            arrived = sim_jobs[first_new:next_idx]
            previous_plan = steady_plan
            steady_plan = (
                _with_waiting(steady_plan, arrived, run, snapshot, policy_obj, now_s)
                if waits_unadmitted and not _surely_admitted(arrived, active, snapshot)
                else None
            )
            if steady_plan is None and can_reuse and previous_plan.stable:
                # Arrivals placed behind a stable plan's jobs, the plan's own decisions kept, where
                # the allocator can tell that this is the round's plan (Allocator.extend).
                steady_plan = extend_round(
                    snapshot,
                    run.views(),
                    previous_plan,
                    policy=policy_obj,
                    allocator=allocator_obj,
                    now_s=now_s,
                )
                extended += steady_plan is not None
        if not active:
            if next_idx >= num_jobs:
                break
            if events:
                event_now_s = sim_jobs[next_idx].arrival_s
            else:
                k = next_round_after_arrival()  # idle cluster
            continue

        if steady_plan is not None and recheck:
            views_now = run.views()
            if not holds(steady_plan, reuse_key, views_now, policy_obj, allocator_obj, snapshot, now_s):
                # The order or a QoS need changed: decided again, unless only the order among the
                # running jobs of a stable proportional plan did (permuted.py).
                steady_plan = permuted_plan(
                    steady_plan, reuse_key, views_now, policy_obj, allocator_obj, snapshot, now_s, restarts
                )
        if steady_plan is not None:
            plan = steady_plan  # applied to the state it left: it keeps everyone again
            steady = True
        else:
            views = run.views()
            allocator_obj.begin_round()
            plan = schedule_round(
                snapshot,
                views,
                policy=policy_obj,
                allocator=allocator_obj,
                now_s=now_s,
                restarts=restarts,
            )
            decided += 1
            # And the plan keeps everyone: run.kept, once applied.
            steady = can_reuse
            if recheck:
                reuse_key = reusable(plan, allocator_obj, restarts)
                steady = reuse_key is not None
        rounds += 1
        interval_s = None
        if events:
            next_arrival_s = sim_jobs[next_idx].arrival_s if next_idx < num_jobs else math.inf
            first_s = first_finish_s(plan, active, now_s, in_place)
            interval_s = min(next_arrival_s, first_s, now_s + round_s) - now_s
            event_now_s = now_s + interval_s
        placed, done_now = run.apply(plan, now_s, interval_s)
        if can_reuse:
            steady_plan = _next_steady(plan, run, done_now)
        else:
            steady_plan = plan if steady and run.kept and not done_now else None
            if steady_plan is None and steady and reuse_key == () and restarts is None and plan.stable:
                # A stable plan (the allocator's word; one blind to progress) repeats for the same
                # jobs in the same order, and less the finished ones where it placed every job, as
                # above: `holds` then checks the order each round.
                steady_plan = _next_steady(plan, run, done_now)
        finished += len(done_now)
        measured_left -= sum(1 for job in done_now if job.job_id in measured_ids)
        if progress is not None and done_now and (100 * finished) // num_jobs != last_reported:
            last_reported = (100 * finished) // num_jobs
            progress(finished / num_jobs)
        if stop_when_measured and measured_left == 0:
            stopped_early = next_idx < num_jobs or bool(active)
            break
        if placed:
            k += 1
        elif next_idx < num_jobs:
            # Nothing placed on an all-free cluster: no input changes until the next arrival.
            k = next_round_after_arrival()
            event_now_s = sim_jobs[next_idx].arrival_s
        else:
            stopped_early = True
            logger.warning("no job can be placed and none will arrive; %d jobs left unfinished", len(active))
            break

    wall_s = time.perf_counter() - wall_start
    logger.debug(
        "%d of %d rounds decided, the others reused a steady plan (%d extended with arrivals); "
        "%d allocations made",
        decided,
        rounds,
        extended,
        allocator_obj.decided,
    )
    finish_times = [j.finish_s for j in sim_jobs if j.finish_s is not None]
    makespan_s = max(finish_times) - min(j.arrival_s for j in sim_jobs[:next_idx]) if finish_times else 0.0
    result = SimulationResult(
        policy=policy_name,
        allocator=allocator_name,
        round_s=float(round_s),
        finish_at_round_end=finish_at_round_end,
        restart_overhead_s=float(restart_overhead_s),
        total_gpus=cluster.total_gpus,
        total_cpus=cluster.total_cpus,
        total_mem_gb=cluster.total_mem_gb,
        jobs=num_jobs,
        finished_jobs=finished,
        measured_job_ids=measured_job_ids,
        jct=jct_stats([j.finish_s - j.arrival_s for j in measured if j.finish_s is not None]),
        makespan_s=makespan_s,
        totals=ResourceTotals(*run.totals),
        rounds=rounds,
        wall_s=wall_s,
        records=[job.record() for job in sorted(sim_jobs, key=lambda j: j.job_id)],
        utilisation=run.series,
        stopped_early=stopped_early,
        infeasible_jobs=run.infeasible,
        restart_costs=None if restart_costs is None else restart_costs.to_dict(),
        restart_policy=None if restarts is None else asdict(restarts),
    )
    logger.info(
        "simulated %d jobs (%s+%s) in %d rounds, %.2f s: avg JCT %.2f h, makespan %.2f h",
        num_jobs,
        policy_name,
        allocator_name,
        rounds,
        wall_s,
        result.avg_jct_h,
        result.makespan_h,
    )
    return result
