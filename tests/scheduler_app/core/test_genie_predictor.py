"""GENIE's fitted predictor deciding: the time of a placement (GPU count, servers) in the core."""

from __future__ import annotations

import dataclasses

import pytest

from profiles_app.catalog import load_catalog
from scheduler_app.core import reasons
from scheduler_app.core.allocators.genie import GenieAllocator
from scheduler_app.core.engine import schedule_round
from scheduler_app.core.policies.execution import best_execution_s
from scheduler_app.core.predictor import Predictor
from scheduler_app.core.throughput import (
    REFERENCE_SHAPE,
    gpu_count_factor,
    job_profile,
    placement_slowdown,
    with_penalty,
)
from scheduler_app.core.types import JobView, SensitivityProfile
from scheduler_app.simulator import ClusterSpec, TraceJob, simulate
from scheduler_app.simulator.metrics import JobRecord
from tests.builders import make_cluster, make_server
from tests.scheduler_app.core.helpers import FLAT

BATCH = 32.0
# t(n, k, b) = 0.001 b + 0.05 + ceil(log2 k) 0.01 + log2(n) t_cross: 0.082 s on 1 GPU at b = 32.
SLOW_NETWORK = Predictor(alpha=0.001, beta=0.05, t_intra=0.01, t_cross=0.2)
FAST_NETWORK = dataclasses.replace(SLOW_NETWORK, t_cross=0.001)
RES18 = load_catalog()["res18"]


def fitted(profile: SensitivityProfile, predictor: Predictor | None) -> SensitivityProfile:
    """`profile` with GENIE's fit (None: the Synergy profile alone), timed on 1 GPU by the fit."""
    if predictor is None:
        return profile
    return dataclasses.replace(
        profile, predictor=predictor, batch_per_gpu=BATCH, iter_time_s=predictor.iter_time_s(1, 1, BATCH)
    )


def test_the_fit_times_gpu_counts_and_spreads_as_the_predictor_says():
    profile = fitted(RES18, SLOW_NETWORK)
    # One server: ceil(log2 4) = 2 all-reduce steps: (0.082 + 0.02) / 0.082.
    assert gpu_count_factor(profile, 4) == pytest.approx(0.102 / 0.082)
    four = job_profile(profile, 4)
    assert four.iter_time_s == pytest.approx(0.102) and four.scaled_for_gpus == 4
    assert job_profile(four, 4) is four  # applied once, however often it is asked
    assert job_profile(four, 1).iter_time_s == pytest.approx(0.082)
    # 2 servers x 2 GPUs: 0.082 + 0.01 + 0.2 against 0.102 on one server.
    assert placement_slowdown(profile, 4, 2) == pytest.approx(0.292 / 0.102)
    assert placement_slowdown(profile, 4, 1) == 1.0
    assert with_penalty(1.0, profile, 2, 4) == pytest.approx(0.102 / 0.292)
    # Without a fit: the constant penalty and Synergy's perfect scaling.
    plain = dataclasses.replace(RES18, placement_penalty=1.25)
    assert placement_slowdown(plain, 4, 2) == 1.25 and job_profile(plain, 4) is plain
    # A fit whose network term came out negative (noise) never makes spreading pay.
    assert placement_slowdown(fitted(RES18, dataclasses.replace(SLOW_NETWORK, t_cross=-0.05)), 4, 2) == 1.0


def test_swaf_and_edf_estimates_use_the_fitted_time_of_the_gpu_count():
    profile = fitted(FLAT, SLOW_NETWORK)
    one = JobView(1, 1, 0.0, job_profile(profile, 1), total_iters=1000.0)
    eight = JobView(2, 8, 0.0, job_profile(profile, 8), total_iters=1000.0)
    # Same iterations, same speed on the reference shape's 8-GPU server; 8 GPUs take
    # (0.082 + 3 x 0.01) / 0.082 times longer per iteration.
    ratio = best_execution_s(eight, REFERENCE_SHAPE) / best_execution_s(one, REFERENCE_SHAPE)
    assert ratio == pytest.approx(0.112 / 0.082)


