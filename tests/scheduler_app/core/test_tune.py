"""TuneAllocator (Synergy-TUNE) on literal clusters, expected placements worked out by hand."""

from __future__ import annotations

import pytest

from scheduler_app.core import reasons
from scheduler_app.core.allocators.tune import TuneAllocator
from tests.builders import make_cluster, make_job, make_server
from tests.scheduler_app.core.helpers import outcomes, shares


def test_default_order_places_in_policy_order_within_a_gpu_count():
    # One GPU each: res18 is placed first (policy order), alexnet beside it; both at best case.
    jobs = [make_job(1, "res18"), make_job(2, "alexnet")]
    plan = TuneAllocator().allocate(jobs, make_cluster(1))
    assert outcomes(plan) == [(1, "placed", "best_case"), (2, "placed", "best_case")]
    assert shares(plan.decisions[0]) == [(0, (0,), 9, 62.5)]
    assert shares(plan.decisions[1]) == [(0, (1,), 12, 125.0)]


def test_default_order_puts_more_gpus_first():
    # 1-GPU res18 before a 4-GPU res50 in policy order; the 4-GPU job is placed first (GPU 0-3).
    jobs = [make_job(1, "res18"), make_job(2, "res50", gpus=4)]
    plan = TuneAllocator().allocate(jobs, make_cluster(1))
    assert [s[1] for s in shares(plan.decisions[1])] == [(0, 1, 2, 3)]
    assert [s[1] for s in shares(plan.decisions[0])] == [(4,)]


def test_best_case_when_it_fits_decisions_in_input_order():
    # order="demand" (the paper's text): sorted by CPU demand alexnet (12) goes first, but
    # decisions keep the policy order.
    jobs = [make_job(1, "res18"), make_job(2, "alexnet")]
    plan = TuneAllocator(order="demand").allocate(jobs, make_cluster(1))
    assert outcomes(plan) == [(1, "placed", "best_case"), (2, "placed", "best_case")]
    assert shares(plan.decisions[1]) == [(0, (0,), 12, 125.0)]
    assert shares(plan.decisions[0]) == [(0, (1,), 9, 62.5)]
    assert plan.decisions[1].placement.speedup == pytest.approx(2.94)
    assert plan.decisions[0].placement.speedup == pytest.approx(2.4)


def test_capped_best_case():
    plan = TuneAllocator().allocate([make_job(1, "res18", gpus=4)], make_cluster(1))
    assert shares(plan.decisions[0]) == [(0, (0, 1, 2, 3), 24, 250.0)]
    assert plan.decisions[0].placement.speedup == pytest.approx(1.7)


def test_downgrade_to_proportional_when_the_best_case_does_not_fit():
    # alexnet 12 + res18 9 leave 3 cores: the second res18 runs at its proportional share.
    jobs = [make_job(1, "alexnet"), make_job(2, "res18"), make_job(3, "res18")]
    plan = TuneAllocator().allocate(jobs, make_cluster(1))
    assert outcomes(plan) == [
        (1, "placed", "best_case"),
        (2, "placed", "best_case"),
        (3, "placed", "proportional"),
    ]
    assert shares(plan.decisions[2]) == [(0, (2,), 3, 62.5)]
    assert plan.decisions[2].placement.speedup == 1.0


def test_surplus_taken_back_from_peers_so_every_admitted_job_runs():
    # order="demand", sorted by (GPUs, CPU, memory): alexnet, m5 (both 6 cores and 125 GB per GPU,
    # capped), res18, lstm.
    # alexnet fills s0 (24 cores), m5 fills s1 (24 cores, 500 GB). res18 fits nowhere, even at
    # proportional: s0 (first server with 4 free GPUs) takes alexnet back to proportional, res18
    # goes there. lstm (1 core, 20 GB, no downgrade) then takes m5 back on s1.
    jobs = [
        make_job(1, "res18", gpus=4),
        make_job(2, "alexnet", gpus=4),
        make_job(3, "m5", gpus=4),
        make_job(4, "lstm", gpus=4),
        make_job(5, "res18", gpus=1),
    ]
    plan = TuneAllocator(order="demand").allocate(jobs, make_cluster(2))
    assert outcomes(plan) == [
        (1, "placed", "proportional"),
        (2, "placed", "reverted_to_proportional"),
        (3, "placed", "reverted_to_proportional"),
        (4, "placed", "best_case"),
        (5, "pending", "insufficient_gpus"),
    ]
    assert shares(plan.decisions[0]) == [(0, (4, 5, 6, 7), 12, 250.0)]
    assert shares(plan.decisions[1]) == [(0, (0, 1, 2, 3), 12, 250.0)]
    assert shares(plan.decisions[2]) == [(1, (0, 1, 2, 3), 12, 250.0)]
    assert shares(plan.decisions[3]) == [(1, (4, 5, 6, 7), 4, 80.0)]
    assert [d.placement.speedup for d in plan.decisions[:4]] == [1.0, 1.0, 1.0, 1.0]


