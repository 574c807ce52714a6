"""SWAF under overload: Moore and Hodgson's rule takes the guarantee from the deadline job that needs
the most capacity (policies/guarantees.py), on literal inputs worked out by hand.

One reference server (8 GPUs, 24 cores, 500 GB); transformer: 0.67 s/iter, best-case speed-up 1.0,
so every job below runs at speed 1 and needs 8 GPUs x its execution time:
J1 1000 iters = 670 s (5,360 GPU-s), deadline 700 (WA 30); J2 and J3 100 iters = 67 s (536 GPU-s),
deadline 720 (WA 653). Only J1 fits before 700; after it neither J2 nor J3 makes 720, while J2 and J3
first leave J1 late: one deadline met against two.
"""

from __future__ import annotations

import pytest

from scheduler_app.core.policies.guarantees import deadline_need_gpu_s, unguaranteed_jobs
from scheduler_app.core.policies.swaf import SwafPolicy
from scheduler_app.core.throughput import REFERENCE_SHAPE
from scheduler_app.simulator import ClusterSpec, simulate
from scheduler_app.simulator.trace import TraceJob
from tests.builders import make_cluster, make_job

ONE_SERVER = make_cluster(1)
LONG = make_job(1, "transformer", 8, 0, total_iters=1000, deadline_s=700)
SHORT_A = make_job(2, "transformer", 8, 0, total_iters=100, deadline_s=720)
SHORT_B = make_job(3, "transformer", 8, 0, total_iters=100, deadline_s=720)
JOBS = [LONG, SHORT_A, SHORT_B]


def ids(jobs):
    return [j.job_id for j in jobs]


def test_a_jobs_need_is_gpu_seconds_at_its_cheapest_point_in_time():
    assert deadline_need_gpu_s(LONG, REFERENCE_SHAPE, 0.0) == pytest.approx(8 * 670.0)
    assert deadline_need_gpu_s(SHORT_A, REFERENCE_SHAPE, 0.0) == pytest.approx(8 * 67.0)
    # No deadline, a deadline passed, or one no point meets: no need counted.
    assert deadline_need_gpu_s(make_job(4, "transformer", 8), REFERENCE_SHAPE, 0.0) is None
    assert deadline_need_gpu_s(LONG, REFERENCE_SHAPE, 800.0) is None
    assert deadline_need_gpu_s(LONG, REFERENCE_SHAPE, 100.0) is None  # 670 s left, 600 s to go


def test_the_job_needing_the_most_loses_its_guarantee_when_the_sum_passes_the_offer():
    # Whole cluster plannable: J1 5,360 <= 8 x 700; + J2 = 5,896 > 8 x 720 = 5,760: J1, the largest,
    # goes; J2 + J3 = 1,072 fit.
    assert unguaranteed_jobs(JOBS, ONE_SERVER, REFERENCE_SHAPE, 0.0, plannable_share=1.0) == {1}
    # Half the server's capacity is offered by default: J1 alone is over (5,360 > 2,800) with J2 ...
    assert unguaranteed_jobs([LONG, SHORT_A], ONE_SERVER, REFERENCE_SHAPE, 0.0, plannable_share=0.5) == {1}
    # ... but alone it fits the cluster's GPUs: nothing competes for them, it keeps its guarantee.
    assert unguaranteed_jobs([LONG], ONE_SERVER, REFERENCE_SHAPE, 0.0, plannable_share=0.5) == set()
    # At 400 s J1 has run 400 of its 670 s: 2,160 GPU-s left, <= 8 x 300 by its deadline; with J2,
    # 2,696 > 8 x 320 by 720 (J1 still needs the most); with a short job due at 1000 s, nothing is over.
    running = make_job(1, "transformer", 8, 0, total_iters=1000, done_iters=1000 * 400 / 670, deadline_s=700)
    assert unguaranteed_jobs([running, SHORT_A], ONE_SERVER, REFERENCE_SHAPE, 400.0, 1.0) == {1}
    relaxed = make_job(7, "transformer", 8, 0, total_iters=100, deadline_s=1000)
    assert unguaranteed_jobs([running, relaxed], ONE_SERVER, REFERENCE_SHAPE, 400.0, 1.0) == set()


def test_swaf_serves_the_guaranteed_jobs_first_and_plain_swaf_least_slack_first():
    assert ids(SwafPolicy(plannable_share=None).order(JOBS, ONE_SERVER, 0.0)) == [1, 2, 3]
    assert ids(SwafPolicy(plannable_share=1.0).order(JOBS, ONE_SERVER, 0.0)) == [2, 3, 1]
    assert ids(SwafPolicy().order(JOBS, ONE_SERVER, 0.0)) == [2, 3, 1]


def test_an_unguaranteed_job_still_precedes_late_ones_and_jobs_without_a_deadline():
    late = make_job(5, "transformer", 8, 0, total_iters=100, deadline_s=50)  # 67 s left, 50 to go
    best_effort = make_job(6, "transformer", 8, 0, total_iters=10)
    order = SwafPolicy(plannable_share=1.0).order([best_effort, late, *JOBS], ONE_SERVER, 0.0)
    assert ids(order) == [2, 3, 1, 5, 6]


def test_an_emergency_job_keeps_its_guarantee_while_a_lower_priority_one_can_give_it_up():
    urgent_long = make_job(1, "transformer", 8, 0, total_iters=1000, deadline_s=700, priority=1)
    got = unguaranteed_jobs([urgent_long, SHORT_A, SHORT_B], ONE_SERVER, REFERENCE_SHAPE, 0.0, 1.0)
    # J1 + J2 = 5,896 > 5,760: J2 goes, not J1 (higher priority, though larger); J1 + J3 likewise.
    assert got == {2, 3}


@pytest.mark.parametrize("mode", ["events", "rounds"])
def test_in_the_simulator_the_guarantees_meet_two_deadlines_where_plain_swaf_meets_one(mode):
    trace = [
        TraceJob(j.job_id, "transformer", 0.0, int(j.total_iters), 8, deadline_s=j.deadline_s) for j in JOBS
    ]
    cluster = ClusterSpec(servers=1, gpus_per_server=8, cpus_per_server=24, mem_gb_per_server=500.0)
    met = {
        share: simulate(
            trace, cluster, policy=SwafPolicy(plannable_share=share), allocator="genie", mode=mode, round_s=30
        ).qos.met_pct
        for share in (None, 0.5)
    }
    assert met[None] == pytest.approx(100 / 3)
    assert met[0.5] == pytest.approx(200 / 3)
