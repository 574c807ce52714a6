"""Forecast: play the live queue forward, with no new arrivals, to predict when each job starts and ends.

The live service's admission feedback (scheduler_app/services/admission.py) and Slurm's `squeue
--start` answer the same question; here it is answered by the same core and the same round loop as
the simulator, so the prediction follows the configured policy and allocator exactly (CPU/memory
speed-ups, stickiness, QoS ordering), not a GPU-count approximation. What it cannot know: later
arrivals (which may overtake under SRTF, EDF or SWAF), failures, and speeds that differ from the
profiles; the service stores each prediction and compares it with what happened.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from scheduler_app.core.allocators import Allocator
from scheduler_app.core.engine import schedule_round
from scheduler_app.core.policies import Policy
from scheduler_app.core.types import ClusterSnapshot, JobView
from scheduler_app.simulator.simulation import _resolve, _Run, _SimJob


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
) -> dict[int, JobForecast]:
    """Run rounds from `first_round_s` on `snapshot` (the live round's input: every resource free that
    the round re-decides, anything held outside it subtracted) until every job of
    `until_finished` (default: all) has finished, no job can be placed, or `max_rounds` have passed
    (2016 rounds of 300 s: one week). Jobs finish at their exact time inside a round.

    `started_s`: real start times of jobs already running (their forecast keeps them).
    `time_budget_s`: stop after this much wall time (a web request's patience); jobs not finished by
    then get no finish time, like those beyond `max_rounds`.
    """
    wall_start = time.perf_counter()
    if not round_s > 0:
        raise ValueError(f"round_s must be positive, got {round_s}")
    policy_obj, allocator_obj, _, _ = _resolve(policy, allocator)
    started_s = started_s or {}
    run = _Run(round_s=round_s, round_end=False, restart_overhead_s=0.0)
    sim_jobs: dict[int, _SimJob] = {}
    for view in sorted(jobs, key=lambda v: (v.arrival_s, v.job_id)):
        job = _SimJob.from_view(view)
        job.start_s = started_s.get(view.job_id)
        sim_jobs[view.job_id] = job
        run.active[view.job_id] = job
        if view.current is not None:
            run.running[view.job_id] = job
    waiting_for = set(sim_jobs if until_finished is None else until_finished) & set(sim_jobs)
    for k in range(max_rounds):
        if not waiting_for or not run.active:
            break
        if time_budget_s is not None and time.perf_counter() - wall_start > time_budget_s:
            break
        now_s = first_round_s + k * round_s
        plan = schedule_round(snapshot, run.views(), policy=policy_obj, allocator=allocator_obj, now_s=now_s)
        placed, _ = run.apply(plan, now_s)
        waiting_for.intersection_update(run.active.keys())  # finished or dropped as infeasible: done
        if not placed:
            break  # nothing fits and nothing will change: no arrivals in a forecast
    return {
        job_id: JobForecast(job_id, job.start_s, job.finish_s) for job_id, job in sim_jobs.items()
    }
