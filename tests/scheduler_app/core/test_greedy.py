"""GreedyAllocator (Synergy-GREEDY) on literal clusters, worked out by hand."""

from __future__ import annotations

import pytest

from scheduler_app.core.allocators.greedy import GreedyAllocator
from tests.builders import make_cluster, make_job, make_server
from tests.scheduler_app.core.helpers import outcomes, shares


def test_best_case_first_fit_skips_what_does_not_fit():
    jobs = [
        make_job(1, "res18"),  # 9 cores
        make_job(2, "res18"),  # 9 cores -> 6 cores left
        make_job(3, "res18"),  # needs 9: GPUs are free, cores are not -> fragmented
        make_job(4, "lstm"),  # 1 core, 20 GB: fits
        make_job(5, "res18", gpus=8),  # only 5 GPUs left -> insufficient_gpus
    ]
    plan = GreedyAllocator().allocate(jobs, make_cluster(1))
    assert outcomes(plan) == [
        (1, "placed", "best_case"),
        (2, "placed", "best_case"),
        (3, "pending", "fragmented"),
        (4, "placed", "best_case"),
        (5, "pending", "insufficient_gpus"),
    ]
    assert shares(plan.decisions[0]) == [(0, (0,), 9, 62.5)]
    assert shares(plan.decisions[1]) == [(0, (1,), 9, 62.5)]
    assert shares(plan.decisions[3]) == [(0, (2,), 1, 20.0)]
    assert plan.decisions[0].placement.speedup == pytest.approx(2.4)
    assert plan.decisions[3].placement.speedup == pytest.approx(1.0)


def test_capped_best_case_on_one_server():
    plan = GreedyAllocator().allocate([make_job(1, "res18", gpus=4)], make_cluster(1))
    assert shares(plan.decisions[0]) == [(0, (0, 1, 2, 3), 24, 250.0)]
    assert plan.decisions[0].placement.speedup == pytest.approx(1.7)


def test_first_fit_spreads_over_servers_in_cluster_order():
    busy = make_server(8, 24, 500, server_id=0, free_gpus=(6, 7))
    cluster = make_cluster([busy, make_server(server_id=1)])
    plan = GreedyAllocator().allocate([make_job(1, "deepspeech", gpus=4)], cluster)
    assert shares(plan.decisions[0]) == [(0, (6, 7), 6, 125.0), (1, (0, 1), 6, 125.0)]


def test_a_skipped_job_does_not_block_later_ones():
    jobs = [make_job(1, "res18", gpus=2), make_job(2, "alexnet", gpus=2), make_job(3, "lstm", gpus=2)]
    # res18 x2: 18 cores; alexnet x2 needs 24 -> fragmented; lstm x2: 2 cores fit.
    plan = GreedyAllocator().allocate(jobs, make_cluster(1))
    assert outcomes(plan) == [
        (1, "placed", "best_case"),
        (2, "pending", "fragmented"),
        (3, "placed", "best_case"),
    ]