def test_peers_spanning_fewer_servers_give_back_first():
    # Three free GPUs on each server, s1 with only 12 free cores.
    # alexnet x4 (capped to 6 cores / 125 GB per GPU) fits no server whole: spread s0 x3, s1 x1.
    # res50 (4 cores) then takes s1's GPU 6; deepspeech (3 cores, its best = proportional) finds
    # 2 cores. On s1 the single-server res50 gives back first, though alexnet has more CPU/GPU.
    s0 = make_server(8, 24, 500, server_id=0, free_gpus=(5, 6, 7))
    s1 = make_server(8, 24, 500, server_id=1, free_gpus=(5, 6, 7), free_cpus=12)
    jobs = [make_job(1, "alexnet", gpus=4), make_job(2, "res50"), make_job(3, "deepspeech")]
    plan = TuneAllocator().allocate(jobs, make_cluster([s0, s1]))
    assert outcomes(plan) == [
        (1, "placed", "best_case"),
        (2, "placed", "reverted_to_proportional"),
        (3, "placed", "best_case"),
    ]
    assert shares(plan.decisions[0]) == [(0, (5, 6, 7), 18, 375.0), (1, (5,), 6, 125.0)]
    assert shares(plan.decisions[1]) == [(1, (6,), 3, 62.5)]
    assert shares(plan.decisions[2]) == [(1, (7,), 3, 62.5)]
    assert plan.decisions[0].placement.speedup == pytest.approx(1 + 1.94 / 3)


def test_multi_gpu_job_prefers_the_fullest_server_that_fits():
    s0 = make_server(server_id=0)
    s1 = make_server(server_id=1, free_gpus=(4, 5, 6, 7))
    plan = TuneAllocator().allocate([make_job(1, "deepspeech", gpus=2)], make_cluster([s0, s1]))
    assert shares(plan.decisions[0]) == [(1, (4, 5), 6, 125.0)]


def test_first_fit_option_is_the_reference_benchmark_placement():
    s0 = make_server(server_id=0, free_gpus=(6, 7))
    plan = TuneAllocator(placement="first_fit").allocate(
        [make_job(1, "deepspeech", gpus=4)], make_cluster([s0, make_server(server_id=1)])
    )
    assert shares(plan.decisions[0]) == [(0, (6, 7), 6, 125.0), (1, (0, 1), 6, 125.0)]


def test_fixed_demand_is_exact_and_never_taken_back():
    jobs = [make_job(1, "lstm", gpus=1, cpus_per_gpu=20), make_job(2, "res18", gpus=1)]
    plan = TuneAllocator().allocate(jobs, make_cluster(1))
    assert outcomes(plan) == [(1, "placed", "fixed_demand"), (2, "placed", "proportional")]
    assert shares(plan.decisions[0]) == [(0, (0,), 20, 62.5)]
    assert shares(plan.decisions[1]) == [(0, (1,), 3, 62.5)]
    # Only 1 core left for a third job; the fixed job is not a peer to take back from.
    plan = TuneAllocator().allocate([*jobs, make_job(3, "res18")], make_cluster(1))
    assert outcomes(plan)[2] == (3, "pending", "fragmented")


def test_infeasible_and_not_admitted():
    jobs = [make_job(1, gpus=9), make_job(2, gpus=1, mem_gb_per_gpu=600), make_job(3, gpus=8), make_job(4)]
    plan = TuneAllocator().allocate(jobs, make_cluster(1))
    assert outcomes(plan) == [
        (1, "infeasible", reasons.EXCEEDS_CLUSTER_GPUS),
        (2, "infeasible", reasons.EXCEEDS_SERVER_RESOURCES),
        (3, "placed", reasons.BEST_CASE),  # res18 x8 capped to 3 cores/GPU: speed-up 1
        (4, "pending", reasons.INSUFFICIENT_GPUS),
    ]
    assert plan.decisions[2].placement.speedup == pytest.approx(1.0)
