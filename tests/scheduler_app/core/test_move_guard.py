"""Restart costs and the move guard: running jobs stay put unless a change pays for its restarts."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given
from hypothesis import strategies as st

from scheduler_app.core import reasons
from scheduler_app.core.engine import schedule_round
from scheduler_app.core.move_guard import guarded_plan, one_server_views
from scheduler_app.core.restarts import (
    Change,
    RestartPolicy,
    change_of,
    is_restart,
    lost_work_s,
    plan_value,
    restart_cost_s,
)
from scheduler_app.core.types import (
    ClusterSnapshot,
    Decision,
    JobView,
    Outcome,
    Placement,
    RoundPlan,
    ServerShare,
)
from tests.builders import make_cluster, make_job
from tests.scheduler_app.core.helpers import FLAT
from tests.scheduler_app.core.test_allocator_contracts import (
    ALLOCATOR_NAMES,
    HYPOTHESIS,
    POLICY,
    check_all_or_nothing,
    check_decisions_match_jobs,
    check_no_over_commit,
    rounds,
)

NOW_S = 10_000.0


def on(server_id: int, gpus: tuple[int, ...], cpus: int = 3, mem_gb: float = 62.5, speedup: float = 1.0):
    return ServerShare(server_id, gpus, cpus * len(gpus), mem_gb * len(gpus)), speedup


def placement(job_id: int, *shares: tuple[ServerShare, float]) -> Placement:
    return Placement(job_id, tuple(s for s, _ in shares), shares[0][1] if shares else 1.0)


def running(job_id: int, gpus: int, where: Placement, *, started_s: float, **kw) -> JobView:
    return JobView(
        job_id=job_id,
        num_gpus=gpus,
        arrival_s=0.0,
        profile=FLAT,
        total_iters=kw.pop("total_iters", 10_000.0),
        current=where,
        lease_started_s=started_s,
        **kw,
    )


def pending(job_id: int, gpus: int, **kw) -> JobView:
    return JobView(
        job_id=job_id,
        num_gpus=gpus,
        arrival_s=1.0,
        profile=FLAT,
        total_iters=kw.pop("total_iters", 1000.0),
        **kw,
    )


# -- the cost model ------------------------------------------------------------------------------
def test_a_change_is_kept_resized_moved_or_preempted():
    here = placement(1, on(0, (0, 1)))
    assert change_of(None, here) is None
    assert change_of(here, here) is Change.KEPT
    assert change_of(here, placement(1, on(0, (0, 1), cpus=5))) is Change.RESIZED
    assert change_of(here, placement(1, on(1, (0, 1)))) is Change.MOVED
    assert change_of(here, placement(1, on(0, (0,)), on(1, (0,)))) is Change.MOVED
    assert change_of(here, None) is Change.PREEMPTED
    live, offline = RestartPolicy(), RestartPolicy(resize_in_place=False)
    assert not is_restart(Change.RESIZED, live) and is_restart(Change.RESIZED, offline)
    assert is_restart(Change.MOVED, live) and is_restart(Change.PREEMPTED, live)
    assert not is_restart(Change.KEPT, offline) and not is_restart(None, offline)


def test_a_restart_costs_the_start_up_and_the_run_since_the_last_checkpoint():
    where = placement(1, on(0, (0,)))
    job = running(1, 1, where, started_s=NOW_S - 1_450.0, startup_s=40.0, checkpoint_every_s=600.0)
    assert lost_work_s(job, NOW_S) == pytest.approx(250.0)  # 1,450 s: checkpoints at 600 and 1,200
    assert restart_cost_s(job, NOW_S) == pytest.approx(290.0)
    never = dataclasses.replace(job, checkpoint_every_s=None)
    assert lost_work_s(never, NOW_S) == pytest.approx(1_450.0)  # no checkpoint: the whole lease
    assert lost_work_s(dataclasses.replace(job, current=None), NOW_S) == 0.0
    assert lost_work_s(dataclasses.replace(job, lease_started_s=None), NOW_S) == 0.0


def test_a_plans_value_is_minus_its_jobs_finish_times_with_the_restarts_delays():
    policy = RestartPolicy(horizon_s=1000.0)
    where = placement(1, on(0, (0,)))
    # 2,000 iterations left at 1 iteration/s: it finishes in 2,000 s (weight 2: first in order).
    job = running(1, 1, where, started_s=NOW_S - 300.0, startup_s=100.0, total_iters=2000.0)
    assert plan_value({1: where}, [job], NOW_S, policy) == pytest.approx(-2.0 * 2000.0)
    moved = placement(1, on(1, (0,)))
    # Moved: 100 s of start-up and the 300 s since the lease started done again delay it 400 s.
    assert plan_value({1: moved}, [job], NOW_S, policy) == pytest.approx(-2.0 * 2400.0)
    assert plan_value({1: moved}, [job], NOW_S, policy, charge_restarts=False) == pytest.approx(-2.0 * 2000.0)
    # Twice as fast within the horizon: 2,000 iterations by 1,000 s.
    fast = placement(1, on(1, (0,), speedup=2.0))
    assert plan_value({1: fast}, [job], NOW_S, policy, charge_restarts=False) == pytest.approx(-2.0 * 1000.0)
    # Preempted: no progress within the horizon, then its start-up and the redone run.
    assert plan_value({}, [job], NOW_S, policy) == pytest.approx(-2.0 * (1000.0 + 100.0 + 2300.0))
    assert plan_value({}, [job], NOW_S, policy, charge_restarts=False) == pytest.approx(-2.0 * 3000.0)
    # A short job: the same 400 s delay costs the same 400 s, whatever its length.
    short = dataclasses.replace(job, total_iters=100.0)
    kept_value = plan_value({1: where}, [short], NOW_S, policy)
    assert kept_value == pytest.approx(-2.0 * 100.0)
    assert kept_value - plan_value({1: moved}, [short], NOW_S, policy) == pytest.approx(2.0 * 400.0)


# -- the guard, with a scripted allocator ------------------------------------------------------
def scripted(plans: dict[frozenset[int], RoundPlan]):
    """A `decide` that answers each set of jobs with the plan given for it (and records the calls)."""
    calls: list[tuple[frozenset[int], ClusterSnapshot]] = []

    def decide(jobs, snapshot, team_used):
        key = frozenset(j.job_id for j in jobs)
        calls.append((key, snapshot))
        return plans[key]

    decide.calls = calls
    return decide


def placed(p: Placement, reason: str = reasons.PROPORTIONAL) -> Decision:
    return Decision(p.job_id, Outcome.PLACED, reason, p)


def test_a_plan_that_moves_nobody_costs_one_decision():
    here = placement(1, on(0, (0, 1)))
    job = running(1, 2, here, started_s=NOW_S - 5.0)
    decide = scripted({frozenset({1}): RoundPlan((placed(here),))})
    plan = guarded_plan(decide, [job], make_cluster(2), NOW_S, RestartPolicy())
    assert plan.decisions == (placed(here),) and len(decide.calls) == 1


def test_a_young_job_is_not_moved_and_its_resources_are_taken_out_for_the_others():
    here, there = placement(1, on(0, tuple(range(8)))), placement(1, on(1, tuple(range(8))))
    job = running(1, 8, here, started_s=NOW_S - 60.0, startup_s=30.0)
    newcomer = pending(2, 8)
    decide = scripted(
        {
            frozenset({1, 2}): RoundPlan((placed(there), placed(placement(2, on(0, tuple(range(8))))))),
            frozenset({2}): RoundPlan((placed(placement(2, on(1, tuple(range(8))))),)),
        }
    )
    plan = guarded_plan(decide, [job, newcomer], make_cluster(2), NOW_S, RestartPolicy(min_run_s=300.0))
    assert plan.decision_for(1) == Decision(1, Outcome.PLACED, reasons.MIN_RUN_TIME, here)
    assert plan.decision_for(2).placement.shares[0].server_id == 1
    _, reduced = decide.calls[1]
    assert reduced.servers[0].free_gpus == () and reduced.servers[0].free_cpus == 0
    assert reduced.servers[1] == make_cluster(2).servers[1]


def test_a_move_that_does_not_pay_for_its_restart_is_not_made():
    # The allocator would move a long job to another server for 2 % more speed: its restart costs
    # 100 s of start-up and the 1,000 s since its start (no checkpoints), more than the gain.
    here, there = placement(1, on(0, (0,))), placement(1, on(1, (0,), speedup=1.02))
    job = running(1, 1, here, started_s=NOW_S - 1_000.0, startup_s=100.0, total_iters=100_000.0)
    decide = scripted({frozenset({1}): RoundPlan((placed(there),)), frozenset(): RoundPlan(())})
    plan = guarded_plan(decide, [job], make_cluster(2), NOW_S, RestartPolicy(min_run_s=300.0))
    assert plan.decision_for(1) == Decision(1, Outcome.PLACED, reasons.RESTART_COST, here)
    # With checkpoints every minute and a quick start, twice the speed pays for the move.
    fast = placement(1, on(1, (0,), speedup=2.0))
    cheap = dataclasses.replace(job, checkpoint_every_s=60.0, startup_s=5.0)
    decide = scripted({frozenset({1}): RoundPlan((placed(fast),)), frozenset(): RoundPlan(())})
    assert guarded_plan(decide, [cheap], make_cluster(2), NOW_S, RestartPolicy()).decision_for(1) == placed(
        fast
    )


def test_a_preemption_for_a_job_ahead_pays_when_the_restart_is_cheap_and_not_when_it_is_dear():
    here = placement(1, on(0, (0, 1)))
    # 2,000 s of work left against the 1,000 s of a job ahead of it in the policy's order.
    low = running(
        1, 2, here, started_s=NOW_S - 3_600.0, startup_s=10.0, checkpoint_every_s=60.0, total_iters=2000.0
    )
    high = pending(2, 2, total_iters=1000.0)
    takes = placement(2, on(0, (0, 1)))
    plans = {
        frozenset({1, 2}): RoundPlan(
            (placed(takes), Decision(1, Outcome.PENDING, reasons.INSUFFICIENT_GPUS))
        ),
        frozenset({2}): RoundPlan((Decision(2, Outcome.PENDING, reasons.INSUFFICIENT_GPUS),)),
    }
    cluster = make_cluster(1, gpus=2, cpus=6, mem_gb=125.0)
    plan = guarded_plan(scripted(plans), [high, low], cluster, NOW_S, RestartPolicy())
    assert plan.decision_for(2).placement == takes and plan.decision_for(1).outcome is Outcome.PENDING
    # The same without checkpoints: an hour of the low job's run would be done again.
    dear = dataclasses.replace(low, checkpoint_every_s=None)
    plan = guarded_plan(scripted(plans), [high, dear], cluster, NOW_S, RestartPolicy())
    assert plan.decision_for(1) == Decision(1, Outcome.PLACED, reasons.RESTART_COST, here)
    assert plan.decision_for(2).outcome is Outcome.PENDING


def test_a_kept_job_still_gets_the_cores_the_allocator_resized_it_to():
    # The allocator would move job 2 (it does not pay) and give job 1 more cores on its GPU (free in
    # place): the guard keeps job 2 and still gives job 1 its new cores, with its own reason.
    one, two = placement(1, on(0, (0,))), placement(2, on(1, (0,)))
    grown = placement(1, on(0, (0,), cpus=12, speedup=1.5))
    job1 = running(1, 1, one, started_s=NOW_S - 5_000.0)
    job2 = running(2, 1, two, started_s=NOW_S - 5_000.0, startup_s=100.0, total_iters=100_000.0)
    plans = {
        frozenset({1, 2}): RoundPlan(
            (placed(grown, reasons.BEST_CASE), placed(placement(2, on(0, (1,), speedup=1.01))))
        ),
        frozenset(): RoundPlan(()),
    }
    plan = guarded_plan(scripted(plans), [job1, job2], make_cluster(2), NOW_S, RestartPolicy())
    assert plan.decision_for(1) == placed(grown, reasons.BEST_CASE)
    assert plan.decision_for(2) == Decision(2, Outcome.PLACED, reasons.RESTART_COST, two)


def test_a_deadline_that_cannot_wait_out_the_minimum_run_time_overrides_it():
    here = placement(1, on(0, (0, 1)))
    low = running(1, 2, here, started_s=NOW_S - 10.0)
    plans = {
        frozenset({1, 2}): RoundPlan(
            (placed(placement(2, on(0, (0, 1)))), Decision(1, Outcome.PENDING, reasons.INSUFFICIENT_GPUS))
        ),
        frozenset({2}): RoundPlan((Decision(2, Outcome.PENDING, reasons.INSUFFICIENT_GPUS),)),
    }
    cluster = make_cluster(1, gpus=2, cpus=6, mem_gb=125.0)
    # 1,000 s of work due in 1,100 s: 100 s of slack, less than the 300 s minimum run time.
    urgent = pending(2, 2, deadline_s=NOW_S + 1_100.0)
    plan = guarded_plan(scripted(plans), [urgent, low], cluster, NOW_S, RestartPolicy(min_run_s=300.0))
    assert plan.decision_for(2).outcome is Outcome.PLACED
    relaxed = dataclasses.replace(urgent, deadline_s=NOW_S + 5_000.0)
    plan = guarded_plan(scripted(plans), [relaxed, low], cluster, NOW_S, RestartPolicy(min_run_s=300.0))
    assert (
        plan.decision_for(1).reason == reasons.MIN_RUN_TIME
        and plan.decision_for(2).outcome is Outcome.PENDING
    )


def test_a_job_on_a_server_that_is_gone_or_over_quota_is_never_pinned():
    gone = running(1, 2, placement(1, on(5, (0, 1))), started_s=NOW_S - 1.0)
    borrower = running(2, 2, placement(2, on(0, (0, 1))), started_s=NOW_S - 1.0)
    plans = {
        frozenset({1, 2}): RoundPlan(
            (placed(placement(1, on(1, (0, 1)))), placed(placement(2, on(0, (2, 3)))))
        )
    }
    plan = guarded_plan(
        scripted(plans), [gone, borrower], make_cluster(2), NOW_S, RestartPolicy(), never_pinned={2}
    )
    assert plan == plans[frozenset({1, 2})]


# -- one server ----------------------------------------------------------------------------------
def test_a_job_that_fits_on_one_server_waits_for_one_rather_than_spreading():
    # Two servers with 2 GPUs free each: a 4-GPU job spreads without restart costs, waits with them.
    half_busy = make_cluster(2, gpus=4, cpus=12, mem_gb=250.0)
    busy = tuple(
        dataclasses.replace(s, free_gpus=(2, 3), free_cpus=6, free_mem_gb=125.0) for s in half_busy.servers
    )
    cluster = ClusterSnapshot(busy)
    job = make_job(1, gpus=4)
    free = schedule_round(cluster, [job], policy="fifo", allocator="tune", now_s=NOW_S)
    assert free.decision_for(1).placement.num_servers == 2
    plan = schedule_round(
        cluster, [job], policy="fifo", allocator="tune", now_s=NOW_S, restarts=RestartPolicy()
    )
    assert plan.decision_for(1).outcome is Outcome.PENDING
    # Bigger than any server: it still spreads.
    big = make_job(2, gpus=8)
    plan = schedule_round(
        make_cluster(2, gpus=4, cpus=12, mem_gb=250.0),
        [big],
        policy="fifo",
        allocator="tune",
        now_s=NOW_S,
        restarts=RestartPolicy(),
    )
    assert plan.decision_for(2).placement.num_servers == 2
    assert one_server_views([dataclasses.replace(job, num_nodes=2)], cluster)[0].num_nodes == 2


def test_an_eight_gpu_job_stays_on_its_server_when_a_node_joins():
    # The demo: an 8-GPU job alone on server 0; a second and a third server join.
    first = schedule_round(make_cluster(1), [make_job(1, gpus=8)], policy="fifo", allocator="tune", now_s=0.0)
    where = first.decision_for(1).placement
    job = dataclasses.replace(
        make_job(1, gpus=8, total_iters=1e6), current=where, lease_started_s=0.0, startup_s=60.0
    )
    for now_s in (35.0, 50.0, 4_000.0):
        plan = schedule_round(
            make_cluster(3), [job], policy="fifo", allocator="tune", now_s=now_s, restarts=RestartPolicy()
        )
        assert plan.decision_for(1).placement.shares == where.shares


# -- invariants with every allocator -----------------------------------------------------------
@pytest.mark.parametrize("name", ALLOCATOR_NAMES)
@HYPOTHESIS
@given(case=rounds(), policy=POLICY, ages=st.lists(st.floats(0.0, 1_000.0), min_size=40, max_size=40))
def test_the_guard_keeps_every_allocators_invariants(name, case, policy, ages):
    cluster, jobs = case
    jobs = [
        dataclasses.replace(j, lease_started_s=NOW_S - ages[i % len(ages)], startup_s=30.0)
        if j.current
        else j
        for i, j in enumerate(jobs)
    ]
    plan = schedule_round(cluster, jobs, policy=policy, allocator=name, now_s=NOW_S, restarts=RestartPolicy())
    ordered = [next(j for j in jobs if j.job_id == d.job_id) for d in plan.decisions]
    check_decisions_match_jobs(ordered, plan)
    check_no_over_commit(cluster, plan)
    check_all_or_nothing(ordered, plan)
    # Pinned jobs keep their GPUs (their cores and memory may change: resizes are free in place, and
    # no server is over-committed, as checked above); nobody runs on a server outside the snapshot.
    servers = {s.server_id: s for s in cluster.servers}
    for d in plan.decisions:
        if d.reason in (reasons.MIN_RUN_TIME, reasons.RESTART_COST):
            current = ordered[plan.decisions.index(d)].current
            assert [(s.server_id, s.gpu_indices) for s in d.placement.shares] == [
                (s.server_id, s.gpu_indices) for s in current.shares
            ]
        if d.placement is not None:
            assert {s.server_id for s in d.placement.shares} <= servers.keys()


def test_a_young_jobs_surplus_cores_do_not_push_a_newcomer_to_another_server():
    # tune gives each of two 1-GPU jobs 12 of server 0's 24 cores; a 2-GPU job arriving next packs
    # onto server 0 (the young jobs shrink in place to make room) rather than taking server 1.
    cluster = make_cluster(2)
    jobs: list[JobView] = []
    now_s = NOW_S
    for job_id, model, gpus in ((1, "shufflenet", 1), (2, "alexnet", 1), (3, "m5", 2)):
        jobs.append(make_job(job_id, model, gpus=gpus, arrival_s=now_s, total_iters=1e6))
        plan = schedule_round(
            cluster, jobs, policy="fifo", allocator="tune", now_s=now_s, restarts=RestartPolicy()
        )
        jobs = [
            dataclasses.replace(
                j,
                current=plan.decision_for(j.job_id).placement,
                lease_started_s=j.lease_started_s if j.current is not None else now_s,
            )
            for j in jobs
        ]
        now_s += 10.0
    assert {d.placement.shares[0].server_id for d in plan.decisions} == {0}


def test_a_move_that_gains_its_own_job_nothing_is_not_made_beside_one_that_pays():
    # The allocator moves two long-running jobs to the new server 1: job 2 for three times its speed,
    # job 1 to the same speed (a repacking). Both restarts are cheap, and together they pay, but job
    # 1's pays for nothing: it stays, and job 2 alone moves.
    home1, home2 = placement(1, on(0, (0,))), placement(2, on(0, (1,)))
    there1, there2 = placement(1, on(1, (0,))), placement(2, on(1, (1,), speedup=3.0))
    cheap = {"started_s": NOW_S - 3_600.0, "startup_s": 5.0, "checkpoint_every_s": 60.0}
    one, two = running(1, 1, home1, **cheap), running(2, 1, home2, **cheap)
    decide = scripted(
        {
            frozenset({1, 2}): RoundPlan((placed(there1), placed(there2))),
            frozenset(): RoundPlan(()),
            frozenset({2}): RoundPlan((placed(there2),)),
        }
    )
    plan = guarded_plan(decide, [one, two], make_cluster(2), NOW_S, RestartPolicy())
    assert plan.decision_for(1) == Decision(1, Outcome.PLACED, reasons.RESTART_COST, home1)
    assert plan.decision_for(2) == placed(there2)


def test_a_move_that_makes_room_for_a_job_that_fits_nowhere_else_is_made():
    # Job 1 gains nothing by moving to server 1, but its move frees server 0 whole for job 3 (2 GPUs),
    # which has no other room (a young job 4 holds server 1's other GPU): the move pays.
    two_gpus = make_cluster(2, gpus=2, cpus=6, mem_gb=125.0)
    home1, there1 = placement(1, on(0, (0,))), placement(1, on(1, (0,)))
    one = running(1, 1, home1, started_s=NOW_S - 3_600.0, startup_s=5.0, checkpoint_every_s=60.0)
    four_at = placement(4, on(1, (1,)))
    four = running(4, 1, four_at, started_s=NOW_S - 10.0)
    three = pending(3, 2, total_iters=1000.0)
    waits = Decision(3, Outcome.PENDING, reasons.INSUFFICIENT_GPUS)
    decide = scripted(
        {
            frozenset({1, 3, 4}): RoundPlan(
                (placed(there1), placed(placement(3, on(0, (0, 1)))), placed(four_at))
            ),
            frozenset({3}): RoundPlan((waits,)),
        }
    )
    plan = guarded_plan(decide, [one, three, four], two_gpus, NOW_S, RestartPolicy())
    assert plan.decision_for(1) == placed(there1)
    assert plan.decision_for(3).placement == placement(3, on(0, (0, 1)))


def test_a_resize_is_a_restart_on_a_server_whose_agent_cannot_make_it_live():
    here = placement(1, on(0, (0,)))
    grown = placement(1, on(0, (0,), cpus=12, speedup=1.02))
    assert not is_restart(change_of(here, grown), RestartPolicy(), here)
    static = RestartPolicy(static_servers=frozenset({0}))
    assert is_restart(change_of(here, grown), static, here)
    # A young job resized for 2 % more speed: free where the agent resizes live, kept as it is (the
    # guard's minimum run time) where its server would restart it.
    job = running(1, 1, here, started_s=NOW_S - 10.0)
    plans = {frozenset({1}): RoundPlan((placed(grown, reasons.BEST_CASE),)), frozenset(): RoundPlan(())}
    assert guarded_plan(scripted(plans), [job], make_cluster(1), NOW_S, RestartPolicy()).decision_for(
        1
    ) == placed(grown, reasons.BEST_CASE)
    kept = guarded_plan(scripted(plans), [job], make_cluster(1), NOW_S, static).decision_for(1)
    assert kept == Decision(1, Outcome.PLACED, reasons.MIN_RUN_TIME, here)


def test_a_deadline_override_releases_only_the_jobs_holding_what_the_late_job_needs():
    # Two servers of 2 GPUs, both jobs young: the unguarded plan preempts job 1 for the urgent job 2
    # and, in passing, moves job 3 to its server's other GPU. Only job 1 holds what job 2 needs: job 3
    # stays where it is.
    cluster = make_cluster(2, gpus=2, cpus=6, mem_gb=125.0)
    home1, home3 = placement(1, on(0, (0, 1))), placement(3, on(1, (0,)))
    one = running(1, 2, home1, started_s=NOW_S - 10.0)
    three = running(3, 1, home3, started_s=NOW_S - 10.0)
    urgent = pending(2, 2, deadline_s=NOW_S + 1_100.0)  # 100 s of slack: cannot wait 300 s
    takes = placement(2, on(0, (0, 1)))
    preempted = Decision(1, Outcome.PENDING, reasons.INSUFFICIENT_GPUS)
    plans = {
        frozenset({1, 2, 3}): RoundPlan((placed(takes), preempted, placed(placement(3, on(1, (1,)))))),
        frozenset({2}): RoundPlan((Decision(2, Outcome.PENDING, reasons.INSUFFICIENT_GPUS),)),
        frozenset({1, 2}): RoundPlan((placed(takes), preempted)),
    }
    plan = guarded_plan(scripted(plans), [urgent, one, three], cluster, NOW_S, RestartPolicy(min_run_s=300.0))
    assert plan.decision_for(2).placement == takes
    assert plan.decision_for(1).outcome is Outcome.PENDING
    assert plan.decision_for(3).placement == home3


def test_a_met_deadline_is_worth_a_horizon_of_finish_time():
    policy = RestartPolicy(horizon_s=1000.0)
    where = placement(1, on(0, (0,)))
    job = running(1, 1, where, started_s=NOW_S - 300.0, startup_s=100.0, total_iters=500.0)
    in_time = dataclasses.replace(job, deadline_s=NOW_S + 600.0)  # finishes at 500 s kept, 900 s moved
    moved = placement(1, on(1, (0,)))
    assert plan_value({1: where}, [in_time], NOW_S, policy) == pytest.approx(-2.0 * (500.0 - 1000.0))
    # Moved, it finishes 400 s later and misses its deadline: 400 s and the bonus lost.
    assert plan_value({1: moved}, [in_time], NOW_S, policy) == pytest.approx(-2.0 * 900.0)