def half_free_cluster():
    """Two 8-GPU servers with 4 GPUs, 12 cores and 250 GB free on each: a 8-GPU job fits only spread."""
    return make_cluster(
        [make_server(server_id=i, free_gpus=range(4, 8), free_cpus=12, free_mem_gb=250.0) for i in (0, 1)]
    )


@pytest.mark.parametrize(
    ("predictor", "outcome", "reason"),
    [
        (None, "placed", reasons.QOS_FIT),  # no fit: the learnt penalty (1.0) says spreading is free
        (FAST_NETWORK, "placed", reasons.QOS_FIT),  # a fit with a fast network: spreading costs nothing
        (SLOW_NETWORK, "pending", reasons.QOS_NEEDS_FEWER_SERVERS),  # the fitted t_o would make it late
    ],
)
def test_the_fitted_cross_server_time_keeps_a_deadline_job_off_a_spread_placement(predictor, outcome, reason):
    profile = job_profile(fitted(RES18, predictor), 8)
    # Work for 1,000 s at the proportional point on one server; deadline 1,250 s, no slack: the speed
    # needed is 0.8, which spread over 2 servers at 3 cores per GPU gives only if spreading is cheap.
    job = JobView(1, 8, 0.0, profile, total_iters=1000.0 / profile.iter_time_s, deadline_s=1250.0)
    plan = GenieAllocator(slack=1.0, work_conserving=False).allocate_at([job], half_free_cluster(), 0.0)
    (decision,) = plan.decisions
    assert (decision.outcome.value, decision.reason) == (outcome, reason)
    if outcome == "placed":
        assert decision.placement.num_servers == 2
        assert decision.placement.speedup >= 0.8 - 1e-9  # as placed, the slowdown included
    else:
        # Spread, even at the best point the free cores allow (proportional, speed 1), it would miss.
        assert with_penalty(1.0, profile, 2, 8) * 1250.0 < 1000.0


def test_a_min_rate_job_counts_the_fitted_slowdown_of_the_servers_it_must_span():
    profile = job_profile(fitted(RES18, SLOW_NETWORK), 8)
    # num_nodes = 2 forces 2 servers: the fitted slowdown (0.302 / 0.112 = 2.7) puts a rate of 0.5 x
    # the proportional one out of reach even at the best case of 8 GPUs (capped at a server: 1.0).
    rate = 0.5 / profile.iter_time_s
    job = JobView(1, 8, 0.0, profile, total_iters=1000.0, num_nodes=2, min_rate_iters_per_s=rate)
    plan = GenieAllocator(work_conserving=False).allocate_at([job], make_cluster(2), 0.0)
    assert plan.decisions[0].reason == reasons.BEST_CASE  # placed, but as best effort: no rate promised
    without_fit = dataclasses.replace(job, profile=RES18, min_rate_iters_per_s=0.5 / RES18.iter_time_s)
    plan = GenieAllocator(work_conserving=False).allocate_at([without_fit], make_cluster(2), 0.0)
    assert plan.decisions[0].reason == reasons.QOS_FIT


def test_in_the_simulator_the_deadline_job_waits_for_one_server_and_meets_its_deadline():
    # Two 8-GPU servers. Jobs 1 and 2 (6 GPUs each, 1 h and 1.5 h, waiting allowances of 1,800 s and
    # 1,500 s: ahead of job 3 in SWAF's order until job 1 ends) take all but 2 GPUs of each server; job
    # 3 (4 GPUs, 1 h of work on one server) arrives at 60 s with its deadline 2.5 h later. Spread 2 + 2,
    # the fit makes it 2.9x slower (2.9 h: late), so it waits for job 1's server and runs there 1 h.
    profile = fitted(FLAT, SLOW_NETWORK)
    cluster = ClusterSpec(servers=2, gpus_per_server=8, cpus_per_server=24, mem_gb_per_server=500.0)

    def trace(p: SensitivityProfile) -> list[TraceJob]:
        def iters(gpus: int, seconds: float) -> int:
            return round(seconds / job_profile(p, gpus).iter_time_s)

        return [
            TraceJob(1, "m", 0.0, iters(6, 3600.0), 6, deadline_s=5400.0),
            TraceJob(2, "m", 0.0, iters(6, 5400.0), 6, deadline_s=6900.0),
            TraceJob(3, "m", 60.0, iters(4, 3600.0), 4, deadline_s=60.0 + 9000.0),
        ]

    def records(p: SensitivityProfile) -> dict[int, JobRecord]:
        result = simulate(
            trace(p), cluster, policy="swaf", allocator="genie", mode="events", catalog={"m": p}
        )
        assert result.qos.met == 3, "every deadline is met"
        return {r.job_id: r for r in result.records}

    with_fit = records(profile)[3]
    assert with_fit.start_s == pytest.approx(3600.0, abs=2.0)  # it waited for job 1's end ...
    assert with_fit.finish_s == pytest.approx(7200.0, abs=2.0) and with_fit.preemptions == 0  # ... on one
    spread_s = 3600.0 * placement_slowdown(profile, 4, 2)
    assert 60.0 + spread_s > 60.0 + 9000.0  # spread as it arrived, it would have been late
    # Without the fit (penalty 1) the same job is spread at once and, spreading being free, on time.
    assert records(FLAT)[3].finish_s == pytest.approx(60.0 + 3600.0, abs=2.0)


