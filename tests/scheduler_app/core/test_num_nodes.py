"""A job's node count (JobView.num_nodes, Slurm's --nodes) under every allocator, with literal inputs."""

from __future__ import annotations

import dataclasses

import pytest

from scheduler_app.core import reasons
from scheduler_app.core.allocators import ALLOCATORS
from scheduler_app.core.engine import schedule_round
from scheduler_app.core.placement import FIRST_FIT, PACKED, RoundState, infeasible_reason
from scheduler_app.core.types import ClusterSnapshot, JobView, Outcome, Placement, RoundPlan, ServerShare
from tests.builders import make_cluster, make_job, make_server

ALLOCATOR_NAMES = ALLOCATORS.names()


def nodes_job(job_id: int, gpus: int, num_nodes: int | None, **options: object) -> JobView:
    return dataclasses.replace(make_job(job_id, "res18", gpus=gpus, **options), num_nodes=num_nodes)


def two_servers(free_gpus: tuple[int, ...] | None = None) -> ClusterSnapshot:
    """Two 4-GPU servers (12 cores, 250 GB each); `free_gpus`: the free ones on each, if not all."""
    if free_gpus is None:
        return make_cluster(2, gpus=4, cpus=12, mem_gb=250.0)
    k = len(free_gpus)
    return make_cluster(
        [
            make_server(4, 12, 250.0, server_id=i, free_gpus=free_gpus, free_cpus=3 * k, free_mem_gb=62.5 * k)
            for i in range(2)
        ]
    )


def run(name: str, jobs: list[JobView], cluster: ClusterSnapshot) -> RoundPlan:
    return schedule_round(cluster, jobs, policy="fifo", allocator=name, now_s=0.0)


def gpus_by_server(plan: RoundPlan, job_id: int) -> dict[int, tuple[int, ...]]:
    placement = plan.decision_for(job_id).placement
    assert placement is not None, plan.decision_for(job_id)
    return {s.server_id: s.gpu_indices for s in placement.shares}


@pytest.mark.parametrize("name", ALLOCATOR_NAMES)
def test_two_nodes_split_two_and_two(name):
    plan = run(name, [nodes_job(1, 4, 2)], two_servers())
    assert gpus_by_server(plan, 1) == {0: (0, 1), 1: (0, 1)}


@pytest.mark.parametrize("name", ALLOCATOR_NAMES)
def test_one_node_goes_whole_onto_a_server(name):
    plan = run(name, [nodes_job(1, 4, 1)], two_servers())
    assert list(gpus_by_server(plan, 1).values()) == [(0, 1, 2, 3)]


@pytest.mark.parametrize("name", ALLOCATOR_NAMES)
def test_one_node_never_spreads(name):
    """Four GPUs free in all, two on each server: any split would fit, one server does not."""
    cluster = two_servers(free_gpus=(0, 1))
    plan = run(name, [nodes_job(1, 4, 1)], cluster)
    decision = plan.decision_for(1)
    assert (decision.outcome, decision.reason) == (Outcome.PENDING, reasons.INSUFFICIENT_GPUS)
    # The same job with no node count is spread (the allocators' own rule).
    spread = run(name, [nodes_job(1, 4, None)], cluster)
    assert len(gpus_by_server(spread, 1)) == 2


@pytest.mark.parametrize("name", ALLOCATOR_NAMES)
def test_a_busy_server_leaves_a_two_node_job_pending(name):
    """One server full: four GPUs free on the other, but a 2 x 2 job needs two servers."""
    cluster = make_cluster(
        [
            make_server(4, 12, 250.0, server_id=0),
            make_server(4, 12, 250.0, server_id=1, free_gpus=(), free_cpus=0, free_mem_gb=0.0),
        ]
    )
    plan = run(name, [nodes_job(1, 4, 2), nodes_job(2, 2, None)], cluster)
    assert (plan.decision_for(1).outcome, plan.decision_for(1).reason) == (
        Outcome.PENDING,
        reasons.INSUFFICIENT_GPUS,
    )
    assert plan.decision_for(2).outcome == Outcome.PLACED  # a job without a count still fits


@pytest.mark.parametrize("name", ALLOCATOR_NAMES)
@pytest.mark.parametrize(("gpus", "num_nodes"), [(3, 3), (6, 3), (8, 4)])
def test_more_nodes_than_servers_is_infeasible(name, gpus, num_nodes):
    plan = run(name, [nodes_job(1, gpus, num_nodes)], two_servers())
    decision = plan.decision_for(1)
    assert (decision.outcome, decision.reason) == (Outcome.INFEASIBLE, reasons.EXCEEDS_CLUSTER_NODES)


