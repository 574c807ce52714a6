"""Each policy's order on literal inputs, worked out by hand."""

from __future__ import annotations

import dataclasses

import pytest

from scheduler_app.core.policies import POLICIES
from scheduler_app.core.policies.aging import Aging
from scheduler_app.core.policies.fairshare import FairSharePolicy
from scheduler_app.core.policies.fifo import FifoPolicy
from scheduler_app.core.policies.ftf import FtfPolicy, finish_time_fairness
from scheduler_app.core.policies.las import LasPolicy
from scheduler_app.core.policies.srtf import SrtfPolicy
from scheduler_app.core.throughput import REFERENCE_SHAPE
from tests.builders import make_cluster, make_job

CLUSTER = make_cluster(2)


def ids(jobs):
    return [j.job_id for j in jobs]


def test_registered_names():
    assert {"fifo", "srtf", "las", "ftf"} <= set(POLICIES.names())


def test_fifo_orders_by_arrival_then_job_id():
    arrivals = {1: 30, 7: 10, 5: 10, 2: 20}
    jobs = [make_job(job_id, arrival_s=arrival_s) for job_id, arrival_s in arrivals.items()]
    assert ids(FifoPolicy().order(jobs, CLUSTER, now_s=100)) == [5, 7, 2, 1]


def test_every_policy_serves_higher_priority_first():
    jobs = [make_job(1, arrival_s=0), make_job(2, arrival_s=50, priority=1)]
    for name in ("fifo", "srtf", "las", "ftf", "fairshare"):
        assert ids(POLICIES.get(name)().order(jobs, CLUSTER, now_s=100))[0] == 2, name


def test_policies_do_not_mutate_their_input():
    jobs = [make_job(2, arrival_s=5), make_job(1, arrival_s=0)]
    before = list(jobs)
    for name in POLICIES.names():
        POLICIES.get(name)().order(jobs, CLUSTER, now_s=10)
    assert jobs == before


def test_srtf_orders_by_remaining_time_at_proportional_speed():
    jobs = [
        make_job(1, "res18", total_iters=1000, done_iters=500),  # 500 x 0.64 = 320 s
        make_job(2, "lstm", total_iters=10_000),  # 10000 x 0.011 = 110 s
        make_job(3, "alexnet", total_iters=1000, done_iters=900),  # 100 x 0.6 = 60 s
    ]
    assert ids(SrtfPolicy().order(jobs, CLUSTER, now_s=0)) == [3, 2, 1]


def test_srtf_speedup_aware_divides_by_the_best_case_speedup():
    jobs = [
        make_job(1, "res18", total_iters=200),  # 128 s, or 128 / 2.4 = 53.3 s
        make_job(2, "lstm", total_iters=10_000),  # 110 s either way
    ]
    assert ids(SrtfPolicy().order(jobs, CLUSTER, now_s=0)) == [2, 1]
    assert ids(SrtfPolicy(speedup_aware=True).order(jobs, CLUSTER, now_s=0)) == [1, 2]


def test_srtf_common_order_is_the_general_keys_order():
    """The plain order (no aging, proportional speed) sorts by the same keys as with an aging rule that
    ages nobody: remaining time with progress past the total counted as none, ties by arrival, id."""
    models = ("res18", "res50", "gnmt", "lstm", "deepspeech")
    jobs = [
        make_job(
            i,
            models[i % len(models)],
            arrival_s=float(i % 7),
            total_iters=1000.0 + 37 * (i % 11),
            done_iters=float((i * 53) % 1300),
            priority=i % 3 == 0,
        )
        for i in range(60)
    ]
    plain = SrtfPolicy().order(jobs, CLUSTER, now_s=0.0)
    nobody_aged = SrtfPolicy(aging=Aging(factor=1e9, floor_s=1e12)).order(jobs, CLUSTER, now_s=0.0)
    assert ids(plain) == ids(nobody_aged)


def test_srtf_ties_break_by_arrival_then_id():
    jobs = [make_job(3, arrival_s=5), make_job(2, arrival_s=1), make_job(1, arrival_s=5)]
    assert ids(SrtfPolicy().order(jobs, CLUSTER, now_s=10)) == [2, 1, 3]


def test_las_orders_by_attained_gpu_seconds():
    jobs = [
        make_job(1, attained_service_gpu_s=500),
        make_job(2, attained_service_gpu_s=0, arrival_s=9),
        make_job(3, attained_service_gpu_s=100),
        make_job(4, attained_service_gpu_s=0, arrival_s=3),
    ]
    assert ids(LasPolicy().order(jobs, CLUSTER, now_s=10)) == [4, 2, 3, 1]


