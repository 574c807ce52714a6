"""Team GPU quotas in the engine: held back in policy order before placement, Kueue-style."""

from __future__ import annotations

import dataclasses
from collections import defaultdict

from hypothesis import given
from hypothesis import strategies as st

from scheduler_app.core import reasons
from scheduler_app.core.engine import schedule_round, within_team_quotas
from tests.builders import make_cluster, make_job
from tests.scheduler_app.core.helpers import outcomes
from tests.scheduler_app.core.test_allocator_contracts import (
    ALLOCATOR_NAMES,
    HYPOTHESIS,
    POLICY_NAMES,
    check_all_or_nothing,
    check_decisions_match_jobs,
    check_no_over_commit,
    rounds,
)


def team(job, team_id):
    return dataclasses.replace(job, team_id=team_id)


def test_jobs_over_their_teams_quota_wait_and_others_take_the_gpus():
    # Team 1 may hold 4 GPUs: its 2 + 2 fit, its next 2 waits, its 1-GPU job... also waits (4 used).
    # Team 2 (no quota) and jobs without a team are not capped.
    jobs = [
        team(make_job(1, gpus=2, arrival_s=1), 1),
        team(make_job(2, gpus=2, arrival_s=2), 1),
        team(make_job(3, gpus=2, arrival_s=3), 1),
        team(make_job(4, gpus=4, arrival_s=4), 2),
        make_job(5, gpus=1, arrival_s=5),
        team(make_job(6, gpus=1, arrival_s=6), 1),
    ]
    plan = schedule_round(
        make_cluster(2), jobs, policy="fifo", allocator="tune", now_s=0.0, team_quota_gpus={1: 4}
    )
    assert [(j, o, r) for j, o, r in outcomes(plan) if o != "placed"] == [
        (3, "pending", reasons.QUOTA_EXCEEDED),
        (6, "pending", reasons.QUOTA_EXCEEDED),
    ]
    assert [d.job_id for d in plan.decisions] == [1, 2, 3, 4, 5, 6]  # policy order kept


def test_a_smaller_later_job_of_the_team_may_still_fit_its_quota():
    jobs = [
        team(make_job(1, gpus=3), 7),
        team(make_job(2, gpus=2, arrival_s=1), 7),
        team(make_job(3, gpus=1, arrival_s=2), 7),
    ]
    admitted, held_back = within_team_quotas(jobs, {7: 4})
    assert [j.job_id for j in admitted] == [1, 3] and held_back == {2}


def test_no_quotas_change_nothing():
    jobs = [team(make_job(i, gpus=2, arrival_s=i), 1) for i in range(1, 5)]
    cluster = make_cluster(1)
    assert schedule_round(cluster, jobs, policy="fifo", allocator="tune", now_s=0.0) == schedule_round(
        cluster, jobs, policy="fifo", allocator="tune", now_s=0.0, team_quota_gpus={}
    )
    zero = schedule_round(cluster, jobs, policy="fifo", allocator="tune", now_s=0.0, team_quota_gpus={1: 0})
    assert {r for _, _, r in outcomes(zero)} == {reasons.QUOTA_EXCEEDED}


def test_a_borrowing_team_takes_idle_gpus_beyond_its_quota_and_gives_them_back_first():
    # One 8-GPU server. Team 1 (quota 2, may borrow) has three 2-GPU jobs; team 2 (quota 4) one job.
    cluster = make_cluster(1)
    mine = [team(make_job(i, gpus=2, arrival_s=i), 1) for i in (1, 2, 3)]
    theirs = team(make_job(9, gpus=4, arrival_s=9), 2)
    quotas = {1: 2, 2: 4}
    plan = schedule_round(
        cluster, mine, policy="fifo", allocator="tune", now_s=0.0, team_quota_gpus=quotas, borrowing_teams={1}
    )
    assert [(j, o) for j, o, _ in outcomes(plan)] == [(1, "placed"), (2, "placed"), (3, "placed")]
    assert [r for _, _, r in outcomes(plan)][1:] == [reasons.BORROWED, reasons.BORROWED]
    assert outcomes(plan)[0][2] != reasons.BORROWED  # within its quota
    # Without borrowing they wait, with 6 GPUs idle.
    strict = schedule_round(cluster, mine, policy="fifo", allocator="tune", now_s=0.0, team_quota_gpus=quotas)
    assert [r for _, _, r in outcomes(strict)][1:] == [reasons.QUOTA_EXCEEDED] * 2

    # Team 2's job arrives later (last in FIFO order), yet within its quota it comes before borrowers:
    # the borrowed GPUs go back, the later borrower first.
    running = [dataclasses.replace(job, current=plan.decisions[k].placement) for k, job in enumerate(mine)]
    plan = schedule_round(
        cluster,
        [*running, theirs],
        policy="fifo",
        allocator="tune",
        now_s=1.0,
        team_quota_gpus=quotas,
        borrowing_teams={1},
    )
    by_job = {j: (o, r) for j, o, r in outcomes(plan)}
    assert by_job[9][0] == "placed" and by_job[1][0] == "placed"
    assert by_job[2] == ("placed", reasons.BORROWED) and by_job[3] == ("pending", reasons.QUOTA_EXCEEDED)


@HYPOTHESIS
@given(
    data=rounds(),
    allocator=st.sampled_from(ALLOCATOR_NAMES),
    policy=st.sampled_from(POLICY_NAMES),
    teams=st.lists(st.sampled_from([None, 1, 2, 3]), min_size=18, max_size=18),
    quotas=st.fixed_dictionaries({1: st.integers(0, 8), 2: st.integers(0, 8)}),
    borrowing=st.sets(st.sampled_from([1, 2, 3])),
)
def test_borrowing_keeps_every_allocator_invariant_and_every_quota_it_does_not_lend(
    data, allocator, policy, teams, quotas, borrowing
):
    cluster, jobs = data
    jobs = [team(job, teams[k]) for k, job in enumerate(jobs)]
    plan = schedule_round(
        cluster,
        jobs,
        policy=policy,
        allocator=allocator,
        now_s=1000.0,
        team_quota_gpus=quotas,
        borrowing_teams=borrowing,
    )
    ordered = [next(j for j in jobs if j.job_id == d.job_id) for d in plan.decisions]
    check_decisions_match_jobs(ordered, plan)
    check_no_over_commit(cluster, plan)
    check_all_or_nothing(ordered, plan)
    by_id = {j.job_id: j for j in jobs}
    within: dict[int, int] = defaultdict(int)
    for d in plan.decisions:
        job = by_id[d.job_id]
        if d.reason == reasons.BORROWED:
            assert job.team_id in borrowing and job.team_id in quotas, d  # only a capped lender-borrower
        elif d.placement is not None and job.team_id is not None:
            within[job.team_id] += job.num_gpus
    for team_id, quota in quotas.items():
        assert within[team_id] <= quota  # what is not borrowed stays within the quota
