"""Every registered allocator, under every policy, against the invariants of allocators/base.py.

Hypothesis generates the clusters (uneven, partly busy servers) and the job mixes (catalog models,
1-16 GPUs, some fixed demands, some impossible jobs). New allocators are picked up from the
registry automatically; the Synergy ones are also held to "never below proportional speed".
"""

from __future__ import annotations

from collections import defaultdict

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from profiles_app.catalog import load_catalog
from scheduler_app.core import reasons
from scheduler_app.core.allocators import ALLOCATORS
from scheduler_app.core.engine import schedule_round
from scheduler_app.core.policies import POLICIES
from scheduler_app.core.types import ClusterSnapshot, JobView, Outcome, RoundPlan
from tests.builders import make_cluster, make_job, make_server

SYNERGY_ALLOCATORS = {"proportional", "greedy", "tune", "tune_matrix", "opt"}
# Allocators that place every GPU-admitted job when servers are uniform and fully schedulable.
PLACE_ALL_ADMITTED = {"proportional", "tune", "tune_matrix"}
MODELS = sorted(load_catalog())
ALLOCATOR_NAMES = ALLOCATORS.names()
POLICY_NAMES = POLICIES.names()
TOL = 1e-6

POLICY = st.sampled_from(POLICY_NAMES)
HYPOTHESIS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


# -- strategies ------------------------------------------------------------------------------
@st.composite
def servers(draw: st.DrawFn, uniform: bool = False) -> ClusterSnapshot:
    """1-5 servers; uneven shapes and partly busy servers unless `uniform`."""
    count = draw(st.integers(1, 5))
    if uniform:
        # One shape for all, free resources proportional to free GPUs (a round-mode snapshot).
        # 62.5 GB per GPU keeps every catalog best case on one side of proportional in both
        # dimensions, the condition under which tune's take-back always frees enough.
        num_gpus = draw(st.sampled_from([2, 4, 8]))
        cpus_per_gpu = draw(st.sampled_from([2, 3, 4, 6]))
        views = []
        for i in range(count):
            busy = draw(st.booleans())
            free = sorted(draw(st.sets(st.integers(0, num_gpus - 1)))) if busy else list(range(num_gpus))
            views.append(
                make_server(
                    num_gpus,
                    num_gpus * cpus_per_gpu,
                    num_gpus * 62.5,
                    server_id=i,
                    free_gpus=free,
                    free_cpus=len(free) * cpus_per_gpu,
                    free_mem_gb=len(free) * 62.5,
                )
            )
        return make_cluster(views)
    views = []
    for i in range(count):
        num_gpus = draw(st.sampled_from([1, 2, 4, 8]))
        num_cpus = draw(st.sampled_from([4, 8, 16, 20, 24, 32, 48]))
        mem_gb = draw(st.sampled_from([100.0, 250.0, 500.0, 1000.0]))
        if draw(st.booleans()):
            views.append(make_server(num_gpus, num_cpus, mem_gb, server_id=i))
            continue
        free = sorted(draw(st.sets(st.integers(0, num_gpus - 1))))
        free_cpus = draw(st.integers(0, num_cpus))
        free_mem_gb = draw(st.integers(0, int(mem_gb * 2))) / 2
        views.append(
            make_server(
                num_gpus,
                num_cpus,
                mem_gb,
                server_id=i,
                free_gpus=free,
                free_cpus=free_cpus,
                free_mem_gb=free_mem_gb,
            )
        )
    return make_cluster(views)


@st.composite
def job_mixes(draw: st.DrawFn, fixed_demands: bool = True) -> list[JobView]:
    count = draw(st.integers(0, 18))
    jobs = []
    for job_id in range(count):
        cpus_per_gpu = mem_gb_per_gpu = None
        if fixed_demands and draw(st.integers(0, 9)) == 0:
            cpus_per_gpu = draw(st.sampled_from([None, 1.0, 2.0, 5.0, 12.0, 100.0]))
            mem_gb_per_gpu = draw(st.sampled_from([None, 10.0, 62.5, 300.0, 5000.0]))
        total_iters = draw(st.sampled_from([100.0, 1000.0, 50_000.0]))
        jobs.append(
            make_job(
                job_id,
                draw(st.sampled_from(MODELS)),
                gpus=draw(st.sampled_from([1, 1, 1, 2, 3, 4, 8, 16])),
                arrival_s=draw(st.integers(0, 5)) * 100.0,
                total_iters=total_iters,
                done_iters=draw(st.sampled_from([0.0, 0.5])) * total_iters,
                attained_service_gpu_s=float(draw(st.integers(0, 3)) * 600),
                cpus_per_gpu=cpus_per_gpu,
                mem_gb_per_gpu=mem_gb_per_gpu,
                priority=draw(st.sampled_from([0, 0, 0, 1])),
            )
        )
    return jobs


def allocate(name: str, policy: str, jobs: list[JobView], cluster: ClusterSnapshot) -> tuple[list, RoundPlan]:
    ordered = POLICIES.get(policy)().order(jobs, cluster, 1000.0)
    return ordered, ALLOCATORS.get(name)().allocate(ordered, cluster)


