"""GENIE's minimum-rate QoS kind in the core: the genie allocator's fit and tail, the QoS orders."""

from __future__ import annotations

from dataclasses import replace

import pytest

from profiles_app.catalog import load_catalog
from scheduler_app.core import reasons
from scheduler_app.core.allocators.genie import GenieAllocator, points_by_cost
from scheduler_app.core.policies.edf import EdfPolicy
from scheduler_app.core.policies.swaf import SwafPolicy
from scheduler_app.core.throughput import ServerShape
from scheduler_app.core.types import JobView
from tests.builders import make_cluster, make_job
from tests.scheduler_app.core.helpers import outcomes

RES18 = load_catalog()["res18"]
SHAPE = ServerShape(8, 24.0, 500.0)
PROPORTIONAL_RATE = 1.0 / RES18.iter_time_s  # res18's iterations/s at the proportional share


def rate_job(job_id: int, rate: float, **kwargs) -> JobView:
    return replace(make_job(job_id, **kwargs), min_rate_iters_per_s=rate)


@pytest.mark.parametrize("factor", [0.5, 1.0, 1.7, 2.4])
def test_a_min_rate_job_gets_the_cheapest_point_at_or_above_its_rate(factor):
    job = rate_job(1, factor * PROPORTIONAL_RATE, total_iters=1e6)
    plan = GenieAllocator(work_conserving=False).allocate_at([job], make_cluster(1), 0.0)
    (decision,) = plan.decisions
    assert decision.reason == reasons.QOS_FIT
    # The placement's rate in iterations/s (Placement: speedup / iter_time_s) meets the target...
    assert decision.placement.speedup / RES18.iter_time_s >= factor * PROPORTIONAL_RATE * (1 - 1e-9)
    # ...at the cheapest point that does.
    cheapest = next(p for p in points_by_cost(RES18, 1, SHAPE) if p.speed >= factor - 1e-12)
    assert decision.placement.speedup == pytest.approx(cheapest.speed)


def test_a_low_rate_leaves_cores_free_that_a_deadline_job_would_not_need_either():
    job = rate_job(1, 0.3 * PROPORTIONAL_RATE, total_iters=1e6)
    plan = GenieAllocator(work_conserving=False).allocate_at([job], make_cluster(1), 0.0)
    (decision,) = plan.decisions
    assert decision.placement.shares[0].num_cpus < 3  # below the proportional share


def test_the_rate_needs_no_slack_and_ignores_the_work_left():
    # A deadline's need grows as time runs out; a rate's does not: same point at any time, any progress.
    a = rate_job(1, 1.5 * PROPORTIONAL_RATE, total_iters=1e6)
    b = rate_job(1, 1.5 * PROPORTIONAL_RATE, total_iters=1e6, done_iters=9e5)
    allocator = GenieAllocator(slack=0.5, work_conserving=False)
    first = allocator.allocate_at([a], make_cluster(1), 0.0).decisions[0]
    later = allocator.allocate_at([b], make_cluster(1), 1e7).decisions[0]
    assert first.placement.speedup == pytest.approx(later.placement.speedup)
    assert first.placement.speedup == pytest.approx(
        next(p for p in points_by_cost(RES18, 1, SHAPE) if p.speed >= 1.5).speed
    )


def test_a_rate_above_the_best_case_is_best_effort_and_waits_with_its_own_reason():
    cluster = make_cluster(1, gpus=1, cpus=3, mem_gb=62.5)
    running = make_job(1, total_iters=1e6)
    too_fast = rate_job(2, 3.0 * PROPORTIONAL_RATE, total_iters=1e6)  # res18's best case is 2.4x
    plan = GenieAllocator().allocate_at([running, too_fast], cluster, 0.0)
    assert outcomes(plan) == [(1, "placed", reasons.BEST_CASE), (2, "pending", reasons.MIN_RATE_UNATTAINABLE)]
    alone = GenieAllocator(work_conserving=False).allocate_at([too_fast], make_cluster(1), 0.0)
    assert outcomes(alone) == [(2, "placed", reasons.BEST_CASE)]  # best effort still runs with room


