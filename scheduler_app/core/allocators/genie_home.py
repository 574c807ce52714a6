"""GENIE's lean path for a running job that goes back to its own GPUs at its best case.

Most jobs of a decided round (one where genie_steady.py could not tell the plan: a newcomer, a job
waiting) run already and are decided exactly as they ran: `GenieRound.decide` takes the best-effort
path, tries the best case first, `RoundState.find_uniform` finds the job's home (its claim, the
strict HOME stage) and `place` takes it back. `decide_jobs`, GenieRound.run's walk over the jobs,
tells that outcome from the same tests in the same state, without the generic steps that cannot
apply to such a job (the QoS need, GPU-count variants, node counts, fixed demands, interference, a
reservation), and records the same placement; when any test would send `place` elsewhere it has
changed nothing, and the job is decided in full. Exact: the same state changes, the same `Held`, the
same plan (tests/scheduler_app/core/test_genie_home.py compares rounds decided with it and with
`decide` for every job).

Why each test stands for `decide_best_effort` + `place` on such a job:
- the job has no QoS target, no GPU-count choices, no node count and no fixed demand (else it is not
  `decide_best_effort`'s); it still claims its home (`RoundState.release` not called on it), so its
  GPUs are free; no reservation stands (no backfill test);
- `unfit` and the free totals of its options, then `find_uniform`'s failure memo and totals for the
  best case, are read as `decide_best_effort` and `find_uniform` read them (with the memos empty,
  as they nearly always are, from what genie_kept.py worked out for its Placement);
- `find` for an owner with a home and no filters tries the strict home first (`home_plan`); when that
  fails the walk would look elsewhere: the job is decided in full then;
- `starves_gpus`, as `place` asks it for a best case (never True at or below the proportional share);
- its speed there is the best case's after the spread's slowdown: no interference factor, since it
  either does not communicate or its workload has no interference term; `acceptable` without a need
  is True unless a communicating QoS job with an interference term is placed and this job
  communicates (then it is decided in full);
- `take` of the home plan is `_take_home`.
A job whose placement genie_kept.py knows to be its best case's holds its fastest point (the leftover
pass skips it: `Held.top`) and is on its own Placement as `RoundSetup.placed` would find (`Held.kept`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from scheduler_app.core import reasons
from scheduler_app.core.allocators.genie_candidates import Held, Reservation
from scheduler_app.core.allocators.genie_kept import KEPT_ENTRIES, kept_job
from scheduler_app.core.allocators.genie_points import shape_points
from scheduler_app.core.placement.plan import EPS as PLACEMENT_EPS
from scheduler_app.core.placement.plan import Plan, PlanBuilder
from scheduler_app.core.placement.state import RoundState
from scheduler_app.core.throughput import EPS, OperatingPoint, ServerShape, with_penalty
from scheduler_app.core.types import ClusterSnapshot, JobView


class GenieRound(Protocol):
    """What this walk reads and sets of a GenieRound (genie.py, which imports this module: the round
    is named by what it offers, not imported, so there is no import circle)."""

    jobs: Sequence[JobView]
    snapshot: ClusterSnapshot
    builder: PlanBuilder
    state: RoundState
    shape: ServerShape | None
    infeasible: list[str | None]
    admitted: list[bool]
    held: list[Held]
    comm_on_server: dict[int, list[Held]]
    kappa_qos_held: bool
    releases: list[tuple[JobView, float]]
    reservation: Reservation | None
    unfit: dict[int, list[tuple[OperatingPoint, str]]]
    found: bool
    later_gpus: int

    def decide(self, pos: int, job: JobView) -> None: ...

    def starves_gpus(self, plan: Plan, point: OperatingPoint) -> bool: ...


def decide_jobs(genie_round: GenieRound) -> None:
    """`GenieRound.run`'s walk over the jobs in policy order: the infeasible recorded, each running job
    that goes back to its home at its best case placed here (module docstring), every other job
    decided by `GenieRound.decide`. The lean path reads what `kept_job` worked out for the job's
    Placement and the round's state through local names (every running job of a decided round)."""
    jobs, infeasible, likely = genie_round.jobs, genie_round.infeasible, genie_round.admitted
    state = genie_round.state
    builder = genie_round.builder
    snapshot, shape = genie_round.snapshot, genie_round.shape
    claimants, home_plans = state._claimants, state._home_plan
    failed, unfit = state._failed, genie_round.unfit
    free_cpus, free_mem_gb = state.free_cpus, state.free_mem_gb
    held_list, releases = genie_round.held, genie_round.releases
    entries = KEPT_ENTRIES
    best_case = reasons.BEST_CASE
    genie_round.later_gpus = sum(job.num_gpus for pos, job in enumerate(jobs) if likely[pos])
    for pos, job in enumerate(jobs):
        if likely[pos]:
            genie_round.later_gpus -= job.num_gpus
        why = infeasible[pos]
        if why is not None:
            builder.infeasible(pos, why)
            continue
        owner = job.job_id
        current = job.current
        if (
            current is None
            or genie_round.reservation is not None
            or owner not in claimants
            or job.deadline_s is not None
            or job.min_rate_iters_per_s is not None
            or job.gpu_choices
            or job.num_nodes is not None
            or job.cpus_per_gpu_override is not None
            or job.mem_gb_per_gpu_override is not None
        ):
            genie_round.decide(pos, job)
            continue
        assert shape is not None  # a claimant implies a non-empty cluster
        kept = None
        if not unfit and not failed:
            hit = entries.get(id(current))
            if (
                hit is not None
                and hit[0] is current
                and hit[1] is snapshot
                and hit[2] is job.profile
                and hit[3] == owner
                and hit[4] == job.num_gpus
            ):
                kept = hit[5]
            else:
                kept = kept_job(job, snapshot, shape)
        if kept is None:
            if not _keep_home_searched(genie_round, pos, job, shape):
                genie_round.decide(pos, job)
            continue
        # Its placement is its best case's (genie_kept.py): the tests of the searched path below, with
        # what they read of the job worked out already; `unfit` and the failure memo are empty.
        if kept.communicating and genie_round.kappa_qos_held:
            genie_round.decide(pos, job)
            continue
        room_cpus = state.total_free_cpus + PLACEMENT_EPS
        room_mem_gb = state.total_free_mem_gb + PLACEMENT_EPS
        if (
            job.num_gpus > state.free_gpu_count
            or kept.least_cpus > room_cpus
            or kept.least_mem_gb > room_mem_gb
            or kept.cpus > room_cpus
            or kept.mem_gb > room_mem_gb
        ):
            genie_round.decide(pos, job)  # state.totals_allow, for the options, then the best case
            continue
        # home_plan(strict): each share's demand within what is free there; it asks what it held, so
        # the strict test's "no more than held" holds.
        for i, _, cpus, mem_gb in kept.shares:
            if cpus > free_cpus[i] + PLACEMENT_EPS or mem_gb > free_mem_gb[i] + PLACEMENT_EPS:
                break
        else:
            plan = home_plans[owner]
            best = kept.best
            genie_round.found = True
            if not kept.above_share or not genie_round.starves_gpus(plan, best):
                shares = state.take(
                    plan, state.uniform(best.cpus_per_gpu), state.uniform(best.mem_gb_per_gpu), owner
                )
                held = Held(pos, job, shares, best, best_case, False)
                held.top = True  # best_if_kept: no faster point
                held.kept = True  # on its own Placement, as RoundSetup.placed finds
                releases.append((job, kept.speed))
                held_list.append(held)
                if kept.communicating:
                    comm_on_server = genie_round.comm_on_server
                    for i, _ in plan:
                        comm_on_server[i].append(held)
                continue
        genie_round.decide(pos, job)


