"""TuneMatrixAllocator: tune plus intermediate matrix points, worked out by hand."""

from __future__ import annotations

import pytest

from scheduler_app.core.allocators.tune import TuneAllocator
from scheduler_app.core.allocators.tune_matrix import TuneMatrixAllocator
from tests.builders import make_cluster, make_job, make_server
from tests.scheduler_app.core.helpers import outcomes, shares


def test_intermediate_point_when_the_best_case_does_not_fit():
    # 5 free cores: m5 (best 6 cores, 187.5 GB) cannot have its best; (6, 125) and (6, 62.5) need 6
    # cores, (5 cores, 62.5 GB) at 1.4 fits. Plain tune falls back to proportional (3 cores, 1.0).
    cluster = make_cluster([make_server(free_cpus=5)])
    plan = TuneMatrixAllocator().allocate([make_job(1, "m5")], cluster)
    assert outcomes(plan) == [(1, "placed", "intermediate")]
    assert shares(plan.decisions[0]) == [(0, (0,), 5, 62.5)]
    assert plan.decisions[0].placement.speedup == pytest.approx(1.4)
    plan = TuneAllocator().allocate([make_job(1, "m5")], cluster)
    assert outcomes(plan) == [(1, "placed", "proportional")]
    assert shares(plan.decisions[0]) == [(0, (0,), 3, 62.5)]


def test_peers_step_down_instead_of_reverting_whole():
    # As in tune's take-back test (order="demand"), but lstm needs only 4 cores and 80 GB from m5 on s1:
    # m5 (6 cores, 125 GB per GPU) steps down to (5, 62.5) at 1.4, which frees 4 cores and 250 GB.
    # alexnet still reverts whole: res18 needs 12 cores, more than any alexnet point frees.
    jobs = [
        make_job(1, "res18", gpus=4),
        make_job(2, "alexnet", gpus=4),
        make_job(3, "m5", gpus=4),
        make_job(4, "lstm", gpus=4),
    ]
    plan = TuneMatrixAllocator(order="demand").allocate(jobs, make_cluster(2))
    assert outcomes(plan) == [
        (1, "placed", "proportional"),
        (2, "placed", "reverted_to_proportional"),
        (3, "placed", "intermediate"),
        (4, "placed", "best_case"),
    ]
    assert shares(plan.decisions[2]) == [(1, (0, 1, 2, 3), 20, 250.0)]
    assert plan.decisions[2].placement.speedup == pytest.approx(1.4)
    assert shares(plan.decisions[3]) == [(1, (4, 5, 6, 7), 4, 80.0)]
