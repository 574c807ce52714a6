"""GENIE's round after its jobs are decided: the leftover pass (step 4) and whether the plan repeats."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from scheduler_app.core import reasons
from scheduler_app.core.allocators.genie_candidates import Held, Reservation
from scheduler_app.core.placement.state import RoundState
from scheduler_app.core.throughput import EPS, OperatingPoint, ServerShape
from scheduler_app.core.types import JobView


class GenieRoundDone(Protocol):
    """What these functions read of a GenieRound (genie.py) once its jobs are decided."""

    jobs: Sequence[JobView]
    shape: ServerShape | None
    state: RoundState
    held: list[Held]
    reservation: Reservation | None
    keyed: bool

    def points(self, job: JobView) -> tuple[OperatingPoint, ...]: ...


def hand_out_leftovers(genie_round: GenieRoundDone) -> None:
    """Step 4: cores and memory nobody was given go to the placed jobs, in policy order, each moving
    to its fastest point that the free resources on its own servers allow. Only this round is
    affected: the next round starts again from the smallest points."""
    if genie_round.shape is None:
        return  # an empty cluster placed nothing
    state = genie_round.state
    for h in genie_round.held:
        if h.fixed or h.top:
            continue
        current = h.point
        for point in genie_round.points(h.job)[::-1]:
            if point.speed <= current.speed + EPS:
                continue
            if all(
                s.num_gpus * point.cpus_per_gpu - s.cpus <= state.free_cpus[s.server_pos] + EPS
                and s.num_gpus * point.mem_gb_per_gpu - s.mem_gb <= state.free_mem_gb[s.server_pos] + EPS
                for s in h.shares
            ):
                for s in h.shares:
                    state.adjust(s, s.num_gpus * point.cpus_per_gpu, s.num_gpus * point.mem_gb_per_gpu)
                h.point = point
                h.reason = reasons.LEFTOVER
                break


def repeats(genie_round: GenieRoundDone) -> bool:
    """Whether the round's plan is stable (RoundPlan.stable): every job placed at its best case, so
    that deciding the same jobs again in the same order, each from this placement, gives the same
    plan, and deciding only some of them gives each the same decision.

    Why that holds: the round read neither progress nor the clock (no QoS target, hence no need, no
    reservation, no backfill); each job took the first of its best-effort options (`best_case`) at its
    own GPU count, with no node count and no fixed demand. Deciding again, each job in turn finds its
    home (its claim, `RoundState.find`'s first stage) at the same demand: the jobs before it took what
    they took here, so the free totals and `starves_gpus`' test are as here (with some jobs gone, the
    free totals are larger and the GPUs expected after it fewer, so the test still passes); its speed
    is the best case on the same servers; no faster point exists for the leftover pass. Interference
    (a workload with kappa) is outside this: engine.with_interference returns a plan not marked stable.
    """
    if genie_round.reservation is not None or not genie_round.keyed:
        return False
    if len(genie_round.held) != len(genie_round.jobs):
        return False  # someone waits or is infeasible
    best_case = reasons.BEST_CASE
    for h in genie_round.held:
        job = h.job
        if (
            h.reason != best_case
            or h.fixed
            or h.scale != 1.0
            or h.need is not None
            or job.deadline_s is not None
            or job.min_rate_iters_per_s is not None
            or job.gpu_choices
            or job.num_nodes is not None
        ):
            return False
    return True
