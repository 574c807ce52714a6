"""Team GPU quotas in the engine: held back in policy order before placement, Kueue-style."""

from __future__ import annotations

import dataclasses

from scheduler_app.core import reasons
from scheduler_app.core.engine import schedule_round, within_team_quotas
from tests.builders import make_cluster, make_job
from tests.scheduler_app.core.helpers import outcomes


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
