"""The round-based, trace-driven simulation loop; every decision comes from core.engine.schedule_round."""

from __future__ import annotations

import logging
import math
import time
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence

from profiles_app.catalog import load_catalog
from scheduler_app.core.allocators import ALLOCATORS, Allocator
from scheduler_app.core.engine import schedule_round
from scheduler_app.core.policies import POLICIES, Policy
from scheduler_app.core.throughput import job_profile
from scheduler_app.core.types import JobView, Outcome, Placement, RoundPlan, SensitivityProfile
from scheduler_app.simulator.cluster import ClusterSpec
from scheduler_app.simulator.metrics import (
    JobRecord,
    ResourceTotals,
    SimulationResult,
    UtilisationSeries,
    jct_stats,
)
from scheduler_app.simulator.trace import TraceError, TraceJob

logger = logging.getLogger(__name__)

ROUNDS = "rounds"  # decide on a fixed grid every round_s (Synergy, the reference simulator)
EVENTS = "events"  # decide at every arrival and completion (GENIE), and at least every round_s
MODES = (ROUNDS, EVENTS)
# Reference static traces put job i at i ms, all under 1 s, and the reference starts their first round at 1 s.
STATIC_TRACE_MAX_ARRIVAL_S = 1.0
STATIC_FIRST_ROUND_S = 1.0
# Relative slack when deciding that a job finishes inside a round (exact mode), against float residue
# such as 1e-12 iterations left over, which would otherwise cost a whole extra round.
_FINISH_REL_TOL = 1e-9


class SimJob:
    """Mutable per-job state; `view` caches the JobView until the job's state changes."""

    __slots__ = (
        "arrival_s",
        "attained_gpu_s",
        "cpus_per_gpu_override",
        "current",
        "deadline_s",
        "done_iters",
        "finish_s",
        "gpu_choices",
        "has_run",
        "iter_time_s",
        "job_id",
        "mem_gb_per_gpu_override",
        "min_rate_iters_per_s",
        "model",
        "num_gpus",
        "num_nodes",
        "owner_base_usage_gpu_s",
        "owner_id",
        "preemptions",
        "priority",
        "profile",
        "resources",
        "start_s",
        "team_id",
        "total_iters",
        "view",
    )

    def __init__(self, trace_job: TraceJob, profile: SensitivityProfile) -> None:
        self.job_id = trace_job.job_id
        self.model = trace_job.model
        self.num_gpus = trace_job.num_gpus
        self.num_nodes = trace_job.num_nodes
        self.arrival_s = float(trace_job.arrival_s)
        self.total_iters = float(trace_job.total_iters)
        self.deadline_s = None if trace_job.deadline_s is None else float(trace_job.deadline_s)
        self.min_rate_iters_per_s = trace_job.min_rate_iters_per_s
        self.gpu_choices = trace_job.gpu_choices
        # The workload's profile for this GPU count (a GENIE fit times k GPUs apart from 1), as the
        # live service's JobView holds it.
        self.profile = profile = job_profile(profile, trace_job.num_gpus)
        self.iter_time_s = profile.iter_time_s
        self.done_iters = 0.0
        self.attained_gpu_s = 0.0
        self.current: Placement | None = None
        self.view: JobView | None = None
        self.resources: tuple[int, float, float, float, float] | None = None  # of `current`
        self.start_s: float | None = None
        self.finish_s: float | None = None
        self.has_run = False
        self.preemptions = 0
        self.cpus_per_gpu_override: float | None = None
        self.mem_gb_per_gpu_override: float | None = None
        self.priority = 0
        self.team_id: int | None = None
        self.owner_id = trace_job.owner_id
        # The owner's usage from before the simulation (a forecast of the live queue); what the
        # owner's jobs attain during it is added by the run (SimRun.owner_gained_gpu_s).
        self.owner_base_usage_gpu_s = 0.0

    @classmethod
    def from_view(cls, view: JobView, model: str = "") -> SimJob:
        """A live job as the core sees it (progress, service, overrides and placement kept)."""
        job = cls(
            TraceJob(view.job_id, model, view.arrival_s, 1, view.num_gpus, view.deadline_s), view.profile
        )
        job.total_iters = float(view.total_iters)
        job.done_iters = float(view.done_iters)
        job.attained_gpu_s = float(view.attained_service_gpu_s)
        job.cpus_per_gpu_override = view.cpus_per_gpu_override
        job.mem_gb_per_gpu_override = view.mem_gb_per_gpu_override
        job.priority = view.priority
        job.team_id = view.team_id
        job.owner_id = view.owner_id
        job.num_nodes = view.num_nodes
        job.min_rate_iters_per_s = view.min_rate_iters_per_s
        job.gpu_choices = view.gpu_choices
        job.owner_base_usage_gpu_s = view.owner_usage_gpu_s
        job.current = view.current
        job.has_run = view.current is not None
        return job

    def job_view(self, owner_usage_gpu_s: float = 0.0) -> JobView:
        view = self.view
        if view is None or view.owner_usage_gpu_s != owner_usage_gpu_s:
            view = JobView(
                job_id=self.job_id,
                num_gpus=self.num_gpus,
                arrival_s=self.arrival_s,
                profile=self.profile,
                total_iters=self.total_iters,
                done_iters=self.done_iters,
                attained_service_gpu_s=self.attained_gpu_s,
                deadline_s=self.deadline_s,
                cpus_per_gpu_override=self.cpus_per_gpu_override,
                mem_gb_per_gpu_override=self.mem_gb_per_gpu_override,
                priority=self.priority,
                current=self.current,
                team_id=self.team_id,
                owner_id=self.owner_id,
                owner_usage_gpu_s=owner_usage_gpu_s,
                num_nodes=self.num_nodes,
                min_rate_iters_per_s=self.min_rate_iters_per_s,
                gpu_choices=self.gpu_choices,
            )
            self.view = view
        return view

    def record(self) -> JobRecord:
        jct_s = None if self.finish_s is None else self.finish_s - self.arrival_s
        rate = None
        if self.min_rate_iters_per_s is not None and self.finish_s is not None and self.start_s is not None:
            # Its average rate from its first start to its finish (pauses and restarts count against it).
            rate = self.total_iters / max(self.finish_s - self.start_s, 1e-9)
        return JobRecord(
            job_id=self.job_id,
            model=self.model,
            num_gpus=self.num_gpus,
            arrival_s=self.arrival_s,
            start_s=self.start_s,
            finish_s=self.finish_s,
            jct_s=jct_s,
            preemptions=self.preemptions,
            deadline_s=self.deadline_s,
            min_rate_iters_per_s=self.min_rate_iters_per_s,
            avg_rate_iters_per_s=rate,
        )


