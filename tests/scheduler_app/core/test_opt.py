"""Synergy-OPT: its LP (hand-checked optima), the bound against the other allocators, and its invariants."""

from __future__ import annotations

import random
from collections import defaultdict

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from profiles_app.catalog import load_catalog
from scheduler_app.core import reasons
from scheduler_app.core.allocators import ALLOCATORS
from scheduler_app.core.allocators.opt import OptAllocator, opt_throughput_bound, plan_throughput
from scheduler_app.core.allocators.opt_lp import (
    candidate_points,
    pareto_points,
    round_class,
    solve_share_lp,
)
from scheduler_app.core.engine import schedule_round
from scheduler_app.core.policies import POLICIES
from scheduler_app.core.throughput import REFERENCE_SHAPE, best_case
from scheduler_app.core.types import ClusterSnapshot, JobView, Outcome, RoundPlan
from tests.builders import make_cluster, make_job, make_server
from tests.scheduler_app.core.helpers import outcomes, shares

MODELS = sorted(load_catalog())
TOL = 1e-6
HYPOTHESIS = settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def one_server(gpus: int, cpus_per_gpu: float = 3, mem_gb_per_gpu: float = 62.5) -> ClusterSnapshot:
    """A single empty server with the reference's per-GPU proportions unless told otherwise."""
    return make_cluster([make_server(gpus, int(gpus * cpus_per_gpu), gpus * mem_gb_per_gpu)])


def by_job(plan: RoundPlan) -> dict[int, tuple[str, float, int, float]]:
    """job_id -> (reason, speedup, total cores, total memory) of every placed job."""
    return {
        d.job_id: (d.reason, d.placement.speedup, d.placement.num_cpus, d.placement.mem_gb)
        for d in plan.decisions
        if d.placement is not None
    }


# -- the LP, by hand -------------------------------------------------------------------------
def test_pareto_points_drop_dominated_and_keep_fastest_first():
    pts = pareto_points(
        [3, 4, 4, 6, 6, 9], [62.5, 62.5, 125, 62.5, 20.83, 62.5], [1.0, 1.3, 1.3, 1.2, 1.0, 2.4]
    )
    # (4, 125) is (4, 62.5) with more memory; (6, 62.5) is slower than (4, 62.5) with more cores.
    # (6, 20.83) is as slow as (3, 62.5) but needs less memory, so both stay.
    assert list(zip(pts.cpus_per_gpu, pts.mem_gb_per_gpu, pts.tput, strict=True)) == [
        (9.0, 62.5, 2.4),
        (4.0, 62.5, 1.3),
        (3.0, 62.5, 1.0),
        (6.0, 20.83, 1.0),
    ]


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("gpus", [1, 2, 4, 8, 16])
def test_candidates_are_never_slower_than_proportional_and_hold_both_extremes(model, gpus):
    profile = load_catalog()[model]
    pts = candidate_points(profile, gpus, REFERENCE_SHAPE, max_cpus_per_gpu=24, max_mem_gb_per_gpu=500)
    assert (pts.tput >= 1.0 - TOL).all()
    assert np.all(np.diff(pts.tput) <= TOL)  # fastest first

    def covered(c: float, m: float, speed: float) -> bool:
        fits = (pts.cpus_per_gpu <= c + TOL) & (pts.mem_gb_per_gpu <= m + TOL)
        return bool((fits & (pts.tput >= speed - TOL)).any())

    best = best_case(profile, gpus, REFERENCE_SHAPE)
    assert covered(best.cpus_per_gpu, best.mem_gb_per_gpu, best.speed)
    assert covered(3.0, 62.5, 1.0)


def test_lp_gives_the_spare_cores_to_the_cpu_sensitive_model():
    # 3 GPUs, 9 cores, 187.5 GB. LSTM runs as fast on 1 core, which leaves 8 for AlexNet and
    # ResNet-50, each needing 3 to keep proportional speed. The 2 spare cores are worth 0.53 to
    # AlexNet (5 cores: 1.53) but 0.15 to ResNet-50 (4 cores: 1.15; AlexNet at 4: 1.25 -> 2.40).
    cluster = one_server(3)
    jobs = [make_job(1, "res50"), make_job(2, "alexnet"), make_job(3, "lstm")]
    assert opt_throughput_bound(jobs, cluster) == pytest.approx(1.0 + 1.53 + 1.0)
    plan = OptAllocator().allocate(jobs, cluster)
    assert by_job(plan) == {
        1: (reasons.PROPORTIONAL, 1.0, 3, 62.5),
        2: (reasons.LP_SHARE, 1.53, 5, 62.5),
        3: (reasons.LP_SHARE, 1.0, 1, 20.0),
    }
    assert plan_throughput(plan) == pytest.approx(3.53)


