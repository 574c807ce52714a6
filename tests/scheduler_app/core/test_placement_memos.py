"""The placement's memos for deep queues (nodes.py `_unfit_servers`, the bucketed `node_servers`) change
no decision: each round is decided again without them and must give the same plan, bit for bit."""

from __future__ import annotations

import dataclasses
import random

import pytest

from profiles_app.catalog import load_catalog
from scheduler_app.core.engine import schedule_round
from scheduler_app.core.placement import PACKED, RoundState
from scheduler_app.core.placement.nodes import NodeCounts
from scheduler_app.core.restarts import RestartPolicy
from scheduler_app.core.types import ClusterSnapshot, JobView, RoundPlan, ServerView
from scheduler_app.simulator import philly_derived_trace


def busy_cluster(num_servers: int, seed: int) -> ClusterSnapshot:
    """Servers of 8 GPUs with some GPUs, cores and memory held outside the round (uneven, so that
    servers with free GPUs lack cores or memory for one demand and not another)."""
    rng = random.Random(seed)
    servers = []
    for i in range(num_servers):
        held = rng.choice((0, 0, 1, 2, 3))
        servers.append(
            ServerView(
                server_id=i,
                name=f"s{i}",
                num_gpus=8,
                num_cpus=24,
                mem_gb=500.0,
                free_gpus=tuple(range(held, 8)),
                free_cpus=24 - 3 * held - rng.choice((0, 1, 2)),
                free_mem_gb=500.0 - 62.5 * held - rng.choice((0.0, 40.0, 120.0)),
            )
        )
    return ClusterSnapshot(tuple(servers))


def rounds(
    allocator: str, seed: int, num_rounds: int = 4
) -> list[tuple[ClusterSnapshot, list[JobView], float]]:
    """A deep queue played for a few rounds under the move guard (every job on one server): each
    round's inputs, jobs keeping what the round before gave them, a few finishing each round."""
    catalog = load_catalog()
    trace = philly_derived_trace(220, jobs_per_hour=400.0, multi_gpu=True, seed=seed)
    jobs = [
        JobView(
            job_id=t.job_id,
            num_gpus=t.num_gpus,
            arrival_s=t.arrival_s,
            profile=catalog[t.model],
            total_iters=t.total_iters,
            startup_s=60.0,
        )
        for t in trace
    ]
    snapshot = busy_cluster(12, seed)
    policy = RestartPolicy(min_run_s=600.0)
    out = []
    now = max(j.arrival_s for j in jobs)
    for k in range(num_rounds):
        out.append((snapshot, jobs, now))
        plan = schedule_round(snapshot, jobs, policy="fifo", allocator=allocator, now_s=now, restarts=policy)
        placed = plan.placements()
        done = set(sorted(placed)[k % 5 :: 6])
        jobs = [
            dataclasses.replace(
                j,
                current=placed.get(j.job_id),
                lease_started_s=(j.lease_started_s if j.current is not None else now)
                if j.job_id in placed
                else None,
            )
            for j in jobs
            if j.job_id not in done
        ]
        now += 300.0
    return out


def decide(snapshot: ClusterSnapshot, jobs: list[JobView], allocator: str, now: float) -> RoundPlan:
    return schedule_round(
        snapshot, jobs, policy="fifo", allocator=allocator, now_s=now, restarts=RestartPolicy(min_run_s=600.0)
    )


@pytest.mark.parametrize("allocator", ["tune", "tune_matrix", "proportional", "greedy"])
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_unfit_memo_and_bucketed_node_servers_change_no_plan(allocator, seed, monkeypatch):
    inputs = rounds(allocator, seed)
    with_memos = [decide(snap, jobs, allocator, now) for snap, jobs, now in inputs]
    memo_reads = []
    real_unfit = NodeCounts._unfit_servers

    def counted(self, *args):
        memo = real_unfit(self, *args)
        memo_reads.append(len(memo))
        return memo

    monkeypatch.setattr(NodeCounts, "_unfit_servers", counted)
    for (snap, jobs, now), plan in zip(inputs, with_memos, strict=True):
        assert decide(snap, jobs, allocator, now) == plan
    assert any(memo_reads), "no search skipped a server: the memo was never exercised"

    # Without the memo (every search scans every server) and with node_servers scanning the counts
    # (a copy of the state's list is not bucketed): the same plans.
    monkeypatch.setattr(NodeCounts, "_unfit_servers", lambda self, *args: None)
    real_node_servers = NodeCounts.node_servers
    monkeypatch.setattr(
        NodeCounts, "node_servers", lambda self, owner, counts: real_node_servers(self, owner, list(counts))
    )
    for (snap, jobs, now), plan in zip(inputs, with_memos, strict=True):
        assert decide(snap, jobs, allocator, now) == plan


def test_node_servers_from_buckets_match_a_scan_of_the_counts():
    snapshot = busy_cluster(20, 4)
    jobs = [
        JobView(
            job_id=i,
            num_gpus=g * n,
            arrival_s=0.0,
            profile=load_catalog()["res18"],
            total_iters=1.0,
            num_nodes=n,
        )
        for i, (g, n) in enumerate(((1, 1), (2, 1), (4, 1), (8, 1), (1, 2), (2, 3), (4, 2), (3, 2)), start=1)
    ]
    state = RoundState(snapshot, jobs)
    taker = random.Random(9)
    for step in range(30):
        for job in jobs:
            for counts in (state.num_free, state.num_unclaimed) if state.has_claims else (state.num_free,):
                assert state.node_servers(job.job_id, counts) == state.node_servers(job.job_id, list(counts))
        if step == 5:
            placed = [
                (j, state.find(PACKED, j.num_gpus, state.prop_cpus, state.prop_mem_gb, j.job_id))
                for j in jobs
            ]
            state = RoundState(snapshot, jobs)
            state.claim_current(
                dataclasses.replace(j, current=_placement(state, j, plan))
                for j, plan in placed
                if plan is not None
            )
        i = taker.randrange(state.num_servers)
        if state.num_free[i]:
            state.take([(i, 1)], state.prop_cpus, state.prop_mem_gb)


def _placement(state: RoundState, job: JobView, plan):
    from scheduler_app.core.types import Placement, ServerShare

    shares = []
    for i, k in plan:
        shares.append(ServerShare(state.server_ids[i], tuple(state.free_idx[i][:k]), 3 * k, 62.5 * k))
    return Placement(job.job_id, tuple(shares), 1.0)