# -- invariant checks ------------------------------------------------------------------------
def check_decisions_match_jobs(ordered: list[JobView], plan: RoundPlan) -> None:
    assert [d.job_id for d in plan.decisions] == [j.job_id for j in ordered]
    for d in plan.decisions:
        if d.outcome == Outcome.PLACED:
            assert d.placement is not None and d.placement.job_id == d.job_id
            assert d.reason in reasons.PLACED_REASONS
        elif d.outcome == Outcome.PENDING:
            assert d.placement is None and d.reason in reasons.PENDING_REASONS
        else:
            assert d.placement is None and d.reason in reasons.INFEASIBLE_REASONS


def check_no_over_commit(cluster: ClusterSnapshot, plan: RoundPlan) -> None:
    servers = {s.server_id: s for s in cluster.servers}
    used_gpus: dict[int, list[int]] = defaultdict(list)
    used_cpus: dict[int, int] = defaultdict(int)
    used_mem_gb: dict[int, float] = defaultdict(float)
    for placement in plan.placements().values():
        for share in placement.shares:
            used_gpus[share.server_id].extend(share.gpu_indices)
            used_cpus[share.server_id] += share.num_cpus
            used_mem_gb[share.server_id] += share.mem_gb
            assert share.num_cpus >= 0 and share.mem_gb >= -TOL
    for server_id, gpus in used_gpus.items():
        server = servers[server_id]
        assert len(gpus) == len(set(gpus)), f"GPU given twice on server {server_id}"
        assert set(gpus) <= set(server.free_gpus), f"busy GPU used on server {server_id}"
        assert used_cpus[server_id] <= server.free_cpus
        assert used_mem_gb[server_id] <= server.free_mem_gb + TOL


def check_all_or_nothing(ordered: list[JobView], plan: RoundPlan) -> None:
    jobs = {j.job_id: j for j in ordered}
    for job_id, placement in plan.placements().items():
        assert placement.num_gpus == jobs[job_id].num_gpus
        server_ids = [s.server_id for s in placement.shares]
        assert len(server_ids) == len(set(server_ids))
        assert all(len(s.gpu_indices) > 0 for s in placement.shares)


def check_not_below_proportional(ordered: list[JobView], plan: RoundPlan) -> None:
    """A placed job runs at least as fast as its GPU-proportional share on the same servers."""
    jobs = {j.job_id: j for j in ordered}
    for d in plan.decisions:
        if d.placement is None or d.reason == reasons.FIXED_DEMAND:
            continue  # a user-fixed demand may well be below proportional
        profile = jobs[d.job_id].profile
        proportional = 1.0 / profile.placement_penalty if d.placement.num_servers > 1 else 1.0
        assert d.placement.speedup >= proportional - TOL, d


def admitted_ids(ordered: list[JobView], cluster: ClusterSnapshot) -> set[int]:
    """Synergy's GPU-only admission, computed independently of the allocators."""
    left = cluster.free_gpu_count
    admitted = set()
    for job in ordered:
        if job.num_gpus <= cluster.total_gpus and job.num_gpus <= left:
            admitted.add(job.job_id)
            left -= job.num_gpus
    return admitted


# -- the contract ----------------------------------------------------------------------------
@pytest.mark.parametrize("name", ALLOCATOR_NAMES)
@HYPOTHESIS
@given(cluster=servers(), jobs=job_mixes(), policy=POLICY)
def test_invariants_hold_for_every_allocator(name, cluster, jobs, policy):
    ordered, plan = allocate(name, policy, jobs, cluster)
    check_decisions_match_jobs(ordered, plan)
    check_no_over_commit(cluster, plan)
    check_all_or_nothing(ordered, plan)
    if name in SYNERGY_ALLOCATORS:
        check_not_below_proportional(ordered, plan)


@pytest.mark.parametrize("name", ALLOCATOR_NAMES)
@HYPOTHESIS
@given(cluster=servers(), jobs=job_mixes(), policy=POLICY)
def test_same_inputs_same_plan(name, cluster, jobs, policy):
    _, first = allocate(name, policy, jobs, cluster)
    _, second = allocate(name, policy, list(jobs), cluster)
    assert first == second
    via_engine = schedule_round(cluster, jobs, policy=policy, allocator=name, now_s=1000.0)
    assert via_engine == first


@pytest.mark.parametrize("name", sorted(PLACE_ALL_ADMITTED & set(ALLOCATOR_NAMES)))
@HYPOTHESIS
@given(cluster=servers(uniform=True), jobs=job_mixes(fixed_demands=False), policy=POLICY)
def test_every_gpu_admitted_job_is_placed(name, cluster, jobs, policy):
    ordered, plan = allocate(name, policy, jobs, cluster)
    placed = set(plan.placements())
    assert placed == admitted_ids(ordered, cluster)
    check_no_over_commit(cluster, plan)


@HYPOTHESIS
@given(cluster=servers(uniform=True), jobs=job_mixes(fixed_demands=False), policy=POLICY)
def test_tune_uses_exactly_the_gpus_proportional_uses(cluster, jobs, policy):
    _, tune = allocate("tune", policy, jobs, cluster)
    _, proportional = allocate("proportional", policy, jobs, cluster)
    assert set(tune.placements()) == set(proportional.placements())


@pytest.mark.parametrize("name", ALLOCATOR_NAMES)
def test_empty_inputs(name):
    allocator = ALLOCATORS.get(name)()
    assert allocator.allocate([], make_cluster(2)).decisions == ()
    plan = allocator.allocate([make_job(1)], make_cluster(0))
    expected = [(Outcome.INFEASIBLE, reasons.EXCEEDS_CLUSTER_GPUS)]
    assert [(d.outcome, d.reason) for d in plan.decisions] == expected