def test_lp_gives_resnet18_what_bert_leaves():
    # 2 GPUs, 6 cores: BERT needs one core, so ResNet-18 gets 5 (1.53), not its best case of 9.
    cluster = one_server(2)
    jobs = [make_job(1, "bert"), make_job(2, "res18")]
    assert opt_throughput_bound(jobs, cluster) == pytest.approx(2.53)
    placed = by_job(OptAllocator().allocate(jobs, cluster))
    assert placed[2] == (reasons.LP_SHARE, 1.53, 5, 62.5)
    assert placed[1][2] == 1


def test_relaxation_mixes_points_and_weighting_counts_gpus():
    # 8 GPUs, 24 cores: six 1-GPU LSTMs at 1 core leave 18 cores for a 2-GPU AlexNet, 9 per GPU.
    # The LP mixes AlexNet's 6-core (1.75) and 12-core (2.94) points half and half (9 cores,
    # 93.75 GB per GPU on average: 2.345), above the 2.0 any single point at 9 cores gives; the
    # allocator rounds to that single point.
    cluster = one_server(8)
    jobs = [make_job(1, "alexnet", gpus=2), *(make_job(i, "lstm") for i in range(2, 8))]
    mixed = 0.5 * 1.75 + 0.5 * 2.94
    assert opt_throughput_bound(jobs, cluster) == pytest.approx(2 * mixed + 6)
    assert opt_throughput_bound(jobs, cluster, weight_by_gpus=False) == pytest.approx(mixed + 6)
    for weight_by_gpus in (True, False):
        result = OptAllocator(weight_by_gpus=weight_by_gpus).solve(jobs, cluster)
        assert by_job(result.plan)[1] == (reasons.LP_SHARE, 2.0, 18, 125.0)
        assert plan_throughput(result.plan, weight_by_gpus=weight_by_gpus) <= result.bound + TOL
    assert plan_throughput(OptAllocator().allocate(jobs, cluster)) == pytest.approx(2 * 2.0 + 6)


def test_insensitive_mix_has_no_headroom():
    cluster = make_cluster(2)
    mix = [("bert", 4), ("gnmt", 8), ("lstm", 2)]
    jobs = [make_job(i, model, gpus=g) for i, (model, g) in enumerate(mix)]
    assert opt_throughput_bound(jobs, cluster) == pytest.approx(14.0)
    assert opt_throughput_bound(jobs, cluster, weight_by_gpus=False) == pytest.approx(3.0)


def test_share_lp_merges_identical_jobs_and_rounds_best_points_to_earlier_jobs():
    pts = pareto_points([3, 6, 12], [62.5, 62.5, 125], [1.0, 1.75, 2.94])
    # Four identical jobs sharing 30 cores: the optimum uses 12-core points where it can.
    solution = solve_share_lp([1] * 4, [pts] * 4, [1.0] * 4, cpus_total=30, mem_gb_total=1000)
    assert solution.all_jobs_fit
    assert all(np.allclose(m, solution.mix[0]) for m in solution.mix)  # one class, one mix
    speeds = [pts.tput[i] for i in solution.chosen]
    assert speeds == sorted(speeds, reverse=True)
    used = sum(pts.cpus_per_gpu[i] for i in solution.chosen)
    assert used <= 30 + TOL
    # Integral optimum: 12 + 6 + 6 + 6 = 30 cores for 2.94 + 3 * 1.75 = 8.19; the LP may beat it.
    assert solution.bound >= 8.19 - TOL


