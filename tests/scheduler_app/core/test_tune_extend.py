"""Plans extended with arrivals behind a stable plan (Allocator.extend): allocate's, or None."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from scheduler_app.core import reasons
from scheduler_app.core.allocators.proportional import ProportionalAllocator
from scheduler_app.core.allocators.tune import TuneAllocator
from scheduler_app.core.allocators.tune_matrix import TuneMatrixAllocator
from scheduler_app.core.engine import extend_round, schedule_round
from scheduler_app.core.types import ClusterSnapshot, JobView, RoundPlan
from tests.builders import make_cluster, make_job
from tests.scheduler_app.core.helpers import outcomes


def _running(jobs: Sequence[JobView], plan: RoundPlan) -> list[JobView]:
    """The jobs one round later: each on the very Placement `plan` gave it."""
    where = plan.placements()
    return [dataclasses.replace(j, current=where.get(j.job_id)) for j in jobs]


def _first(allocator: TuneAllocator, jobs: list[JobView], snapshot: ClusterSnapshot) -> RoundPlan:
    plan = allocator.allocate(jobs, snapshot)
    assert plan.stable and all(d.placement is not None for d in plan.decisions)
    return plan


def test_arrivals_behind_a_stable_plan_get_allocates_plan_with_its_decisions_kept() -> None:
    snapshot = make_cluster(3)
    jobs = [make_job(1, "res18"), make_job(2, "alexnet"), make_job(3, "res50", gpus=1)]
    for allocator in (TuneAllocator(), TuneMatrixAllocator()):
        plan = _first(allocator, jobs, snapshot)
        arrived = [make_job(4, "res18", arrival_s=300.0), make_job(5, "alexnet", arrival_s=300.0)]
        now = [*_running(jobs, plan), *arrived]
        extended = allocator.extend(plan, now, snapshot)
        full = allocator.allocate(now, snapshot)
        assert extended is not None and extended == full and extended.stable and full.stable
        # The running jobs' decisions are the plan's own objects (their Placements are their current).
        assert all(a is b for a, b in zip(extended.decisions, plan.decisions, strict=False))
        assert outcomes(extended)[3:] == [(4, "placed", "best_case"), (5, "placed", "best_case")]


def test_an_arrival_not_admitted_waits_and_one_that_cannot_fit_is_infeasible() -> None:
    snapshot = make_cluster(1)
    jobs = [make_job(1, "res18"), make_job(2, "res18")]
    allocator = TuneAllocator()
    plan = allocator.allocate(jobs, snapshot)  # two res18 at their best case (9 cores each)
    assert plan.stable
    arrived = [
        make_job(10, "res18", gpus=1, arrival_s=300.0),
        make_job(11, "res18", gpus=32, arrival_s=300.0),  # more GPUs than either cluster has
    ]
    now = [*_running(jobs, plan), *arrived]
    extended = allocator.extend(plan, now, snapshot)
    full = allocator.allocate(now, snapshot)
    # The arrival's best case (9 cores) no longer fits beside the two (6 cores left): not stable.
    assert extended is None and not full.stable
    assert outcomes(full)[2:] == [
        (10, "placed", "proportional"),
        (11, "infeasible", reasons.EXCEEDS_CLUSTER_GPUS),
    ]
    # On a cluster with room for its best case the same arrivals extend the plan.
    roomy = make_cluster(2)
    plan = _first(allocator, jobs, roomy)
    now = [*_running(jobs, plan), *arrived]
    extended = allocator.extend(plan, now, roomy)
    assert extended is not None and extended == allocator.allocate(now, roomy) and extended.stable
    assert outcomes(extended)[3] == (11, "infeasible", reasons.EXCEEDS_CLUSTER_GPUS)


def test_a_full_cluster_leaves_the_arrivals_pending() -> None:
    snapshot = make_cluster(1, cpus=96)
    jobs = [make_job(i, "res18") for i in range(1, 9)]  # every GPU, 9 of 12 cores each
    allocator = TuneAllocator()
    plan = _first(allocator, jobs, snapshot)
    now = [*_running(jobs, plan), make_job(9, "res18", arrival_s=300.0)]
    extended = allocator.extend(plan, now, snapshot)
    assert extended is not None and extended == allocator.allocate(now, snapshot) and extended.stable
    assert outcomes(extended)[-1] == (9, "pending", reasons.INSUFFICIENT_GPUS)


def test_not_the_shape_it_extends_answers_none() -> None:
    snapshot = make_cluster(2)
    jobs = [make_job(1, "res18"), make_job(2, "alexnet")]
    allocator = TuneAllocator()
    plan = _first(allocator, jobs, snapshot)
    running = _running(jobs, plan)
    # An arrival with more GPUs than a running job comes first in tune's order.
    assert allocator.extend(plan, [*running, make_job(3, "res18", gpus=2, arrival_s=300.0)], snapshot) is None
    arrival = make_job(3, "res18", arrival_s=300.0)
    # A running job no longer on the plan's Placement, or a job of the plan gone.
    moved = [dataclasses.replace(running[0], current=None), running[1], arrival]
    assert allocator.extend(plan, moved, snapshot) is None
    assert allocator.extend(plan, [running[1], arrival], snapshot) is None
    # No arrival, a plan that is not stable, a fixed demand, the paper's order.
    assert allocator.extend(plan, running, snapshot) is None
    assert allocator.extend(RoundPlan(plan.decisions), [*running, arrival], snapshot) is None
    fixed = make_job(3, "res18", arrival_s=300.0, cpus_per_gpu=2.0)
    assert allocator.extend(plan, [*running, fixed], snapshot) is None
    assert TuneAllocator(order="demand").extend(plan, [*running, arrival], snapshot) is None

    class Other(TuneAllocator):
        def allocate(self, ordered_jobs: Sequence[JobView], snapshot: ClusterSnapshot) -> RoundPlan:
            return super().allocate(ordered_jobs, snapshot)

    assert Other().extend(plan, [*running, arrival], snapshot) is None


def test_extend_round_is_schedule_round() -> None:
    snapshot = make_cluster(2)
    jobs = [make_job(1, "res18"), make_job(2, "alexnet")]
    plan = schedule_round(snapshot, jobs, policy="fifo", allocator="tune", now_s=0.0)
    now = [make_job(3, "res50", arrival_s=300.0), *_running(jobs, plan)]  # fifo orders them
    extended = extend_round(snapshot, now, plan, policy="fifo", allocator="tune", now_s=300.0)
    assert extended is not None
    assert extended == schedule_round(snapshot, now, policy="fifo", allocator="tune", now_s=300.0)
    assert extend_round(snapshot, now, plan, policy="fifo", allocator="proportional", now_s=300.0) is None


def test_proportional_extends_a_stable_plan_as_it_allocates() -> None:
    snapshot = make_cluster(2)
    jobs = [make_job(1, "res18"), make_job(2, "alexnet", gpus=2)]
    allocator = ProportionalAllocator()
    plan = allocator.allocate(jobs, snapshot)
    assert plan.stable
    arrived = [make_job(3, "res50", gpus=4, arrival_s=300.0), make_job(4, "res18", gpus=16, arrival_s=300.0)]
    now = [*_running(jobs, plan), *arrived]
    extended = allocator.extend(plan, now, snapshot)
    assert extended is not None and extended == allocator.allocate(now, snapshot) and extended.stable
    assert all(a is b for a, b in zip(extended.decisions, plan.decisions, strict=False))
    assert outcomes(extended)[2:] == [
        (3, "placed", "proportional"),
        (4, "pending", reasons.INSUFFICIENT_GPUS),
    ]
    # An arrival that can never fit, or a fixed demand: decided in full.
    too_big = make_job(5, "res18", gpus=64, arrival_s=300.0)
    assert allocator.extend(plan, [*_running(jobs, plan), too_big], snapshot) is None
    fixed = make_job(5, "res18", arrival_s=300.0, cpus_per_gpu=2.0)
    assert allocator.extend(plan, [*_running(jobs, plan), fixed], snapshot) is None