FTF_JOBS = [
    # rho = ((now - arrival) + remaining) / ideal, at now = 1000
    make_job(1, "res18", arrival_s=0, total_iters=1000),  # (1000 + 640) / 640 = 2.5625
    make_job(2, "lstm", arrival_s=900, total_iters=10_000),  # (100 + 110) / 110 = 1.909
    make_job(3, "alexnet", arrival_s=500, total_iters=100, done_iters=50),  # (500 + 30) / 60 = 8.83
]


def test_finish_time_fairness_values():
    rhos = [finish_time_fairness(j, 1000) for j in FTF_JOBS]
    assert rhos == pytest.approx([1640 / 640, 210 / 110, 530 / 60])


def test_ftf_serves_the_largest_rho_first_like_themis():
    assert ids(FtfPolicy().order(FTF_JOBS, CLUSTER, now_s=1000)) == [3, 1, 2]


def test_ftf_repo_order_sorts_ascending_like_the_reference():
    assert ids(FtfPolicy(repo_order=True).order(FTF_JOBS, CLUSTER, now_s=1000)) == [2, 1, 3]


def test_ftf_ties_break_by_arrival_then_id_in_both_orders():
    jobs = [make_job(9, arrival_s=0), make_job(4, arrival_s=0)]  # identical rho
    assert ids(FtfPolicy().order(jobs, CLUSTER, now_s=10)) == [4, 9]
    assert ids(FtfPolicy(repo_order=True).order(jobs, CLUSTER, now_s=10)) == [4, 9]


def test_ftf_speedup_aware_shrinks_the_remaining_time():
    res18 = make_job(1, "res18", arrival_s=0, total_iters=1000)  # ideal 640 s
    # rho = (100 + 640) / 640 = 1.156 at proportional speed, (100 + 640 / 2.4) / 640 = 0.573 aware
    assert finish_time_fairness(res18, 100, REFERENCE_SHAPE) == pytest.approx((100 + 640 / 2.4) / 640)
    lstm = make_job(2, "lstm", arrival_s=0, total_iters=40_000, done_iters=20_000)  # (100 + 220) / 440
    assert ids(FtfPolicy().order([res18, lstm], CLUSTER, now_s=100)) == [1, 2]
    assert ids(FtfPolicy(speedup_aware=True).order([res18, lstm], CLUSTER, now_s=100)) == [2, 1]


ALICE, BOB = 1, 2


def owned(job_id, owner, arrival_s, *, usage=0.0, gpu_s=3600.0):
    """A one-GPU job of `owner` that still needs `gpu_s` GPU-seconds at proportional speed."""
    job = make_job(job_id, arrival_s=arrival_s)
    return dataclasses.replace(
        job,
        owner_id=owner,
        owner_usage_gpu_s=usage,
        total_iters=gpu_s / job.profile.iter_time_s,
    )


def test_fairshare_interleaves_users_instead_of_serving_one_users_burst_first():
    # Alice queued three 1-h jobs before Bob's one: Bob's goes second, not fourth.
    jobs = [owned(1, ALICE, 0), owned(2, ALICE, 1), owned(3, ALICE, 2), owned(4, BOB, 3)]
    assert ids(FairSharePolicy().order(jobs, CLUSTER, now_s=10)) == [1, 4, 2, 3]
    assert ids(FifoPolicy().order(jobs, CLUSTER, now_s=10)) == [1, 2, 3, 4]


def test_fairshare_serves_the_user_with_less_recent_usage_first():
    # Bob used 2.5 GPU-hours lately: his job starts at virtual time 9000 s, after Alice's first three
    # (0, 3600 and 7200 s), before her fourth (10800 s).
    jobs = [owned(k, ALICE, k) for k in range(1, 5)] + [owned(9, BOB, 0, usage=9000.0)]
    assert ids(FairSharePolicy().order(jobs, CLUSTER, now_s=10)) == [1, 2, 3, 9, 4]


def test_fairshare_without_owners_is_fifo():
    jobs = [make_job(job_id, arrival_s=arrival_s) for job_id, arrival_s in {1: 30, 7: 10, 2: 20}.items()]
    assert FairSharePolicy().order(jobs, CLUSTER, now_s=100) == FifoPolicy().order(jobs, CLUSTER, now_s=100)
