"""Forecast: play the live queue forward, with no new arrivals, to predict when each job starts and ends.

The live service's admission feedback (scheduler_app/services/admission.py) and Slurm's `squeue
--start` answer the same question; here it is answered by the same core and the same round loop as
the simulator, so the prediction follows the configured policy and allocator exactly (CPU/memory
speed-ups, stickiness, QoS ordering), not a GPU-count approximation. What it cannot know: later
arrivals (which may overtake under SRTF, EDF or SWAF), failures, and speeds that differ from the
profiles; the service stores each prediction and compares it with what happened.
"""

from __future__ import annotations

import math
import time
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass

from scheduler_app.core.allocators import Allocator
from scheduler_app.core.engine import schedule_round
from scheduler_app.core.move_guard import one_server_views
from scheduler_app.core.policies import Policy
from scheduler_app.core.restarts import RestartPolicy
from scheduler_app.core.types import ClusterSnapshot, JobView, RoundPlan
from scheduler_app.simulator.reuse import ReusingAllocator, holds, reusable
from scheduler_app.simulator.sim_run import SimJob, SimRun
from scheduler_app.simulator.simulation import keeps_everyone, resolve_run


@dataclass(frozen=True, slots=True)
class JobForecast:
    """Predicted start and finish (seconds on the caller's clock); None: not within the horizon.

    `start_s` is the job's first round in the forecast, or its real start when it already runs.
    """

    job_id: int
    start_s: float | None
    finish_s: float | None


def forecast(
    snapshot: ClusterSnapshot,
    jobs: Sequence[JobView],
    *,
    policy: str | Policy,
    allocator: str | Allocator,
    first_round_s: float,
    round_s: float = 300.0,
    started_s: dict[int, float] | None = None,
    until_finished: Iterable[int] | None = None,
    max_rounds: int = 2016,
    time_budget_s: float | None = None,
    team_quota_gpus: Mapping[int, int] | None = None,
    borrowing_teams: Collection[int] = (),
    after: Mapping[int, Iterable[int]] | None = None,
    restarts: RestartPolicy | None = None,
    shortcuts: bool = True,
) -> dict[int, JobForecast]:
    """Run rounds from `first_round_s` on `snapshot` (the live round's input: every resource free that
    the round re-decides, anything held outside it subtracted) until every job of
    `until_finished` (default: all) has finished, no job can be placed, or `max_rounds` have passed
    (2016 rounds of 300 s: one week). Jobs finish at their exact time inside a round.

    `started_s`: real start times of jobs already running (their forecast keeps them).
    `time_budget_s`: stop after this much wall time (a web request's patience); jobs not finished by
    then get no finish time, like those beyond `max_rounds`. Under a static order (FIFO) with
    `until_finished`, jobs ordered after the last target are left out of the forecast and the result.
    `team_quota_gpus`, `borrowing_teams`: as in schedule_round.
    `after`: job id -> ids of the jobs it waits for (Slurm's afterok). Such a job joins the queue in
    the round after the last of them finishes, and never if one of them is not in `jobs` or is dropped.
    `restarts`: the live rounds' RestartPolicy, passed to every round (running jobs move only when it
    pays); with it the forecast also charges restarts as the simulator does, from each view's
    startup_s, checkpoint_every_s and lease_started_s (on the clock of `first_round_s`): a start waits
    its start-up, a restart loses the run since the last checkpoint. None: free restarts.
    `shortcuts` (where repeated rounds are skipped): a plan that leaves every job as it was (no start,
    no move, no drop) counts as repeated at once: the next round's inputs are the same but for the
    clock, so it is not decided only to be found the same. False: that round decided by the core.
    Under other orders (by progress or the clock: swaf, sjf, srtf), or where the allocator may read
    progress, a plan that kept everyone is reused, round by round, while the policy orders the jobs as
    it did and the plan was decided from the order and the placements alone (simulator/reuse.py): each
    such round costs an order instead of an allocation and gives what deciding it would. False: every
    such round decided.
    """
    wall_start = time.perf_counter()
    if not round_s > 0:
        raise ValueError(f"round_s must be positive, got {round_s}")
    policy_obj, allocator_obj, _, _ = resolve_run(policy, allocator)
    started_s = started_s or {}
    views = list(jobs)
    if restarts is not None and restarts.one_server:
        # What the engine does to every round's views, done once (it then leaves them as they are), so
        # that the order reuse.py checks is the order of the views the engine decides.
        views = one_server_views(views, snapshot)
    targets = {v.job_id for v in views} if until_finished is None else set(until_finished)
    waits_for = {job_id: set(deps) for job_id, deps in (after or {}).items() if deps}
    # Cutting the queue behind the last target would drop a dependency ordered after it.
    if policy_obj.static_order and until_finished is not None and not waits_for:
        # The order never changes, so jobs behind the last target can only take what is left:
        # they do not move its start (GPU admission is in policy order) and are not simulated.
        ordered = policy_obj.order(views, snapshot, first_round_s)
        positions = [i for i, v in enumerate(ordered) if v.job_id in targets]
        if positions:
            views = ordered[: max(positions) + 1]
    # With a static order and an allocator that ignores progress, a plan that repeats keeps
    # repeating until a job finishes: those rounds are skipped in one step.
    can_skip = policy_obj.static_order and not allocator_obj.reads_progress
    recheck = shortcuts and not can_skip
    if shortcuts:
        # Without the guard an allocation repeats only in a round reused whole: nothing to remember.
        allocator_obj = ReusingAllocator(allocator_obj, remember=restarts is not None)
    costs = restarts is not None
    run = SimRun(round_s=round_s, round_end=False, in_place=costs and restarts.resize_in_place)
    sim_jobs: dict[int, SimJob] = {}
    held: dict[int, SimJob] = {}  # jobs waiting for their dependencies to finish
    for view in sorted(views, key=lambda v: (v.arrival_s, v.job_id)):
        job = SimJob.from_view(view, now_s=first_round_s, costs=costs)
        job.start_s = started_s.get(view.job_id)
        sim_jobs[view.job_id] = job
        if waits_for.get(view.job_id) and view.current is None:
            held[view.job_id] = job
            continue
        run.active[view.job_id] = job
        if view.current is not None:
            run.running[view.job_id] = job
    waiting_for = targets & set(sim_jobs)
    previous: RoundPlan | None = None
    reuse: RoundPlan | None = None  # a plan reuse.py's conditions let the next round reuse (recheck)
    reuse_key: object = None  # its progress key
    k = 0
    while k < max_rounds and waiting_for and run.active:
        if time_budget_s is not None and time.perf_counter() - wall_start > time_budget_s:
            break
        now_s = first_round_s + k * round_s
        views = run.views()
        if reuse is not None and holds(reuse, reuse_key, views, policy_obj, allocator_obj, snapshot, now_s):
            plan, decided = reuse, False
        else:
            if shortcuts:
                allocator_obj.begin_round()
            plan, decided = (
                schedule_round(
                    snapshot,
                    views,
                    policy=policy_obj,
                    allocator=allocator_obj,
                    now_s=now_s,
                    team_quota_gpus=team_quota_gpus,
                    borrowing_teams=borrowing_teams,
                    restarts=restarts,
                ),
                True,
            )
        steady = can_skip and previous is not None and plan.decisions == previous.decisions
        if shortcuts and can_skip and not steady:
            steady = keeps_everyone(plan, run.active)
        if steady:
            k += _skip_steady_rounds(plan, run.active, round_s, max_rounds - 1 - k)
        placed, done_now = run.apply(plan, first_round_s + k * round_s)
        released = _release(held, waits_for, sim_jobs)
        if recheck:
            # Reused next round while nothing arrives, finishes or is dropped and the order holds.
            kept = run.kept and not done_now and not released
            if not kept:
                reuse = None
            elif decided:
                reuse_key = reusable(plan, allocator_obj, restarts)
                reuse = plan if reuse_key is not None else None
        for job_id in released:
            run.active[job_id] = held.pop(job_id)
        # Finished or dropped as infeasible: done; a held job is still to come.
        waiting_for.intersection_update(run.active.keys() | held.keys())
        if not placed and not released:
            break  # nothing fits and nothing will change: no arrivals in a forecast
        previous = None if released else plan  # a new job in the queue: the plan may change
        k += 1
    return {job_id: JobForecast(job_id, job.start_s, job.finish_s) for job_id, job in sim_jobs.items()}