def test_a_rate_job_that_does_not_fit_now_reserves_and_blocks_long_jobs():
    # Job 1 holds 2 of 3 GPUs; the rate job needs 3. Job 3 would hold a GPU past the reservation.
    cluster = make_cluster(1, gpus=3, cpus=27, mem_gb=1500.0)
    jobs = [
        make_job(1, gpus=2, total_iters=1000.0 / RES18.iter_time_s),
        rate_job(2, 1.0 * PROPORTIONAL_RATE, gpus=3, total_iters=1e6),
        make_job(3, total_iters=1e6),
    ]
    plan = GenieAllocator(work_conserving=False).allocate_at(jobs, cluster, 0.0)
    assert outcomes(plan) == [
        (1, "placed", reasons.BEST_CASE),
        (2, "pending", reasons.INSUFFICIENT_GPUS),
        (3, "pending", reasons.RESERVED_FOR_QOS),
    ]


def test_a_spread_job_covers_the_placement_penalty_too():
    # 16 GPUs span two 8-GPU servers, where the model gives no CPU speed-up (best case 1.0) and the
    # penalty divides the speed by 1.5: 0.6x is reachable (0.6 x 1.5 <= 1), 0.8x is not, although
    # 0.8 would be without the penalty.
    profile = replace(RES18, placement_penalty=1.5)
    job = replace(rate_job(1, 0.6 * PROPORTIONAL_RATE, gpus=16, total_iters=1e6), profile=profile)
    plan = GenieAllocator(work_conserving=False).allocate_at([job], make_cluster(2), 0.0)
    (decision,) = plan.decisions
    assert decision.reason == reasons.QOS_FIT
    assert decision.placement.speedup / RES18.iter_time_s >= 0.6 * PROPORTIONAL_RATE * (1 - 1e-9)
    too_fast = replace(job, min_rate_iters_per_s=0.8 * PROPORTIONAL_RATE)
    plan = GenieAllocator(work_conserving=False).allocate_at([too_fast], make_cluster(2), 0.0)
    assert outcomes(plan) == [(1, "placed", reasons.BEST_CASE)]  # best effort: not a QoS fit
    no_penalty = replace(too_fast, profile=RES18)
    plan = GenieAllocator(work_conserving=False).allocate_at([no_penalty], make_cluster(2), 0.0)
    assert plan.decisions[0].reason == reasons.QOS_FIT


def test_swaf_puts_rate_jobs_after_feasible_deadlines_and_before_late_and_best_effort_jobs():
    cluster = make_cluster(1)
    best_effort = make_job(1, arrival_s=0.0, total_iters=1e4)
    late = make_job(2, arrival_s=1.0, total_iters=1e6, deadline_s=10.0)
    rate_b = rate_job(3, PROPORTIONAL_RATE, arrival_s=3.0, total_iters=1e4)
    rate_a = rate_job(4, PROPORTIONAL_RATE, arrival_s=2.0, total_iters=1e6)
    feasible = make_job(5, arrival_s=4.0, total_iters=1e4, deadline_s=1e7)
    unattainable_rate = rate_job(6, 10 * PROPORTIONAL_RATE, arrival_s=0.5, total_iters=1e2)
    order = SwafPolicy().order([best_effort, late, rate_b, rate_a, feasible, unattainable_rate], cluster, 0.0)
    # Late tail: shortest best-case execution first (job 6 is tiny).
    assert [j.job_id for j in order] == [5, 4, 3, 6, 2, 1]


def test_edf_puts_rate_jobs_between_deadline_jobs_and_jobs_without_a_target():
    jobs = [
        make_job(1, arrival_s=0.0),
        rate_job(2, PROPORTIONAL_RATE, arrival_s=2.0),
        rate_job(3, PROPORTIONAL_RATE, arrival_s=1.0),
        make_job(4, arrival_s=3.0, deadline_s=50.0),
    ]
    assert [j.job_id for j in EdfPolicy().order(jobs, make_cluster(1), 0.0)] == [4, 3, 2, 1]