def resolve_run(policy: str | Policy, allocator: str | Allocator) -> tuple[Policy, Allocator, str, str]:
    """Instances for names (UnknownNameError, listing valid names, for unknown ones) and display names."""
    policy_obj = POLICIES.get(policy)() if isinstance(policy, str) else policy
    allocator_obj = ALLOCATORS.get(allocator)() if isinstance(allocator, str) else allocator
    policy_name = policy if isinstance(policy, str) else getattr(policy, "name", type(policy).__name__)
    allocator_name = (
        allocator if isinstance(allocator, str) else getattr(allocator, "name", type(allocator).__name__)
    )
    return policy_obj, allocator_obj, policy_name, allocator_name


def _first_finish_s(
    plan: RoundPlan, active: Mapping[int, SimJob], now_s: float, restart_overhead_s: float
) -> float:
    """When the first job placed by `plan` would finish if nothing changed (event mode's next event)."""
    first = math.inf
    for decision in plan.decisions:
        placement = decision.placement
        if placement is None:
            continue
        job = active[decision.job_id]
        same = job.current is not None and placement.shares == job.current.shares
        overhead_s = restart_overhead_s if (job.has_run and not same) else 0.0
        need_s = (job.total_iters - job.done_iters) * job.iter_time_s / placement.speedup
        first = min(first, now_s + overhead_s + need_s)
    return first


def default_first_round_s(arrivals_s: Sequence[float], round_s: float) -> float:
    """Where the round grid starts, as the reference does it (runner.py init_event_queue).

    A static trace (every arrival under 1 s, job i at i ms) starts at 1 s; any other trace at its first
    arrival rounded up to a multiple of `round_s`.
    """
    first = min(arrivals_s)
    if max(arrivals_s) < STATIC_TRACE_MAX_ARRIVAL_S:
        return STATIC_FIRST_ROUND_S
    return math.ceil(first / round_s) * round_s