@pytest.mark.parametrize("name", ALLOCATOR_NAMES)
@pytest.mark.parametrize(("gpus", "num_nodes"), [(4, 3), (3, 2), (1, 2)])
def test_uneven_split_is_infeasible(name, gpus, num_nodes):
    plan = run(name, [nodes_job(1, gpus, num_nodes)], two_servers())
    decision = plan.decision_for(1)
    assert (decision.outcome, decision.reason) == (Outcome.INFEASIBLE, reasons.UNEVEN_NODE_SPLIT)


def test_infeasible_reason_counts_servers_that_hold_the_fixed_demand():
    cluster = make_cluster([make_server(4, 24, 500.0, server_id=0), make_server(4, 24, 500.0, server_id=1)])
    # 10 cores per GPU: each server holds 2 such GPUs, so 2 x 2 fits and 1 x 4 never does.
    assert infeasible_reason(nodes_job(1, 4, 2, cpus_per_gpu=10.0), cluster) is None
    assert infeasible_reason(nodes_job(1, 4, 1, cpus_per_gpu=10.0), cluster) == reasons.EXCEEDS_CLUSTER_NODES
    # 20 cores per GPU: one GPU per server, two in all; the plain fixed-demand check answers first.
    too_much = nodes_job(1, 4, 2, cpus_per_gpu=20.0)
    assert infeasible_reason(too_much, cluster) == reasons.EXCEEDS_SERVER_RESOURCES
    assert infeasible_reason(nodes_job(1, 2, 2, cpus_per_gpu=20.0), cluster) is None


def test_num_nodes_below_one_is_a_caller_error():
    with pytest.raises(ValueError, match="num_nodes"):
        infeasible_reason(nodes_job(1, 4, 0), two_servers())


@pytest.mark.parametrize("name", ALLOCATOR_NAMES)
def test_a_running_two_node_job_stays_on_its_servers(name):
    """Round after round, newcomers arrive around a 2 x 2 job; it keeps its GPUs every time."""
    cluster = make_cluster(3, gpus=4, cpus=12, mem_gb=250.0)
    jobs = [nodes_job(1, 4, 2)]
    first = run(name, jobs, cluster)
    home = gpus_by_server(first, 1)
    assert len(home) == 2 and all(len(g) == 2 for g in home.values())
    arrivals = [nodes_job(2, 4, None), nodes_job(3, 2, None), nodes_job(4, 2, 1), nodes_job(5, 1, None)]
    plan = first
    for newcomer in arrivals:
        placements = plan.placements()
        jobs = [dataclasses.replace(j, current=placements.get(j.job_id)) for j in [*jobs, newcomer]]
        plan = run(name, jobs, cluster)
        assert gpus_by_server(plan, 1) == home, (name, newcomer.job_id, plan)


@pytest.mark.parametrize("name", ALLOCATOR_NAMES)
def test_a_current_placement_of_another_shape_is_left(name):
    """A 4-GPU job that ran whole on server 0 but now asks for two servers moves to 2 + 2."""
    current = Placement(1, (ServerShare(0, (0, 1, 2, 3), 12, 250.0),), 1.0)
    job = dataclasses.replace(nodes_job(1, 4, 2), current=current)
    plan = run(name, [job], two_servers())
    assert gpus_by_server(plan, 1) == {0: (0, 1), 1: (0, 1)}


@pytest.mark.parametrize(
    ("strategy", "expected"),
    [(PACKED, [(1, 2), (2, 2)]), (FIRST_FIT, [(0, 2), (1, 2)])],
)
def test_servers_are_chosen_in_the_strategys_order(strategy, expected):
    """Free GPUs 4, 2, 3: packed takes the fewest usable first (1 then 2), first fit cluster order."""
    cluster = make_cluster(
        [
            make_server(4, 12, 250.0, server_id=0),
            make_server(4, 12, 250.0, server_id=1, free_gpus=(2, 3), free_cpus=6, free_mem_gb=125.0),
            make_server(4, 12, 250.0, server_id=2, free_gpus=(1, 2, 3), free_cpus=9, free_mem_gb=187.5),
        ]
    )
    job = nodes_job(1, 4, 2)
    state = RoundState(cluster, [job])
    plan = state.find(strategy, 4, state.prop_cpus, state.prop_mem_gb, job.job_id)
    assert plan is not None and sorted(plan) == expected


def test_cores_missing_on_the_only_servers_is_fragmented():
    """Two GPUs free on each server, but server 1 has no cores left: `fragmented`, not GPUs."""
    cluster = make_cluster(
        [
            make_server(4, 12, 250.0, server_id=0, free_gpus=(2, 3), free_cpus=6, free_mem_gb=125.0),
            make_server(4, 12, 250.0, server_id=1, free_gpus=(2, 3), free_cpus=0, free_mem_gb=125.0),
        ]
    )
    decision = run("proportional", [nodes_job(1, 4, 2)], cluster).decision_for(1)
    assert (decision.outcome, decision.reason) == (Outcome.PENDING, reasons.FRAGMENTED)