def _release(
    held: dict[int, SimJob], waits_for: dict[int, set[int]], sim_jobs: dict[int, SimJob]
) -> list[int]:
    """The held jobs whose every dependency has finished in the forecast (a dependency outside it, or
    dropped as infeasible, never finishes)."""
    return [
        job_id
        for job_id in held
        if all(dep in sim_jobs and sim_jobs[dep].finish_s is not None for dep in waits_for[job_id])
    ]


def _skip_steady_rounds(plan: RoundPlan, active: dict[int, SimJob], round_s: float, most: int) -> int:
    """Run every placed job through the whole rounds before the first of them finishes; return how many.

    Only called when the plan repeats and nothing else can change it (see `forecast`), so these
    rounds would all have been this plan. (Only under a static order, which reads no owner usage: the
    run's per-owner usage is not advanced here.)
    """
    placed = [(active[d.job_id], d.placement) for d in plan.decisions if d.placement is not None]
    if not placed or any(job.startup_left_s > 0 for job, _ in placed):
        return 0  # a start-up still going on: step through it round by round
    rounds_left = min(
        math.ceil((job.total_iters - job.done_iters) * job.iter_time_s / placement.speedup / round_s)
        for job, placement in placed
    )
    skip = max(0, min(rounds_left - 1, most))
    for job, placement in placed:
        rate = placement.speedup / job.iter_time_s
        job.progress(skip * round_s, skip * round_s * rate, rate, whole=False)
        job.attained_gpu_s += skip * round_s * placement.num_gpus
        job.view = None
    return skip