def _keep_home_searched(genie_round: GenieRound, pos: int, job: JobView, shape: ServerShape) -> bool:
    """The lean path for a job whose placement is not known to be its best case's (or while `unfit` or
    the failure memo holds something), each test worked out from the job's points: True when it placed
    the job, False (nothing changed) when the search must decide it."""
    state = genie_round.state
    owner = job.job_id
    num_gpus = job.num_gpus
    profile = job.profile
    communicating = num_gpus > 1  # interference.communicates
    if communicating and (profile.interference_kappa > 0 or genie_round.kappa_qos_held):
        return False
    points = shape_points(profile, num_gpus, -(-num_gpus // shape.num_gpus), shape)
    options, least_cpus, least_mem_gb = points.best_effort_options()
    if id(options) in genie_round.unfit or not state.totals_allow(num_gpus, least_cpus, least_mem_gb):
        return False
    best = points.best  # options[0]: the best case
    c, m = best.cpus_per_gpu, best.mem_gb_per_gpu
    failed_at = state._failed.get((c, m))
    if failed_at is not None and num_gpus >= failed_at:
        return False
    if not state.totals_allow(num_gpus, c, m):
        return False
    dc, dm = state.uniform(c), state.uniform(m)
    plan = state.home_plan(owner, dc, dm, strict=True)
    if plan is None:
        return False
    genie_round.found = True
    if genie_round.starves_gpus(plan, best):
        return False
    speed = with_penalty(best.speed, profile, len(plan), num_gpus)
    shares = state.take(plan, dc, dm, owner)
    held = Held(pos, job, shares, best, reasons.BEST_CASE, False)
    # No point faster than the best case: the leftover pass would try each and move none.
    held.top = points.fastest_speed <= best.speed + EPS
    genie_round.releases.append((job, speed))
    genie_round.held.append(held)
    if communicating:
        comm_on_server = genie_round.comm_on_server
        for i, _ in plan:
            comm_on_server[i].append(held)
    return True