def test_a_qos_job_with_a_gpu_range_gets_the_fewest_gpus_that_meet_its_deadline():
    profile = job_profile(fitted(FLAT, SLOW_NETWORK), 8)
    # 1,000 s of work on 8 GPUs of one server; on k GPUs it takes 1,000 x (8/k) x t(1,k)/t(1,8) s:
    # 4 GPUs 1,821 s, 2 GPUs 3,286 s, 1 GPU 5,857 s. A deadline at 2,000 s (no slack) needs 4 GPUs.
    job = JobView(
        1, 8, 0.0, profile, total_iters=1000.0 / profile.iter_time_s, deadline_s=2000.0, gpu_choices=(1, 2, 4)
    )
    genie = GenieAllocator(slack=1.0, work_conserving=False)
    plan = genie.allocate_at([job], make_cluster(2), 0.0)
    placement = plan.decision_for(1).placement
    assert placement.num_gpus == 4 and plan.decision_for(1).reason == reasons.QOS_FIT
    # Its speed-up is in the job's own iterations (on 8 GPUs): the rate of 4 GPUs, in those terms.
    t = SLOW_NETWORK.iter_time_s
    assert placement.speedup == pytest.approx(0.5 * t(1, 8, BATCH) / t(1, 4, BATCH))
    # A looser deadline: 1 GPU will do. A tighter one than 4 GPUs allow: all 8.
    loose = dataclasses.replace(job, deadline_s=6000.0)
    assert genie.allocate_at([loose], make_cluster(2), 0.0).decision_for(1).placement.num_gpus == 1
    tight = dataclasses.replace(job, deadline_s=1500.0)
    assert genie.allocate_at([tight], make_cluster(2), 0.0).decision_for(1).placement.num_gpus == 8
    # Only genie reads the range: the others run the job on the GPUs it asked for.
    plan = schedule_round(make_cluster(2), [loose], policy="edf", allocator="tune", now_s=0.0)
    assert plan.decision_for(1).placement.num_gpus == 8


def test_in_the_simulator_a_job_with_a_range_finishes_its_samples_on_the_gpus_genie_picked():
    profile = fitted(FLAT, SLOW_NETWORK)
    cluster = ClusterSpec(servers=1, gpus_per_server=8, cpus_per_server=24, mem_gb_per_server=500.0)
    iters = round(3600.0 / job_profile(profile, 8).iter_time_s)  # 1 h on 8 GPUs
    job = TraceJob(1, "m", 0.0, iters, 8, deadline_s=5 * 3600.0, gpu_choices=(1, 2, 4))
    result = simulate([job], cluster, policy="swaf", allocator="genie", mode="events", catalog={"m": profile})
    (record,) = result.records
    # 2 GPUs (the fewest meeting 5 h x 0.8 slack): 4 x t(1,2)/t(1,8) h, and its deadline is met.
    t = SLOW_NETWORK.iter_time_s
    assert record.finish_s == pytest.approx(3600.0 * 4 * t(1, 2, BATCH) / t(1, 8, BATCH), rel=1e-3)
    assert result.qos.met == 1