def test_rounding_never_asks_more_than_the_lp_used_for_the_leftover_job():
    pts = pareto_points([3, 6, 12], [62.5, 62.5, 125], [1.0, 1.75, 2.94])
    # Half a job at 12 cores, half at 6: the leftover job gets the fastest point within 9 cores.
    assert round_class(pts, np.array([0.5, 0.5, 0.0]), 1) == [1]
    # 1.5 jobs at 12 cores, 0.5 at 3: one whole job at 12, the leftover within 7.5 cores -> 6.
    assert round_class(pts, np.array([1.5, 0.0, 0.5]), 2) == [0, 1]


def test_share_lp_relaxes_when_even_the_cheapest_points_do_not_fit():
    pts = pareto_points([3], [62.5], [1.0])
    solution = solve_share_lp([1, 1, 1], [pts] * 3, [1.0] * 3, cpus_total=7, mem_gb_total=1000)
    assert not solution.all_jobs_fit
    assert solution.bound == pytest.approx(7 / 3)  # each job may run "partly": still an upper bound
    assert sorted(solution.chosen) == [-1, 0, 0]


def test_empty_lp():
    solution = solve_share_lp([], [], [], cpus_total=0, mem_gb_total=0)
    assert solution.bound == 0.0 and solution.chosen == () and solution.all_jobs_fit


# -- the allocator, by hand ------------------------------------------------------------------
def test_admission_is_gpu_only_in_policy_order():
    cluster = make_cluster(1)  # 8 GPUs
    jobs = [make_job(1, gpus=6), make_job(2, gpus=4), make_job(3, gpus=2), make_job(4, gpus=16)]
    plan = OptAllocator().allocate(jobs, cluster)
    assert [(j, o) for j, o, _ in outcomes(plan)] == [
        (1, "placed"),
        (2, "pending"),
        (3, "placed"),
        (4, "infeasible"),
    ]
    assert plan.decision_for(2).reason == reasons.INSUFFICIENT_GPUS
    assert plan.decision_for(4).reason == reasons.EXCEEDS_CLUSTER_GPUS


def test_fixed_demand_gets_exactly_its_demand():
    cluster = make_cluster(1)
    jobs = [make_job(1, "alexnet", cpus_per_gpu=2.0), make_job(2, "res18")]
    plan = OptAllocator().allocate(jobs, cluster)
    fixed = plan.decision_for(1)
    assert fixed.reason == reasons.FIXED_DEMAND
    assert [s[2:] for s in shares(fixed)] == [(2, 62.5)]
    assert fixed.placement is not None and fixed.placement.speedup == pytest.approx(0.66)
    assert plan.decision_for(2).placement.speedup == pytest.approx(2.4)  # 9 cores, the best case


def test_heavy_jobs_spread_over_servers_so_light_ones_can_fill_the_gpus():
    # Two servers: two AlexNets and fourteen LSTMs. The LP gives each AlexNet 12 cores; putting
    # both on one server would strand its 6 other GPUs without cores. OPT places one per server.
    cluster = make_cluster(2)
    jobs = [make_job(1, "alexnet"), make_job(2, "alexnet"), *(make_job(i, "lstm") for i in range(3, 17))]
    plan = OptAllocator().allocate(jobs, cluster)
    placed = by_job(plan)
    assert len(placed) == 16
    assert placed[1][:2] == placed[2][:2] == (reasons.LP_SHARE, 2.94)
    servers = {job_id: [s.server_id for s in plan.placements()[job_id].shares] for job_id in (1, 2)}
    assert servers[1] != servers[2]
    assert plan_throughput(plan) == pytest.approx(opt_throughput_bound(jobs, cluster))


def test_a_job_that_needs_a_whole_servers_cores_is_split_to_keep_gpus_usable():
    # A 4-GPU M5 wants 6 cores per GPU: 24 cores, a whole server's, on half its GPUs. Split 2 + 2
    # over two servers it leaves 12 cores on each for six 1-core language jobs.
    cluster = make_cluster(2)
    jobs = [make_job(1, "m5", gpus=4), *(make_job(i, "bert") for i in range(2, 14))]
    plan = OptAllocator().allocate(jobs, cluster)
    m5 = plan.decision_for(1)
    assert m5.placement is not None and m5.placement.num_servers == 2
    assert m5.placement.speedup == pytest.approx(best_case(jobs[0].profile, 4, REFERENCE_SHAPE).speed)
    assert len(plan.placements()) == 13
    assert plan_throughput(plan) == pytest.approx(opt_throughput_bound(jobs, cluster))