def _resources(placement: Placement, profile: SensitivityProfile) -> tuple[int, float, float, float, float]:
    """(GPUs, cores, GB) a placement holds, then the cores and GB the job turns into speed.

    Useful = min(allocated, best-case demand) on each server: resources beyond a job's best case buy
    no throughput.
    """
    gpus = 0
    cpus = mem_gb = cpus_used = mem_used = 0.0
    best_cpus = profile.best_cpus_per_gpu
    best_mem = profile.best_mem_gb_per_gpu
    for share in placement.shares:
        n = len(share.gpu_indices)
        gpus += n
        cpus += share.num_cpus
        mem_gb += share.mem_gb
        cpus_used += min(share.num_cpus, best_cpus * n)
        mem_used += min(share.mem_gb, best_mem * n)
    return gpus, cpus, mem_gb, cpus_used, mem_used


def _advance(
    job: SimJob, speedup: float, overhead_s: float, now_s: float, round_s: float, round_end: bool
) -> float:
    """Run `job` for one round at `speedup`, setting finish_s if it completes; return the seconds held."""
    if not speedup > 0:
        raise ValueError(f"allocator gave job {job.job_id} a non-positive speedup {speedup}")
    run_s = round_s - overhead_s if overhead_s < round_s else 0.0
    if round_end:
        # The reference credits floor(round / effective iteration time) whole iterations per round
        # and finishes the job when its lease ends.
        if run_s > 0:
            job.done_iters += math.floor(run_s / (job.iter_time_s / speedup))
        if job.done_iters >= job.total_iters:
            job.done_iters = job.total_iters
            job.finish_s = now_s + round_s
        return round_s
    need_s = (job.total_iters - job.done_iters) * job.iter_time_s / speedup
    if need_s <= run_s * (1.0 + _FINISH_REL_TOL):
        job.done_iters = job.total_iters
        job.finish_s = now_s + overhead_s + need_s
        return overhead_s + need_s
    job.done_iters += run_s * speedup / job.iter_time_s
    return round_s


