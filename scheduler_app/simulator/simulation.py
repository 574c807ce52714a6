"""The round-based, trace-driven simulation loop; every decision comes from core.engine.schedule_round."""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Mapping, Sequence

from profiles_app.catalog import load_catalog
from scheduler_app.core.allocators import ALLOCATORS, Allocator
from scheduler_app.core.engine import schedule_round
from scheduler_app.core.policies import POLICIES, Policy
from scheduler_app.core.types import JobView, Outcome, Placement, SensitivityProfile
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

# Reference static traces put job i at i ms, all under 1 s, and the reference starts their first round at 1 s.
STATIC_TRACE_MAX_ARRIVAL_S = 1.0
STATIC_FIRST_ROUND_S = 1.0
# Relative slack when deciding that a job finishes inside a round (exact mode), against float residue
# such as 1e-12 iterations left over, which would otherwise cost a whole extra round.
_FINISH_REL_TOL = 1e-9


class _SimJob:
    """Mutable per-job state; `view` caches the JobView until the job's state changes."""

    __slots__ = (
        "arrival_s",
        "attained_gpu_s",
        "current",
        "done_iters",
        "finish_s",
        "has_run",
        "iter_time_s",
        "job_id",
        "model",
        "num_gpus",
        "preemptions",
        "profile",
        "resources",
        "start_s",
        "total_iters",
        "view",
    )

    def __init__(self, trace_job: TraceJob, profile: SensitivityProfile) -> None:
        self.job_id = trace_job.job_id
        self.model = trace_job.model
        self.num_gpus = trace_job.num_gpus
        self.arrival_s = float(trace_job.arrival_s)
        self.total_iters = float(trace_job.total_iters)
        self.profile = profile
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

    def job_view(self) -> JobView:
        view = self.view
        if view is None:
            view = JobView(
                job_id=self.job_id,
                num_gpus=self.num_gpus,
                arrival_s=self.arrival_s,
                profile=self.profile,
                total_iters=self.total_iters,
                done_iters=self.done_iters,
                attained_service_gpu_s=self.attained_gpu_s,
                current=self.current,
            )
            self.view = view
        return view

    def record(self) -> JobRecord:
        jct_s = None if self.finish_s is None else self.finish_s - self.arrival_s
        return JobRecord(
            job_id=self.job_id,
            model=self.model,
            num_gpus=self.num_gpus,
            arrival_s=self.arrival_s,
            start_s=self.start_s,
            finish_s=self.finish_s,
            jct_s=jct_s,
            preemptions=self.preemptions,
        )


