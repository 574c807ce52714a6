"""GENIE's lean path for a running job that goes back to its own GPUs at its best case.

Most jobs of a decided round (one where genie_steady.py could not tell the plan: a newcomer, a job
waiting) run already and are decided exactly as they ran: `GenieRound.decide` takes the best-effort
path, tries the best case first, `RoundState.find_uniform` finds the job's home (its claim, the
strict HOME stage) and `place` takes it back. `keep_home` tells that outcome from the same tests in
the same order, without the generic steps that cannot apply to such a job (the QoS need, GPU-count
variants, node counts, fixed demands, interference, a reservation), and records the same placement;
when any test would send `place` elsewhere it returns False having changed nothing, and the caller
decides the job in full. Exact: the same state changes, the same `Held`, the same plan
(tests/scheduler_app/core/test_genie_home.py compares rounds decided with and without it).

Why each test stands for `decide_best_effort` + `place` on such a job:
- the job has no QoS target, no GPU-count choices, no node count and no fixed demand (else it is not
  `decide_best_effort`'s); it still claims its home (`RoundState.release` not called on it), so its
  GPUs are free and `num_gpus <= free_gpu_count`; no reservation stands (no backfill test);
- `unfit` and the free totals of its options, then `find_uniform`'s failure memo and totals for the
  best case, are read as `decide_best_effort` and `find_uniform` read them;
- `find` for an owner with a home and no filters tries the strict home first (`home_plan`); when that
  fails the walk would look elsewhere: the caller decides the job then;
- `starves_gpus`, as `place` asks it for a best case;
- its speed there is the best case's after the spread's slowdown: no interference factor, since it
  either does not communicate or its workload has no interference term; `acceptable` without a need
  is True unless a communicating QoS job with an interference term is placed and this job
  communicates (then the caller decides it);
- `take` of the home plan is `_take_home`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from scheduler_app.core import reasons
from scheduler_app.core.allocators.genie_candidates import Held
from scheduler_app.core.allocators.genie_kept import kept_job
from scheduler_app.core.allocators.genie_points import shape_points
from scheduler_app.core.placement.plan import EPS as PLACEMENT_EPS
from scheduler_app.core.throughput import EPS, ServerShape, with_penalty
from scheduler_app.core.types import JobView

if TYPE_CHECKING:
    from scheduler_app.core.allocators.genie import GenieRound


def keep_home(genie_round: GenieRound, pos: int, job: JobView) -> bool:
    """Place `job` (at `pos`) back on its home at its best case as `GenieRound.decide` would, and
    return True; or change nothing and return False (see the module docstring)."""
    state = genie_round.state
    if (
        genie_round.reservation is not None
        or job.job_id not in state._claimants
        or job.deadline_s is not None
        or job.min_rate_iters_per_s is not None
        or job.gpu_choices
        or job.num_nodes is not None
        or job.cpus_per_gpu_override is not None
        or job.mem_gb_per_gpu_override is not None
    ):
        return False
    shape = genie_round.shape
    assert shape is not None  # a claimant implies a non-empty cluster
    kept = None
    if not genie_round.unfit and not state._failed:
        kept = kept_job(job, genie_round.snapshot, shape)
    if kept is None:
        return _keep_home_searched(genie_round, pos, job, shape)
    # Its placement is its best case's (genie_kept.py): the tests below are those of the searched
    # path with what they read of the job worked out already. `unfit` and the failure memo are empty.
    if kept.communicating and genie_round.kappa_qos_held:
        return False
    num_gpus = job.num_gpus
    best = kept.best
    _, least_cpus, least_mem_gb = kept.options
    room_cpus = state.total_free_cpus + PLACEMENT_EPS
    room_mem_gb = state.total_free_mem_gb + PLACEMENT_EPS
    if (
        num_gpus > state.free_gpu_count
        or num_gpus * least_cpus > room_cpus
        or num_gpus * least_mem_gb > room_mem_gb
        or num_gpus * best.cpus_per_gpu > room_cpus
        or num_gpus * best.mem_gb_per_gpu > room_mem_gb
    ):
        return False  # state.totals_allow, for the options and then for the best case
    # home_plan(strict): each share's demand within what is free there; it asks what it held, so the
    # strict test's "no more than held" holds.
    free_cpus, free_mem_gb = state.free_cpus, state.free_mem_gb
    for i, _, cpus, mem_gb in kept.shares:
        if cpus > free_cpus[i] + PLACEMENT_EPS or mem_gb > free_mem_gb[i] + PLACEMENT_EPS:
            return False
    plan = state._home_plan[job.job_id]
    genie_round.found = True
    if kept.above_share and genie_round.starves_gpus(plan, best):
        return False
    shares = state.take(
        plan, state.uniform(best.cpus_per_gpu), state.uniform(best.mem_gb_per_gpu), job.job_id
    )
    held = Held(pos, job, shares, best, reasons.BEST_CASE, False)
    held.top = True  # best_if_kept: no faster point
    held.kept = True  # on its own Placement, as RoundSetup.placed finds
    genie_round.releases.append((job, kept.speed))
    genie_round.held.append(held)
    if kept.communicating:
        comm_on_server = genie_round.comm_on_server
        for i, _ in plan:
            comm_on_server[i].append(held)
    return True


def _keep_home_searched(genie_round: GenieRound, pos: int, job: JobView, shape: ServerShape) -> bool:
    """keep_home for a job whose placement is not known to be its best case's (or while `unfit` or the
    failure memo holds something): each test worked out from the job's points."""
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