class SimRun:
    """The mutable state of one simulation: who is active and running, and the running totals."""

    def __init__(self, *, round_s: float, round_end: bool, restart_overhead_s: float) -> None:
        self.round_s = round_s
        self.round_end = round_end
        self.restart_overhead_s = restart_overhead_s
        self.active: dict[int, SimJob] = {}  # arrived and unfinished, in arrival order
        self.running: dict[int, SimJob] = {}  # placed in the previous round, unfinished
        self.infeasible = 0
        # Resource-seconds: GPUs, cores, GB allocated; cores and GB turned into speed.
        self.totals = [0.0, 0.0, 0.0, 0.0, 0.0]
        self.series = UtilisationSeries()
        # GPU-seconds each owner's jobs attained in this run (fair share; no decay within a run).
        self.owner_gained_gpu_s: dict[int, float] = defaultdict(float)

    def views(self) -> list[JobView]:
        views = []
        gained = self.owner_gained_gpu_s
        for job in self.active.values():
            if job.owner_id is None:
                views.append(job.view if job.view is not None else job.job_view())
            else:  # the owner's usage moves whenever any of their jobs runs
                views.append(job.job_view(job.owner_base_usage_gpu_s + gained[job.owner_id]))
        return views

    def apply(
        self, plan: RoundPlan, now_s: float, interval_s: float | None = None
    ) -> tuple[int, list[SimJob]]:
        """Apply one round's plan for `interval_s` (default: a round); returns how many jobs were
        placed and those that finished."""
        active = self.active
        round_end, restart_overhead_s = self.round_end, self.restart_overhead_s
        round_s = self.round_s if interval_s is None else interval_s
        new_running: dict[int, SimJob] = {}
        done_now: list[SimJob] = []
        sums = [0.0, 0.0, 0.0, 0.0, 0.0]  # this round's GPUs, cores, GB, useful cores, useful GB
        totals = self.totals
        for decision in plan.decisions:
            placement = decision.placement
            if placement is None:
                if decision.outcome is Outcome.INFEASIBLE:
                    self._drop(decision.job_id, decision.reason)
                continue
            job = active[decision.job_id]
            previous = job.current
            same = previous is not None and placement.shares == previous.shares
            if previous is not None and not same:
                job.preemptions += 1  # moved: the lease does not continue
            overhead_s = restart_overhead_s if (job.has_run and not same) else 0.0
            if job.start_s is None:
                job.start_s = now_s
            held_s = _advance(job, placement.speedup, overhead_s, now_s, round_s, round_end)
            # The GPUs it holds (a job with GPU choices may run on fewer or more than it asked for).
            job.attained_gpu_s += held_s * placement.num_gpus
            if job.owner_id is not None:
                self.owner_gained_gpu_s[job.owner_id] += held_s * placement.num_gpus
            job.current = placement
            job.has_run = True
            job.view = None
            if not same or job.resources is None:
                job.resources = _resources(placement, job.profile)
            gpus, cpus, mem_gb, cpus_used, mem_used = job.resources
            sums[0] += gpus
            sums[1] += cpus
            sums[2] += mem_gb
            sums[3] += cpus_used
            sums[4] += mem_used
            totals[0] += gpus * held_s
            totals[1] += cpus * held_s
            totals[2] += mem_gb * held_s
            totals[3] += cpus_used * held_s
            totals[4] += mem_used * held_s
            if job.finish_s is not None:
                done_now.append(job)
            else:
                new_running[job.job_id] = job

        # Jobs that ran last round and got nothing this round are preempted (paused).
        for job_id, job in self.running.items():
            if job_id not in new_running and job.finish_s is None and job_id in active:
                job.preemptions += 1
                job.current = None
                job.view = None
        self.running = new_running
        placed = len(new_running) + len(done_now)
        self.series.append(now_s, int(sums[0]), *sums[1:], placed, len(active) - placed)
        for job in done_now:
            del active[job.job_id]
            job.current = None
        return placed, done_now

    def _drop(self, job_id: int, reason: str) -> None:
        job = self.active.pop(job_id)
        self.running.pop(job_id, None)
        self.infeasible += 1
        logger.warning(
            "job %d (%s, %d GPUs) can never run on this cluster (%s); dropped",
            job.job_id,
            job.model,
            job.num_gpus,
            reason,
        )


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
) -> SimulationResult:
    """Replay `trace` on `cluster` in rounds of `round_s` seconds and measure what happens.

    `mode="events"` (GENIE's event-driven scheduling) decides again at every arrival and every
    completion, and at the latest `round_s` after the last decision (a lease's renewal), instead of on
    the fixed round grid; the first decision is at the first arrival. Not combinable with
    `finish_at_round_end`.

    Each round starts at `first_round_s + k x round_s` (default: default_first_round_s). Jobs that have
    arrived by then and are unfinished are handed to schedule_round with an all-free snapshot; a job
    placed on the same resources as last round continues its lease, one placed elsewhere (or resumed
    after a pause) restarts and makes no progress for `restart_overhead_s` (a job's first start has no
    overhead). A placed job runs at `speedup / iter_time_s` iterations per second.

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
    run = SimRun(round_s=round_s, round_end=finish_at_round_end, restart_overhead_s=restart_overhead_s)
    active = run.active
    num_jobs = len(sim_jobs)
    next_idx = 0  # next job of sim_jobs (sorted by arrival) to admit
    finished = rounds = k = 0
    last_reported = -1
    stopped_early = False

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
        while next_idx < num_jobs and sim_jobs[next_idx].arrival_s <= now_s:
            job = sim_jobs[next_idx]
            active[job.job_id] = job
            next_idx += 1
        if not active:
            if next_idx >= num_jobs:
                break
            if events:
                event_now_s = sim_jobs[next_idx].arrival_s
            else:
                k = next_round_after_arrival()  # idle cluster
            continue

        plan = schedule_round(snapshot, run.views(), policy=policy_obj, allocator=allocator_obj, now_s=now_s)
        rounds += 1
        interval_s = None
        if events:
            next_arrival_s = sim_jobs[next_idx].arrival_s if next_idx < num_jobs else math.inf
            first_finish_s = _first_finish_s(plan, active, now_s, restart_overhead_s)
            interval_s = min(next_arrival_s, first_finish_s, now_s + round_s) - now_s
            event_now_s = now_s + interval_s
        placed, done_now = run.apply(plan, now_s, interval_s)
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