def test_no_job_is_left_out_when_the_lp_cannot_place_everyone_at_its_point():
    # Eight ResNet-18s on one server: the LP shares 24 cores; everyone keeps >= proportional speed.
    cluster = make_cluster(1)
    jobs = [make_job(i, "res18") for i in range(8)]
    plan = OptAllocator().allocate(jobs, cluster)
    assert all(d.outcome == Outcome.PLACED for d in plan.decisions)
    assert all(p.speedup == pytest.approx(1.0) for p in plan.placements().values())
    assert opt_throughput_bound(jobs, cluster) == pytest.approx(8.0)


# -- random rounds: the bound and the invariants ---------------------------------------------
@st.composite
def uniform_rounds(draw: st.DrawFn) -> tuple[ClusterSnapshot, list[JobView]]:
    """One server shape, partly busy servers (free CPU/memory proportional to free GPUs), catalog jobs."""
    num_gpus = draw(st.sampled_from([2, 4, 8]))
    cpus_per_gpu = draw(st.sampled_from([2, 3, 4, 6]))
    mem_gb_per_gpu = draw(st.sampled_from([62.5, 125.0]))
    views = []
    for i in range(draw(st.integers(1, 6))):
        free = sorted(draw(st.sets(st.integers(0, num_gpus - 1)))) if draw(st.booleans()) else range(num_gpus)
        views.append(
            make_server(
                num_gpus,
                num_gpus * cpus_per_gpu,
                num_gpus * mem_gb_per_gpu,
                server_id=i,
                free_gpus=free,
                free_cpus=len(free) * cpus_per_gpu,
                free_mem_gb=len(free) * mem_gb_per_gpu,
            )
        )
    jobs = [
        make_job(
            job_id,
            draw(st.sampled_from(MODELS)),
            gpus=draw(st.sampled_from([1, 1, 1, 2, 3, 4, 8])),
            arrival_s=float(job_id),
        )
        for job_id in range(draw(st.integers(0, 24)))
    ]
    return make_cluster(views), jobs


def check_invariants(cluster: ClusterSnapshot, jobs: list[JobView], plan: RoundPlan) -> None:
    """No over-commit, all-or-nothing GPUs, >= proportional speed, one decision per job in order."""
    assert [d.job_id for d in plan.decisions] == [j.job_id for j in jobs]
    servers = {s.server_id: s for s in cluster.servers}
    gpus: dict[int, list[int]] = defaultdict(list)
    cpus: dict[int, int] = defaultdict(int)
    mem_gb: dict[int, float] = defaultdict(float)
    by_id = {j.job_id: j for j in jobs}
    for job_id, placement in plan.placements().items():
        assert placement.num_gpus == by_id[job_id].num_gpus
        for share in placement.shares:
            gpus[share.server_id].extend(share.gpu_indices)
            cpus[share.server_id] += share.num_cpus
            mem_gb[share.server_id] += share.mem_gb
        if plan.decision_for(job_id).reason != reasons.FIXED_DEMAND:
            assert placement.speedup >= 1.0 - TOL
    for sid, used in gpus.items():
        assert len(used) == len(set(used)) and set(used) <= set(servers[sid].free_gpus)
        assert cpus[sid] <= servers[sid].free_cpus
        assert mem_gb[sid] <= servers[sid].free_mem_gb + TOL


def admitted_ids(jobs: list[JobView], cluster: ClusterSnapshot) -> set[int]:
    left, out = cluster.free_gpu_count, set()
    for job in jobs:
        if job.num_gpus <= cluster.total_gpus and job.num_gpus <= left:
            out.add(job.job_id)
            left -= job.num_gpus
    return out


@HYPOTHESIS
@given(case=uniform_rounds(), weight_by_gpus=st.booleans())
def test_bound_is_at_least_every_allocator_that_places_the_admitted_jobs(case, weight_by_gpus):
    cluster, jobs = case
    result = OptAllocator(weight_by_gpus=weight_by_gpus).solve(jobs, cluster)
    assert result.bound == pytest.approx(opt_throughput_bound(jobs, cluster, weight_by_gpus=weight_by_gpus))
    names = [n for n in ("proportional", "tune", "tune_matrix") if n in ALLOCATORS.names()]
    for name in names:
        plan = ALLOCATORS.get(name)().allocate(jobs, cluster)
        assert plan_throughput(plan, weight_by_gpus=weight_by_gpus) <= result.bound + TOL, name
    assert plan_throughput(result.plan, weight_by_gpus=weight_by_gpus) <= result.bound + TOL


