"""Rounds a forecast plays in one step: those that repeat a plan whose jobs all continue where they
are, up to the round in which one of them finishes."""

from __future__ import annotations

import math
from collections.abc import Mapping

from scheduler_app.core.types import Outcome, RoundPlan
from scheduler_app.simulator import reapply
from scheduler_app.simulator.sim_run import SimJob


def continuing_rows(plan: RoundPlan, active: Mapping[int, SimJob], round_s: float) -> list[tuple] | None:
    """(job, iterations a round, iterations a second, GPU-seconds a round, owner) for each job `plan`
    places, as SimRun.apply adds them when the job continues its lease on the very Placement it holds
    (no start-up left): None where applying `plan` would do anything else to a job (start, move,
    pause or drop it), or to a job already finished."""
    rows = []
    for decision in plan.decisions:
        job = active.get(decision.job_id)
        if job is None or decision.outcome is Outcome.INFEASIBLE:
            return None
        placement = decision.placement
        if placement is None:
            if job.current is not None:
                return None  # paused
            continue
        if (
            placement is not job.current
            or job.startup_left_s
            or job.start_s is None
            or job.finish_s is not None
            or job.resources is None
        ):
            return None
        rate = placement.speedup / job.iter_time_s
        rows.append((job, round_s * rate, rate, round_s * job.resources[0], job.owner_id))
    return rows


def rounds_before_a_finish(rows: list[tuple], round_s: float, most: int) -> int:
    """How many rounds (at most `most`) the jobs of `rows` (`continuing_rows`) run before the round in which
    one of them finishes: SimRun.apply's test (reapply.finishes_within), on the progress their earlier
    rounds add."""
    nearest_first = sorted(
        ((job.total_iters, job.done_iters, step, rate) for job, step, rate, _, _ in rows),
        key=lambda row: (row[0] - row[1]) / row[2] if row[2] > 0 else math.inf,
    )  # the nearest finish bounds the walk of the others
    fewest = most
    for total_iters, done_iters, step, rate in nearest_first:
        rounds = 0
        while rounds < fewest and not reapply.finishes_within(total_iters - done_iters, rate, round_s):
            done_iters += step
            rounds += 1
        fewest = rounds
    return fewest


def skip_steady_rounds(plan: RoundPlan, active: dict[int, SimJob], round_s: float, most: int) -> int:
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
