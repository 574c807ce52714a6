"""The shared placement helpers: infeasibility, GPU admission, server choice and the failure memo."""

from __future__ import annotations

import pytest

from scheduler_app.core import reasons
from scheduler_app.core.placement import (
    FIRST_FIT,
    PACKED,
    RoundState,
    gpu_admission,
    infeasible_reason,
    infeasible_reasons,
)
from tests.builders import make_cluster, make_job, make_server


def test_infeasible_reason():
    cluster = make_cluster([make_server(8, 24, 500, server_id=0), make_server(4, 8, 100, server_id=1)])
    assert infeasible_reason(make_job(1, gpus=12), cluster) is None
    assert infeasible_reason(make_job(1, gpus=13), cluster) == reasons.EXCEEDS_CLUSTER_GPUS
    # 3 cores per GPU: 8 GPUs on server 0, 2 on server 1 -> 10 holdable.
    assert infeasible_reason(make_job(1, gpus=10, cpus_per_gpu=3), cluster) is None
    too_many = reasons.EXCEEDS_SERVER_RESOURCES
    assert infeasible_reason(make_job(1, gpus=11, cpus_per_gpu=3), cluster) == too_many
    assert infeasible_reason(make_job(1, gpus=1, mem_gb_per_gpu=501), cluster) == too_many
    assert infeasible_reasons([make_job(1), make_job(2, gpus=99)], cluster) == [None, "exceeds_cluster_gpus"]


def test_infeasible_reason_rejects_a_job_without_gpus():
    with pytest.raises(ValueError, match="num_gpus"):
        infeasible_reason(make_job(1, gpus=0), make_cluster(1))


def test_gpu_admission_skips_infeasible_and_lets_small_jobs_pass():
    jobs = [make_job(1, gpus=6), make_job(2, gpus=4), make_job(3, gpus=20), make_job(4, gpus=2)]
    assert gpu_admission(jobs, [None, None, "exceeds_cluster_gpus", None], 8) == [True, False, False, True]


def test_packed_prefers_the_fullest_fitting_server_then_spreads_from_the_fullest():
    cluster = make_cluster(
        [
            make_server(server_id=0),  # 8 free
            make_server(server_id=1, free_gpus=(0, 1, 2)),  # 3 free
            make_server(server_id=2, free_gpus=(5,)),  # 1 free
        ]
    )
    state = RoundState(cluster)
    c, m = state.uniform(3.0), state.uniform(62.5)
    assert state.find_packed(3, c, m) == [(1, 3)]  # fewest free GPUs that hold all three
    assert state.find_packed(1, c, m) == [(2, 1)]  # single GPU: the fullest server
    assert state.find_packed(9, c, m) == [(2, 1), (1, 3), (0, 5)]  # spread, fullest first
    assert state.find_first_fit(9, c, m) == [(0, 8), (1, 1)]  # cluster order


def test_take_uses_lowest_free_indices_and_updates_free_resources():
    state = RoundState(make_cluster([make_server(free_gpus=(7, 2, 5))]))
    (share,) = state.take([(0, 2)], state.uniform(4.5), state.uniform(100.0))
    assert share.gpu_indices == (2, 5)
    assert (state.num_free[0], state.free_cpus[0], state.free_mem_gb[0]) == (1, 15.0, 300.0)
    (out,) = state.server_shares([share])
    assert (out.num_cpus, out.mem_gb) == (9, 200.0)


def test_find_uniform_remembers_failures_until_something_is_freed():
    state = RoundState(make_cluster(1))
    (held,) = state.take([(0, 2)], state.uniform(12.0), state.uniform(62.5))  # all 24 cores
    assert state.find_uniform(PACKED, 1, 3.0, 62.5) is None
    assert state._failed[(3.0, 62.5)] == 1
    assert state.find_uniform(FIRST_FIT, 4, 3.0, 62.5) is None  # more GPUs: known to fail
    state.adjust(held, 6.0, 125.0)  # give 18 cores back
    assert state.find_uniform(PACKED, 1, 3.0, 62.5) == [(0, 1)]