@HYPOTHESIS
@given(case=uniform_rounds())
def test_every_admitted_job_is_placed_no_slower_than_proportional(case):
    cluster, jobs = case
    plan = OptAllocator().allocate(jobs, cluster)
    check_invariants(cluster, jobs, plan)
    assert set(plan.placements()) == admitted_ids(jobs, cluster)
    assert plan_throughput(plan) >= sum(p.num_gpus for p in plan.placements().values()) - TOL


@HYPOTHESIS
@given(case=uniform_rounds())
def test_same_inputs_same_plan(case):
    cluster, jobs = case
    first = OptAllocator().allocate(jobs, cluster)
    assert OptAllocator().allocate(list(jobs), cluster) == first
    ordered = POLICIES.get("fifo")().order(jobs, cluster, 0.0)
    via_engine = schedule_round(cluster, jobs, policy="fifo", allocator="opt", now_s=0.0)
    assert via_engine == OptAllocator().allocate(ordered, cluster)


def test_uneven_partly_busy_servers_keep_the_invariants():
    rng = random.Random(5)
    for _ in range(40):
        views = []
        for i in range(rng.randint(1, 5)):
            gpus = rng.choice([1, 2, 4, 8])
            cpus = rng.choice([4, 8, 16, 24, 48])
            mem = rng.choice([100.0, 250.0, 500.0])
            free = sorted(rng.sample(range(gpus), rng.randint(0, gpus)))
            views.append(
                make_server(
                    gpus,
                    cpus,
                    mem,
                    server_id=i,
                    free_gpus=free,
                    free_cpus=rng.randint(0, cpus),
                    free_mem_gb=rng.randint(0, int(mem)),
                )
            )
        cluster = make_cluster(views)
        jobs = [
            make_job(
                j,
                rng.choice(MODELS),
                gpus=rng.choice([1, 1, 2, 4, 8]),
                cpus_per_gpu=rng.choice([None] * 8 + [1.0, 6.0]),
                mem_gb_per_gpu=rng.choice([None] * 8 + [10.0, 200.0]),
            )
            for j in range(rng.randint(0, 20))
        ]
        result = OptAllocator().solve(jobs, cluster)
        check_invariants(cluster, jobs, result.plan)
        assert result.bound >= 0.0


def test_large_round_places_everyone_and_tune_is_under_the_bound():
    rng = random.Random(11)
    cluster = make_cluster(64)  # 512 GPUs
    jobs, gpus = [], 0
    while gpus < 600:
        g = rng.choice([1, 1, 1, 1, 2, 4, 8])
        jobs.append(make_job(len(jobs), rng.choice(MODELS), gpus=g, arrival_s=float(len(jobs))))
        gpus += g
    result = OptAllocator().solve(jobs, cluster)
    check_invariants(cluster, jobs, result.plan)
    assert set(result.plan.placements()) == admitted_ids(jobs, cluster)
    opt = plan_throughput(result.plan)
    assert 512 - TOL <= opt <= result.bound + TOL
    if "tune" in ALLOCATORS.names():
        assert plan_throughput(ALLOCATORS.get("tune")().allocate(jobs, cluster)) <= result.bound + TOL


def test_uneven_servers_use_the_average_shape_and_every_point_is_at_least_proportional():
    assert "opt" in ALLOCATORS.names()
    cluster = make_cluster([make_server(4, 16, 250.0, server_id=0), make_server(8, 24, 500.0, server_id=1)])
    mix = [("alexnet", 2), ("bert", 4), ("m5", 1), ("res18", 3)]
    jobs = [make_job(i, m, gpus=g) for i, (m, g) in enumerate(mix)]
    # The LP runs on the average shape (6 GPUs, 20 cores, 375 GB); every candidate point is at
    # least proportional there, so when every job fits the bound is at least the GPUs admitted.
    result = OptAllocator().solve(jobs, cluster)
    assert result.all_jobs_fit
    assert result.bound >= 10 - TOL
    check_invariants(cluster, jobs, result.plan)