def _resolve(policy: str | Policy, allocator: str | Allocator) -> tuple[Policy, Allocator, str, str]:
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
) -> SimulationResult:
    """Replay `trace` on `cluster` in rounds of `round_s` seconds and measure what happens.

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
    measurement). `progress(fraction_finished)` is called as jobs finish.
    Unknown policy/allocator names raise UnknownNameError; unknown models raise TraceError.
    """
    wall_start = time.perf_counter()
    if not round_s > 0:
        raise ValueError(f"round_s must be positive, got {round_s}")
    if not restart_overhead_s >= 0:
        raise ValueError(f"restart_overhead_s must be >= 0, got {restart_overhead_s}")
    if not trace:
        raise ValueError("empty trace")
    if measured_job_ids is not None and measured_job_ids[0] >= measured_job_ids[1]:
        raise ValueError(f"measured_job_ids must be a non-empty [lo, hi) range, got {measured_job_ids}")
    policy_obj, allocator_obj, policy_name, allocator_name = _resolve(policy, allocator)
    profiles = load_catalog() if catalog is None else catalog

    sim_jobs: list[_SimJob] = []
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
        sim_jobs.append(_SimJob(tj, profile))

    if measured_job_ids is None:
        measured = list(sim_jobs)
    else:
        lo, hi = measured_job_ids
        measured = [j for j in sim_jobs if lo <= j.job_id < hi]
    measured_left = len(measured)
    measured_ids = {j.job_id for j in measured}

    snapshot = cluster.snapshot()  # immutable: shared by every round
    if first_round_s is None:
        t0 = default_first_round_s([j.arrival_s for j in sim_jobs], round_s)
    else:
        t0 = float(first_round_s)
    series = UtilisationSeries()
    gpu_alloc_s = cpu_alloc_s = mem_alloc_s = cpu_used_s = mem_used_s = 0.0

    num_jobs = len(sim_jobs)
    next_idx = 0  # next job of sim_jobs (sorted by arrival) to admit
    active: dict[int, _SimJob] = {}  # arrived and unfinished, in arrival order
    running: dict[int, _SimJob] = {}  # placed in the previous round
    finished = 0
    infeasible = 0
    last_reported = -1
    rounds = 0
    k = 0
    stopped_early = False
    round_end_mode = finish_at_round_end

    while True:
        now_s = t0 + k * round_s
        if max_time_s is not None and now_s > max_time_s:
            stopped_early = True
            logger.warning(
                "simulation stopped at max_time_s=%s with %d jobs unfinished", max_time_s, len(active)
            )
            break
        while next_idx < num_jobs and sim_jobs[next_idx].arrival_s <= now_s:
            job = sim_jobs[next_idx]
            active[job.job_id] = job
            next_idx += 1
        if not active:
            if next_idx >= num_jobs:
                break
            # Idle cluster: jump to the first round boundary at or after the next arrival.
            k = max(k + 1, math.ceil((sim_jobs[next_idx].arrival_s - t0) / round_s))
            continue

        views = [job.view if job.view is not None else job.job_view() for job in active.values()]
        plan = schedule_round(snapshot, views, policy=policy_obj, allocator=allocator_obj, now_s=now_s)
        rounds += 1

        new_running: dict[int, _SimJob] = {}
        done_now: list[_SimJob] = []
        round_gpus = 0
        round_cpus = round_mem = round_cpus_used = round_mem_used = 0.0
        for decision in plan.decisions:
            placement = decision.placement
            if placement is None:
                if decision.outcome is Outcome.INFEASIBLE:
                    job = active.pop(decision.job_id)
                    running.pop(decision.job_id, None)
                    infeasible += 1
                    logger.warning(
                        "job %d (%s, %d GPUs) can never run on this cluster (%s); dropped",
                        job.job_id, job.model, job.num_gpus, decision.reason,
                    )
                continue
            job = active[decision.job_id]
            previous = job.current
            same = previous is not None and placement.shares == previous.shares
            if previous is not None and not same:
                job.preemptions += 1
            overhead_s = restart_overhead_s if (job.has_run and not same) else 0.0
            run_s = round_s - overhead_s if overhead_s < round_s else 0.0
            if job.start_s is None:
                job.start_s = now_s
            speedup = placement.speedup
            if not speedup > 0:
                raise ValueError(f"allocator gave job {job.job_id} a non-positive speedup {speedup}")
            if round_end_mode:
                # The reference credits floor(round / effective iteration time) whole iterations.
                if run_s > 0:
                    job.done_iters += math.floor(run_s / (job.iter_time_s / speedup))
                held_s = round_s
                if job.done_iters >= job.total_iters:
                    job.done_iters = job.total_iters
                    job.finish_s = now_s + round_s
            else:
                need_s = (job.total_iters - job.done_iters) * job.iter_time_s / speedup
                if need_s <= run_s * (1.0 + _FINISH_REL_TOL):
                    held_s = overhead_s + need_s
                    job.done_iters = job.total_iters
                    job.finish_s = now_s + held_s
                else:
                    held_s = round_s
                    job.done_iters += run_s * speedup / job.iter_time_s
            job.attained_gpu_s += held_s * job.num_gpus
            job.current = placement
            job.has_run = True
            job.view = None

            if not same or job.resources is None:
                job.resources = _resources(placement, job.profile)
            num_gpus, num_cpus, mem_gb, cpus_used, mem_used = job.resources
            round_gpus += num_gpus
            round_cpus += num_cpus
            round_mem += mem_gb
            round_cpus_used += cpus_used
            round_mem_used += mem_used
            gpu_alloc_s += num_gpus * held_s
            cpu_alloc_s += num_cpus * held_s
            mem_alloc_s += mem_gb * held_s
            cpu_used_s += cpus_used * held_s
            mem_used_s += mem_used * held_s

            if job.finish_s is not None:
                done_now.append(job)
            else:
                new_running[job.job_id] = job

        # Jobs that ran last round and got nothing this round are preempted (paused).
        for job_id, job in running.items():
            if job_id not in new_running and job.finish_s is None and job_id in active:
                job.preemptions += 1
                job.current = None
                job.view = None
        running = new_running

        series.append(
            now_s, round_gpus, round_cpus, round_mem, round_cpus_used, round_mem_used,
            len(new_running) + len(done_now), len(active) - len(new_running) - len(done_now),
        )

        for job in done_now:
            del active[job.job_id]
            job.current = None
            finished += 1
            if job.job_id in measured_ids:
                measured_left -= 1
        if progress is not None and done_now:
            pct = (100 * finished) // num_jobs
            if pct != last_reported:
                last_reported = pct
                progress(finished / num_jobs)
        if stop_when_measured and measured_left == 0:
            stopped_early = next_idx < num_jobs or bool(active)
            break

        if not new_running and not done_now:
            # Nothing placed on an all-free cluster: no input will change until the next arrival.
            if next_idx >= num_jobs:
                stopped_early = True
                logger.warning(
                    "no job can be placed and none will arrive; %d jobs left unfinished", len(active)
                )
                break
            k = max(k + 1, math.ceil((sim_jobs[next_idx].arrival_s - t0) / round_s))
        else:
            k += 1

    wall_s = time.perf_counter() - wall_start
    records = [job.record() for job in sorted(sim_jobs, key=lambda j: j.job_id)]
    finish_times = [j.finish_s for j in sim_jobs if j.finish_s is not None]
    admitted_arrivals = [j.arrival_s for j in sim_jobs[:next_idx]]
    makespan_s = max(finish_times) - min(admitted_arrivals) if finish_times else 0.0
    jcts = [j.finish_s - j.arrival_s for j in measured if j.finish_s is not None]
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
        jct=jct_stats(jcts),
        makespan_s=makespan_s,
        totals=ResourceTotals(gpu_alloc_s, cpu_alloc_s, mem_alloc_s, cpu_used_s, mem_used_s),
        rounds=rounds,
        wall_s=wall_s,
        records=records,
        utilisation=series,
        stopped_early=stopped_early,
        infeasible_jobs=infeasible,
    )
    logger.info(
        "simulated %d jobs (%s+%s) in %d rounds, %.2f s: avg JCT %.2f h, makespan %.2f h",
        num_jobs, policy_name, allocator_name, rounds, wall_s, result.avg_jct_h, result.makespan_h,
    )
    return result
