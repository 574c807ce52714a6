"""EDF, SJF and SWAF on literal inputs, worked out by hand.

Catalog facts used: transformer 0.67 s/iter, best-case speed-up 1.0; res18 0.64 s/iter, best case
9 cores + 62.5 GB per GPU with speed-up 2.4, which fits one reference server (8 GPUs, 24 cores,
500 GB), so its best execution time is iters x 0.64 / 2.4.
"""

from __future__ import annotations

import pytest

from scheduler_app.core.engine import schedule_round
from scheduler_app.core.policies import POLICIES
from scheduler_app.core.policies.edf import EdfPolicy
from scheduler_app.core.policies.execution import best_execution_s, proportional_execution_s
from scheduler_app.core.policies.sjf import SjfPolicy
from scheduler_app.core.policies.swaf import SwafPolicy, waiting_allowance_s
from scheduler_app.core.throughput import REFERENCE_SHAPE
from scheduler_app.core.types import ClusterSnapshot
from tests.builders import make_cluster, make_job

CLUSTER = make_cluster(2)
NOW = 100.0

# E_best: J1 1000 x 0.67 = 670; J2, J3 1500 x 0.64 / 2.4 = 400; J4 100 x 0.67 = 67.
JOBS = [
    make_job(1, "transformer", arrival_s=0, total_iters=1000, deadline_s=1000),  # WA = 230
    make_job(2, "res18", arrival_s=2, total_iters=1500, deadline_s=600),  # WA = 100
    make_job(3, "res18", arrival_s=3, total_iters=1500, deadline_s=450),  # WA = -50 (late), E 400
    make_job(4, "transformer", arrival_s=4, total_iters=100, deadline_s=150),  # WA = -17 (late), E 67
    make_job(5, "res18", arrival_s=5),  # no deadline; 1000 x 0.64 = 640 at proportional
    make_job(6, "res18", arrival_s=1),  # no deadline
]


def ids(jobs):
    return [j.job_id for j in jobs]


def test_registered():
    assert {"edf", "sjf", "swaf"} <= set(POLICIES.names())


def test_execution_estimates():
    j1, j2 = JOBS[0], JOBS[1]
    assert proportional_execution_s(j2) == pytest.approx(960.0)
    assert best_execution_s(j2, REFERENCE_SHAPE) == pytest.approx(400.0)
    assert best_execution_s(j2, None) == pytest.approx(960.0)
    assert best_execution_s(j1, REFERENCE_SHAPE) == pytest.approx(670.0)
    # Progress counts: half done, half the time left.
    half = make_job(9, "res18", total_iters=1500, done_iters=750)
    assert best_execution_s(half, REFERENCE_SHAPE) == pytest.approx(200.0)


def test_waiting_allowance():
    got = [waiting_allowance_s(j, NOW, REFERENCE_SHAPE) for j in JOBS]
    assert got[:4] == pytest.approx([230.0, 100.0, -50.0, -17.0])
    assert got[4:] == [None, None]


def test_edf():
    assert ids(EdfPolicy().order(JOBS, CLUSTER, NOW)) == [4, 3, 2, 1, 6, 5]


def test_sjf():
    # 67 (J4), 640 (J6 arrival 1, J5 arrival 5), 670 (J1), 960 (J2 arrival 2, J3 arrival 3)
    assert ids(SjfPolicy().order(JOBS, CLUSTER, NOW)) == [4, 6, 5, 1, 2, 3]


def test_swaf():
    # feasible by WA (J2 100, J1 230), late tail by E (J4 67, J3 400), no deadline by arrival (J6, J5)
    assert ids(SwafPolicy().order(JOBS, CLUSTER, NOW)) == [2, 1, 4, 3, 6, 5]


def test_swaf_orders_jobs_without_a_qos_target_as_sjf():
    # Remaining at proportional: J1 640 s, J2 0.67 x 300 = 201 s, J3 64 s (half of 128 left), J4 640 s.
    jobs = [
        make_job(1, "res18", arrival_s=0, total_iters=1000),
        make_job(2, "transformer", arrival_s=1, total_iters=300),
        make_job(3, "res18", arrival_s=2, total_iters=200, done_iters=100),
        make_job(4, "res18", arrival_s=3, total_iters=1000, priority=1),
    ]
    assert ids(SwafPolicy().order(jobs, CLUSTER, NOW)) == [4, 3, 2, 1]
    assert ids(SwafPolicy().order(jobs, CLUSTER, NOW)) == ids(SjfPolicy().order(jobs, CLUSTER, NOW))


def test_swaf_allowance_shrinks_with_time():
    # At t=0 J3 is feasible (WA = 450 - 400 = 50) and precedes J2 (WA = 200); at t=100 it is late.
    jobs = [JOBS[1], JOBS[2]]
    assert ids(SwafPolicy().order(jobs, CLUSTER, 0.0)) == [3, 2]
    assert ids(SwafPolicy().order(jobs, CLUSTER, NOW)) == [2, 3]


def test_swaf_empty_cluster_uses_proportional_estimate():
    # No servers: E = 960 for J2 (WA = -460, late), 670 for J1 (WA = 230).
    assert ids(SwafPolicy().order(JOBS[:2], ClusterSnapshot(servers=()), NOW)) == [1, 2]


@pytest.mark.parametrize("name", ["edf", "sjf", "swaf"])
def test_priority_first_and_input_untouched(name):
    jobs = [*JOBS, make_job(7, "res18", arrival_s=50, total_iters=10**6, priority=1)]
    before = list(jobs)
    assert ids(POLICIES.get(name)().order(jobs, CLUSTER, NOW))[0] == 7
    assert jobs == before


@pytest.mark.parametrize("allocator", ["tune", "greedy", "proportional"])
def test_swaf_with_synergy_allocators(allocator):
    """The combined mode: SWAF order, Synergy CPU/memory allocation, through schedule_round."""
    plan = schedule_round(CLUSTER, JOBS, policy="swaf", allocator=allocator, now_s=NOW)
    placed = plan.placements()
    assert set(placed) == {1, 2, 3, 4, 5, 6}  # 6 one-GPU jobs on 16 GPUs
    if allocator in ("tune", "greedy"):
        assert placed[2].speedup == pytest.approx(2.4)  # res18 gets its best case


def test_swaf_tune_admits_in_swaf_order():
    """Two GPUs for six jobs: SWAF+tune runs the two least-slack QoS jobs (J2, then J1)."""
    small = make_cluster(1, gpus=2, cpus=24, mem_gb=500.0)
    plan = schedule_round(small, JOBS, policy="swaf", allocator="tune", now_s=NOW)
    assert sorted(plan.placements()) == [1, 2]
    assert [d.job_id for d in plan.decisions] == [2, 1, 4, 3, 6, 5]
    assert plan.placements()[2].speedup == pytest.approx(2.4)
