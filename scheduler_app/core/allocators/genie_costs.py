"""GENIE's placement costs: a job's speed on the servers found (the spread's slowdown, interference from
communicating neighbours) and whether a placement keeps every QoS need it touches (used by genie.py)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Protocol

from scheduler_app.core.allocators.genie_candidates import Held
from scheduler_app.core.interference import communicates, interference_factor
from scheduler_app.core.placement import Plan
from scheduler_app.core.throughput import EPS, OperatingPoint, with_penalty
from scheduler_app.core.types import JobView


class GenieRoundPlacing(Protocol):
    """What these functions read and set of a GenieRound (genie.py) while it places jobs."""

    comm_on_server: dict[int, list[Held]]
    kappa_qos_held: bool
    keyed: bool


def comm_neighbours(genie_round: GenieRoundPlacing, job: JobView, plan: Plan) -> list[Held]:
    """The communicating jobs placed so far on the servers of `plan` (each once)."""
    seen: dict[int, Held] = {}
    for i, _ in plan:
        for h in genie_round.comm_on_server.get(i, ()):
            seen.setdefault(h.job.job_id, h)
    seen.pop(job.job_id, None)
    return list(seen.values())


def speed_on(genie_round: GenieRoundPlacing, job: JobView, point: OperatingPoint, plan: Plan) -> float:
    """The job's speed at `point` on the servers of `plan`: the spread's slowdown and GENIE's
    interference from the communicating jobs placed there so far."""
    speed = with_penalty(point.speed, job.profile, len(plan), job.num_gpus)
    if job.profile.interference_kappa <= 0 or not communicates(job.num_gpus):
        return speed  # a factor of 1.0 whatever its neighbours (interference_factor)
    return speed / interference_factor(
        job.profile, job.num_gpus, len(comm_neighbours(genie_round, job, plan))
    )


def acceptable(
    genie_round: GenieRoundPlacing, job: JobView, plan: Plan, speed: float, need: float | None
) -> bool:
    """Whether `plan` keeps the job's QoS (`need`) and, for a communicating job, every communicating
    QoS neighbour's: one more communicating job next to it must not take it below its need."""
    if need is not None and speed < need - EPS:
        return False
    if not genie_round.kappa_qos_held or not communicates(job.num_gpus):
        return True
    for h in comm_neighbours(genie_round, job, plan):
        if h.need is None or h.job.profile.interference_kappa <= 0:
            continue
        if h.job.deadline_s is not None:
            genie_round.keyed = False  # a neighbour's deadline need against a speed need_key lacks
        x = len(comm_neighbours(genie_round, h.job, [(s.server_pos, 0) for s in h.shares]))
        base = with_penalty(h.point.speed, h.job.profile, len(h.shares), h.job.num_gpus)
        if base / interference_factor(h.job.profile, h.job.num_gpus, x + 1) < h.need - EPS:
            return False
    return True


def avoiding_comm(
    genie_round: GenieRoundPlacing, dc: Sequence[float], dm: Sequence[float]
) -> tuple[list[float], list[float]]:
    """Per-server demands that no server holding a communicating job can meet (an infinite one)."""
    dc, dm = list(dc), list(dm)
    for i, held in genie_round.comm_on_server.items():
        if held:
            dc[i] = dm[i] = math.inf
    return dc, dm
