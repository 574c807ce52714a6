"""GENIE's QoS-aware allocator: smallest point meeting the deadline, best-effort tail, EASY reservation."""

from __future__ import annotations

import pytest

from profiles_app.catalog import load_catalog
from scheduler_app.core import reasons
from scheduler_app.core.allocators.genie import GenieAllocator, points_by_cost
from scheduler_app.core.throughput import ServerShape
from tests.builders import make_cluster, make_job
from tests.scheduler_app.core.helpers import outcomes

RES18 = load_catalog()["res18"]
SHAPE = ServerShape(8, 24.0, 500.0)


def work(seconds: float) -> float:
    """Iterations of res18 taking `seconds` at the proportional share."""
    return seconds / RES18.iter_time_s


def test_points_are_pareto_efficient_and_cheapest_first():
    points = points_by_cost(RES18, 1, SHAPE)
    costs = [p.cpus_per_gpu / 3 + p.mem_gb_per_gpu / 62.5 for p in points]
    assert costs == sorted(costs)
    for p in points:
        assert not any(
            q.speed >= p.speed
            and q.cpus_per_gpu <= p.cpus_per_gpu
            and q.mem_gb_per_gpu <= p.mem_gb_per_gpu
            and q != p
            for q in points
        )
    assert max(p.speed for p in points) == pytest.approx(2.4)  # res18's best case


@pytest.mark.parametrize(("deadline_s", "need"), [(100_000.0, 0.1), (1500.0, 2.0)])
def test_a_qos_job_gets_the_cheapest_point_meeting_its_deadline(deadline_s, need):
    # 2,400 s of work at proportional; slack 1: the speed needed is 2400 / deadline.
    job = make_job(1, total_iters=work(2400.0), deadline_s=deadline_s)
    plan = GenieAllocator(slack=1.0, work_conserving=False).allocate_at([job], make_cluster(1), 0.0)
    (decision,) = plan.decisions
    assert decision.reason == reasons.QOS_FIT
    assert decision.placement.speedup >= 2400.0 / deadline_s - 1e-9
    cheapest = next(p for p in points_by_cost(RES18, 1, SHAPE) if p.speed >= 2400.0 / deadline_s)
    assert decision.placement.speedup == pytest.approx(cheapest.speed)
    share = decision.placement.shares[0]
    if need < 1:
        assert share.num_cpus < 3  # below the proportional share: the rest stays free
    assert share.num_cpus <= 9  # never more than its best case


def test_leftovers_go_to_placed_jobs_when_work_conserving():
    job = make_job(1, total_iters=work(2400.0), deadline_s=100_000.0)
    plan = GenieAllocator().allocate_at([job], make_cluster(1), 0.0)
    (decision,) = plan.decisions
    assert decision.reason == reasons.LEFTOVER and decision.placement.speedup == pytest.approx(2.4)


def test_a_late_job_is_best_effort_and_waits_with_qos_unattainable():
    cluster = make_cluster(1, gpus=1, cpus=3, mem_gb=62.5)
    running = make_job(1, total_iters=work(1000.0))
    late = make_job(2, total_iters=work(1000.0), deadline_s=500.0)  # needs 2x, best on 3 cores is 1x
    plan = GenieAllocator().allocate_at([running, late], cluster, 0.0)
    assert outcomes(plan) == [(1, "placed", reasons.BEST_CASE), (2, "pending", reasons.QOS_UNATTAINABLE)]
    alone = GenieAllocator().allocate_at([late], cluster, 0.0)
    assert outcomes(alone)[0][1] == "placed"  # best effort still runs when there is room


def reservation_round(qos_deadline_s: float):
    """3 GPUs with room for every best case (9 cores). Job 1 (1 GPU, 1,000 s of work at 2.4x) ends at
    417 s. Job 2 (QoS, 3 GPUs, 3,000 s of work: 1,250 s at 2.4x) cannot start before then. Job 3 (300 s
    of work, 125 s at 2.4x) ends before 417 s; job 4 (5,000 s) would hold a GPU past it."""
    cluster = make_cluster(1, gpus=3, cpus=27, mem_gb=1500.0)
    jobs = [
        make_job(1, total_iters=work(1000.0)),
        make_job(2, gpus=3, total_iters=work(3000.0), deadline_s=qos_deadline_s),
        make_job(3, total_iters=work(300.0)),
        make_job(4, total_iters=work(5000.0)),
    ]
    return GenieAllocator(work_conserving=False).allocate_at(jobs, cluster, 0.0)


def test_reservation_backfills_only_jobs_that_do_not_delay_it():
    # Job 2 is reserved for 417 s: job 3 ends before that (backfilled), job 4 would not (it waits).
    plan = reservation_round(20_000.0)
    assert outcomes(plan) == [
        (1, "placed", reasons.BEST_CASE),
        (2, "pending", reasons.INSUFFICIENT_GPUS),
        (3, "placed", reasons.BACKFILLED),
        (4, "pending", reasons.RESERVED_FOR_QOS),
    ]


def test_slack_is_checked():
    with pytest.raises(ValueError, match="slack"):
        GenieAllocator(slack=0)


def test_a_best_case_never_keeps_a_later_admitted_job_off_free_gpus():
    # res18 on 4 GPUs would take every core of the 24-core server at its best case; the second
    # 4-GPU job, which GPU admission expects to place, would then wait beside 4 free GPUs. Both run:
    # 12 cores each, none left over.
    jobs = [make_job(1, gpus=4), make_job(2, gpus=4)]
    plan = GenieAllocator().allocate_at(jobs, make_cluster(1), 0.0)
    assert outcomes(plan) == [(1, "placed", reasons.PROPORTIONAL), (2, "placed", reasons.PROPORTIONAL)]
    assert [d.placement.num_cpus for d in plan.decisions] == [12, 12]
    # Alone, the job gets its best case (capped at the server): nobody after it needs the cores.
    (alone,) = GenieAllocator().allocate_at(jobs[:1], make_cluster(1), 0.0).decisions
    assert alone.reason == reasons.BEST_CASE and alone.placement.num_cpus == 24


def test_an_urgent_job_that_meets_its_deadline_only_without_the_slack_still_gets_a_qos_fit():
    # 2,400 s of work, deadline 1,100 s: it needs 2.18x, res18's best case is 2.4x. With slack 0.8 it
    # would need 2.73x; the margin is dropped rather than the job (PAPERS §2.3: WA >= 0 is feasible).
    job = make_job(1, total_iters=work(2400.0), deadline_s=1100.0)
    plan = GenieAllocator(slack=0.8, work_conserving=False).allocate_at([job], make_cluster(1), 0.0)
    (decision,) = plan.decisions
    assert decision.reason == reasons.QOS_FIT
    assert decision.placement.speedup >= 2400.0 / 1100.0 - 1e-9


def test_no_reservation_for_a_job_that_would_miss_its_deadline_from_it():
    # Job 2's deadline (1,500 s) is met only if it starts now (1,250 s at 2.4x); from the reservation
    # at 417 s it would miss. PAPERS §2.3 step 4 reserves only when t' + E <= D, so job 4 is not held
    # back for it.
    plan = reservation_round(1500.0)
    assert outcomes(plan) == [
        (1, "placed", reasons.BEST_CASE),
        (2, "pending", reasons.INSUFFICIENT_GPUS),
        (3, "placed", reasons.BEST_CASE),
        (4, "placed", reasons.BEST_CASE),
    ]
