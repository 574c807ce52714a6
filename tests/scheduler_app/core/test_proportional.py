"""ProportionalAllocator on literal clusters, expected placements worked out by hand."""

from __future__ import annotations

import pytest

from scheduler_app.core import reasons
from scheduler_app.core.allocators.proportional import ProportionalAllocator
from scheduler_app.core.types import Outcome
from tests.builders import make_cluster, make_job, make_server
from tests.scheduler_app.core.helpers import outcomes, shares


def test_admission_is_gpu_only_and_lets_smaller_jobs_pass_a_big_one():
    cluster = make_cluster(1)
    jobs = [make_job(1, gpus=4), make_job(2, gpus=8), make_job(3, gpus=4)]
    plan = ProportionalAllocator().allocate(jobs, cluster)
    assert outcomes(plan) == [
        (1, "placed", "proportional"),
        (2, "pending", "insufficient_gpus"),
        (3, "placed", "proportional"),
    ]
    assert shares(plan.decisions[0]) == [(0, (0, 1, 2, 3), 12, 250.0)]
    assert shares(plan.decisions[2]) == [(0, (4, 5, 6, 7), 12, 250.0)]


def test_first_fit_takes_free_gpus_in_cluster_order_like_the_reference():
    # 16 GPUs: job 1 takes s0 0-3, job 2 (8 GPUs) the next eight free GPUs across s0 and s1.
    jobs = [make_job(1, gpus=4), make_job(2, gpus=8), make_job(3, gpus=4), make_job(4, gpus=2)]
    plan = ProportionalAllocator().allocate(jobs, make_cluster(2))
    assert shares(plan.decisions[0]) == [(0, (0, 1, 2, 3), 12, 250.0)]
    assert shares(plan.decisions[1]) == [(0, (4, 5, 6, 7), 12, 250.0), (1, (0, 1, 2, 3), 12, 250.0)]
    assert shares(plan.decisions[2]) == [(1, (4, 5, 6, 7), 12, 250.0)]
    assert plan.decisions[3].reason == reasons.INSUFFICIENT_GPUS
    assert all(d.placement.speedup == 1.0 for d in plan.decisions[:3])


def test_packed_placement_keeps_a_multi_gpu_job_on_one_server():
    jobs = [make_job(1, gpus=4), make_job(2, gpus=8), make_job(3, gpus=4)]
    plan = ProportionalAllocator(placement="packed").allocate(jobs, make_cluster(2))
    assert shares(plan.decisions[0]) == [(0, (0, 1, 2, 3), 12, 250.0)]
    assert shares(plan.decisions[1]) == [(1, tuple(range(8)), 24, 500.0)]
    assert shares(plan.decisions[2]) == [(0, (4, 5, 6, 7), 12, 250.0)]


def test_each_server_gives_its_own_proportional_share():
    cluster = make_cluster([make_server(4, 16, 100, server_id=0), make_server(8, 24, 500, server_id=1)])
    plan = ProportionalAllocator().allocate([make_job(1, gpus=6)], cluster)
    assert shares(plan.decisions[0]) == [(0, (0, 1, 2, 3), 16, 100.0), (1, (0, 1), 6, 125.0)]


def test_uses_only_the_free_gpus_and_the_lowest_free_indices():
    server = make_server(8, 24, 500, free_gpus=(2, 5, 7), free_cpus=9, free_mem_gb=187.5)
    jobs = [make_job(1, gpus=2), make_job(2, gpus=2)]
    plan = ProportionalAllocator().allocate(jobs, make_cluster([server]))
    assert shares(plan.decisions[0]) == [(0, (2, 5), 6, 125.0)]
    assert plan.decisions[1].reason == reasons.INSUFFICIENT_GPUS


def test_infeasible_jobs_are_told_apart_from_pending_ones():
    jobs = [
        make_job(1, gpus=17),  # more GPUs than the cluster has
        make_job(2, gpus=1, cpus_per_gpu=30),  # no server has 30 cores
        make_job(3, gpus=16, mem_gb_per_gpu=300),  # each server holds only one GPU's worth
        make_job(4, gpus=16),
    ]
    plan = ProportionalAllocator().allocate(jobs, make_cluster(2))
    assert outcomes(plan) == [
        (1, "infeasible", "exceeds_cluster_gpus"),
        (2, "infeasible", "exceeds_server_resources"),
        (3, "infeasible", "exceeds_server_resources"),
        (4, "placed", "proportional"),
    ]


def test_fixed_demand_gets_exactly_its_demand_and_proportional_elsewhere():
    plan = ProportionalAllocator().allocate([make_job(1, "res18", gpus=2, cpus_per_gpu=12)], make_cluster(1))
    decision = plan.decisions[0]
    assert decision.reason == reasons.FIXED_DEMAND
    assert shares(decision) == [(0, (0, 1), 24, 125.0)]
    assert decision.placement.speedup == pytest.approx(2.4)  # 12 cores/GPU covers res18's best case


def test_a_fixed_demand_can_starve_a_later_proportional_job():
    jobs = [make_job(1, gpus=1, cpus_per_gpu=24), make_job(2, gpus=1)]
    plan = ProportionalAllocator().allocate(jobs, make_cluster(1))
    assert plan.decisions[0].outcome == Outcome.PLACED
    assert outcomes(plan)[1] == (2, "pending", "fragmented")


def test_rejects_an_unknown_placement_strategy():
    with pytest.raises(ValueError, match="placement"):
        ProportionalAllocator(placement="random")
