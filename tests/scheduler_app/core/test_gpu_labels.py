"""A running job re-decided onto its own server keeps its own GPU indices there: no move for nothing."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from scheduler_app.core import reasons
from scheduler_app.core.allocators import Allocator
from scheduler_app.core.engine import schedule_round
from scheduler_app.core.gpu_labels import keep_gpu_indices
from scheduler_app.core.restarts import Change, RestartPolicy, change_of
from scheduler_app.core.types import Decision, Outcome, Placement, RoundPlan, ServerShare
from tests.builders import make_cluster, make_job


def share(server_id: int, gpus: tuple[int, ...]) -> ServerShare:
    return ServerShare(server_id, gpus, 3 * len(gpus), 62.5 * len(gpus))


def placed(job_id: int, *shares: ServerShare) -> Decision:
    return Decision(job_id, Outcome.PLACED, reasons.PROPORTIONAL, Placement(job_id, shares, 1.0))


def test_a_job_placed_on_other_indices_of_its_own_server_gets_its_own_back():
    a = make_job(1, gpus=2, current=Placement(1, (share(0, (4, 5)),), 1.0))
    b = make_job(2, gpus=2)
    plan = RoundPlan((placed(1, share(0, (0, 1))), placed(2, share(0, (4, 5)))))
    kept = keep_gpu_indices(plan, [a, b])
    assert kept.decision_for(1).placement.shares == (share(0, (4, 5)),)
    assert kept.decision_for(2).placement.shares == (share(0, (0, 1)),)
    assert change_of(a.current, kept.decision_for(1).placement) is Change.KEPT


def test_a_job_on_another_server_or_with_another_count_is_left_as_planned():
    a = make_job(1, gpus=2, current=Placement(1, (share(0, (4, 5)),), 1.0))
    c = make_job(3, gpus=4, current=Placement(3, (share(1, (0, 1)),), 1.0))
    plan = RoundPlan((placed(1, share(1, (4, 5))), placed(3, share(1, (0, 1, 2, 3)))))
    assert keep_gpu_indices(plan, [a, c]) == plan


@given(st.lists(st.integers(min_value=1, max_value=4), min_size=1, max_size=6), st.randoms())
def test_relabelling_uses_each_servers_planned_indices_once_and_only_those(sizes, rng):
    # Jobs hold random disjoint GPUs of one 8-GPU server now; the plan puts them on random other ones.
    gpus = list(range(8))
    rng.shuffle(gpus)
    jobs, decisions, now, planned = [], [], 0, 0
    for i, n in enumerate(sizes):
        if planned + n > 8:
            break
        mine = tuple(sorted(gpus[now : now + n])) if now + n <= 8 else ()
        now += n
        jobs.append(make_job(i, gpus=n, current=Placement(i, (share(0, mine),), 1.0) if mine else None))
        decisions.append(placed(i, share(0, tuple(sorted(gpus[::-1][planned : planned + n])))))
        planned += n
    plan = RoundPlan(tuple(decisions))
    out = keep_gpu_indices(plan, jobs)
    used_before = sorted(g for d in plan.decisions for s in d.placement.shares for g in s.gpu_indices)
    used_after = sorted(g for d in out.decisions for s in d.placement.shares for g in s.gpu_indices)
    assert used_after == used_before  # a permutation of the plan's own indices
    for before, after in zip(plan.decisions, out.decisions, strict=True):
        assert after.placement.num_gpus == before.placement.num_gpus


class LowestIndicesFirst(Allocator):
    """Places each job, in order, on the first server's lowest free GPU indices, blind to where it runs:
    the shuffle a repacking allocator can make."""

    name = "lowest-first"

    def allocate(self, ordered_jobs, snapshot):
        free = list(snapshot.servers[0].free_gpus)
        decisions = []
        for job in ordered_jobs:
            mine, free = tuple(free[: job.num_gpus]), free[job.num_gpus :]
            decisions.append(placed(job.job_id, share(0, mine)))
        return RoundPlan(tuple(decisions))


def test_the_guarded_round_keeps_a_jobs_gpus_where_the_allocator_alone_would_shuffle_them():
    # Job 1 holds GPUs 4-7, job 2 arrives after it: the allocator alone gives job 1, first in FIFO,
    # GPUs 0-3 (a restart for nothing) and job 2 GPUs 4-7. Weighing restarts, job 1 keeps its GPUs.
    # (The scripted allocator gives every job the reason `proportional`.)
    one = make_job(1, gpus=4, arrival_s=0.0, current=Placement(1, (share(0, (4, 5, 6, 7)),), 1.0))
    two = make_job(2, gpus=4, arrival_s=5.0)
    args = {"policy": "fifo", "allocator": LowestIndicesFirst(), "now_s": 1e6}
    free = schedule_round(make_cluster(1), [one, two], **args)
    assert free.decision_for(1).placement.shares[0].gpu_indices == (0, 1, 2, 3)
    guarded = schedule_round(make_cluster(1), [one, two], restarts=RestartPolicy(), **args)
    assert guarded.decision_for(1).placement.shares[0].gpu_indices == (4, 5, 6, 7)
    assert guarded.decision_for(2).placement.shares[0].gpu_indices == (0, 1, 2, 3)
    # The allocator's plan, relabelled, restarts nobody: it stands with its own reason (the guard did
    # not have to keep job 1 against a move, which would say `restart_cost`).
    assert guarded.decision_for(1).reason == reasons.PROPORTIONAL
