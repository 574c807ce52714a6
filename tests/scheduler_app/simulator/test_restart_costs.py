"""Restart costs in the simulator and the forecast: start-ups and lost work charged exactly (by hand),
the move guard cutting preemptions, and the forecast passing the restart policy to its rounds."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path

import pytest

from scheduler_app.core.restarts import RestartPolicy
from scheduler_app.core.types import ClusterSnapshot, Decision, JobView, Placement, RoundPlan, ServerShare
from scheduler_app.simulator import ClusterSpec, TraceJob, read_trace, simulate
from scheduler_app.simulator.forecast import forecast
from scheduler_app.simulator.restart_costs import RestartCosts
from tests.scheduler_app.simulator.fakes import (
    FifoPolicy,
    RotatingAllocator,
    StickyProportionalAllocator,
    toy_profile,
)

CATALOG = {"toy": toy_profile()}  # 1 s per iteration: iterations = seconds
TWO_GPUS = ClusterSpec(servers=1, gpus_per_server=2, cpus_per_server=6, mem_gb_per_server=100.0)
STATIC_TRACE = Path(__file__).resolve().parents[2] / "data/synergy/static_100job.csv"


def run(trace, allocator, **kwargs):
    return simulate(
        trace,
        TWO_GPUS,
        policy=FifoPolicy(),
        allocator=allocator,
        catalog=CATALOG,
        round_s=100.0,
        first_round_s=0.0,
        **kwargs,
    )


class MoveOnceAllocator(StickyProportionalAllocator):
    """Moves a job running on GPU 0 to GPU 1; a job on GPU 1 stays."""

    name = "test-move-once"

    def allocate(self, ordered_jobs: Sequence[JobView], snapshot: ClusterSnapshot) -> RoundPlan:
        plan = super().allocate(ordered_jobs, snapshot)
        views = {j.job_id: j for j in ordered_jobs}
        out = []
        for d in plan.decisions:
            cur = views[d.job_id].current
            if d.placement is not None and cur is not None and cur.shares[0].gpu_indices == (0,):
                old = cur.shares[0]
                moved = ServerShare(old.server_id, (1,), old.num_cpus, old.mem_gb)
                d = Decision(d.job_id, d.outcome, d.reason, Placement(d.job_id, (moved,), 1.0))
            out.append(d)
        return RoundPlan(decisions=tuple(out))


class ResizingAllocator(StickyProportionalAllocator):
    """Keeps every job on its GPUs but gives it 2 and 3 cores in turn (a resize each round)."""

    name = "test-resizing"

    def allocate(self, ordered_jobs: Sequence[JobView], snapshot: ClusterSnapshot) -> RoundPlan:
        plan = super().allocate(ordered_jobs, snapshot)
        out = []
        for d in plan.decisions:
            if d.placement is not None:
                share = d.placement.shares[0]
                cur = next(j.current for j in ordered_jobs if j.job_id == d.job_id)
                cpus = 2 if cur is None or cur.shares[0].num_cpus == 3 else 3
                share = dataclasses.replace(share, num_cpus=cpus)
                d = Decision(d.job_id, d.outcome, d.reason, dataclasses.replace(d.placement, shares=(share,)))
            out.append(d)
        return RoundPlan(decisions=tuple(out))


# Moved every round (100 s rounds), 20 s start-up, a checkpoint every 30 s of run, 250 iterations:
#   t=0    first start: 20 s start-up, 80 s run -> 80 done; saved at 30 and 60 s of run -> 60
#   t=100  moved: back to 60 (20 s lost), 20 s start-up, 80 s run -> 140; saved 120
#   t=200  moved: back to 120, start-up, 80 s -> 200; saved 180
#   t=300  moved: back to 180, start-up, the last 70 -> finishes at 300 + 20 + 70 = 390
# Lost: 3 restarts x (20 s start-up + 20 s redone) x 1 GPU = 120 GPU-seconds.
def test_start_up_and_work_since_the_checkpoint_are_charged_exactly() -> None:
    result = run(
        [TraceJob(0, "toy", 0.0, 250, 1)],
        RotatingAllocator(),
        restart_costs=RestartCosts(startup_s=20.0, checkpoint_every_s=30.0),
    )
    record = result.records[0]
    assert record.jct_s == pytest.approx(390.0)
    assert (record.preemptions, record.moves) == (3, 3)
    assert record.restart_lost_gpu_s == pytest.approx(120.0)
    assert result.restart_lost_gpu_h == pytest.approx(120.0 / 3600)
    assert result.to_dict(include_records=False)["restart_costs"]["checkpoint_every_s"] == 30.0
    # Free restarts: 250 s; the older start-up-only charge: 20 s a restart, nothing redone, no first start-up.
    assert run([TraceJob(0, "toy", 0.0, 250, 1)], RotatingAllocator()).records[0].jct_s == pytest.approx(250)
    older = run([TraceJob(0, "toy", 0.0, 250, 1)], RotatingAllocator(), restart_overhead_s=20.0)
    assert older.records[0].jct_s == pytest.approx(290.0)  # 100 + (20 + 80) + (20 + 70)
    assert older.records[0].restart_lost_gpu_s == pytest.approx(40.0)


# The same with the first start free (restarts only charged, the benches' --free-first-start):
#   t=0    100 s run -> 100 done; saved at 30, 60 and 90 s of run -> 90
#   t=100  moved: back to 90 (10 s lost), 20 s start-up, 80 s run -> 170; saved 150
#   t=200  moved: back to 150 (20 s lost), start-up, 80 s -> 230; saved 210
#   t=300  moved: back to 210 (20 s lost), start-up, the last 40 -> finishes at 360
# Lost: 3 start-ups of 20 s + 50 s redone = 110 GPU-seconds.
def test_a_first_start_may_be_left_free() -> None:
    result = run(
        [TraceJob(0, "toy", 0.0, 250, 1)],
        RotatingAllocator(),
        restart_costs=RestartCosts(startup_s=20.0, checkpoint_every_s=30.0, first_start_waits=False),
    )
    record = result.records[0]
    assert record.jct_s == pytest.approx(360.0)
    assert record.restart_lost_gpu_s == pytest.approx(110.0)
    assert result.to_dict(include_records=False)["restart_costs"]["first_start_waits"] is False


# No checkpoints: a restart loses the lease's whole run. 150 iterations, 10 s start-up:
#   t=0    10 s start-up, 90 done on GPU 0
#   t=100  moved to GPU 1: back to 0 (90 s lost), 10 s start-up, 90 done
#   t=200  kept: the last 60 -> finishes at 260.  Lost: 90 + 10 = 100 GPU-seconds.
def test_without_checkpoints_a_restart_loses_the_whole_lease() -> None:
    result = run(
        [TraceJob(0, "toy", 0.0, 150, 1)], MoveOnceAllocator(), restart_costs=RestartCosts(startup_s=10.0)
    )
    record = result.records[0]
    assert record.jct_s == pytest.approx(260.0)
    assert (record.preemptions, record.moves) == (1, 1)
    assert record.restart_lost_gpu_s == pytest.approx(100.0)


def test_a_start_up_longer_than_a_round_carries_over() -> None:
    # 250 s start-up, 100 s rounds, never moved: progress starts at 250; 100 iterations end at 350.
    result = run(
        [TraceJob(0, "toy", 0.0, 100, 1)],
        StickyProportionalAllocator(),
        restart_costs=RestartCosts(startup_s=250.0),
    )
    assert result.records[0].jct_s == pytest.approx(350.0)
    assert result.records[0].restart_lost_gpu_s == 0.0  # a first start is no restart


def test_a_resize_on_the_same_gpus_is_free_in_place_and_a_restart_otherwise() -> None:
    trace = [TraceJob(0, "toy", 0.0, 250, 1)]
    costs = RestartCosts(startup_s=20.0, checkpoint_every_s=30.0)
    in_place = run(trace, ResizingAllocator(), restart_costs=costs, restarts=RestartPolicy(min_run_s=0.0))
    assert in_place.records[0].jct_s == pytest.approx(270.0)  # the first start-up only
    assert in_place.records[0].preemptions == 0
    restarted = run(trace, ResizingAllocator(), restart_costs=costs)  # no policy: any change restarts
    assert restarted.records[0].jct_s == pytest.approx(390.0)  # as when moved every round
    assert (restarted.records[0].preemptions, restarted.records[0].moves) == (3, 0)


def test_views_carry_the_costs_and_the_lease_start_on_the_sim_clock() -> None:
    seen: list[JobView] = []

    class Spy(StickyProportionalAllocator):
        reads_progress = True  # it keeps what it sees: every round decided, none answered from memory

        def allocate(self, ordered_jobs, snapshot):
            seen.extend(ordered_jobs)
            return super().allocate(ordered_jobs, snapshot)

    run(
        [TraceJob(0, "toy", 0.0, 250, 1)],
        Spy(),
        restart_costs=RestartCosts(startup_s=20.0, checkpoint_every_s=30.0, startup_s_by_model={"toy": 45.0}),
    )
    assert [(v.startup_s, v.checkpoint_every_s, v.lease_started_s) for v in seen] == [
        (45.0, 30.0, None),
        (45.0, 30.0, 0.0),
        (45.0, 30.0, 0.0),
    ]


def test_the_move_guard_cuts_preemptions_on_the_static_trace() -> None:
    trace = read_trace(STATIC_TRACE)
    testbed = ClusterSpec(servers=4, gpus_per_server=8, cpus_per_server=24, mem_gb_per_server=500.0)
    costs = RestartCosts(startup_s=120.0, checkpoint_every_s=600.0)
    free = simulate(trace, testbed, policy="fifo", allocator="tune", restart_costs=costs)
    guarded = simulate(
        trace, testbed, policy="fifo", allocator="tune", restart_costs=costs, restarts=RestartPolicy()
    )
    assert guarded.total_preemptions * 4 < free.total_preemptions
    assert guarded.restart_lost_gpu_h * 4 < free.restart_lost_gpu_h
    assert guarded.avg_jct_h < free.avg_jct_h
    assert guarded.restart_policy == dataclasses.asdict(RestartPolicy()) and free.restart_policy is None


def test_forecast_passes_the_restart_policy_and_charges_start_ups() -> None:
    calls: list[int] = []

    class Spy(RotatingAllocator):
        def allocate(self, ordered_jobs, snapshot):
            calls.append(len(ordered_jobs))
            return super().allocate(ordered_jobs, snapshot)

    snapshot = TWO_GPUS.snapshot()
    profile = toy_profile()
    running = JobView(
        job_id=1,
        num_gpus=1,
        arrival_s=0.0,
        profile=profile,
        total_iters=1250.0,
        done_iters=1000.0,
        current=Placement(1, (ServerShare(0, (0,), 3, 50.0),), 1.0),
        startup_s=30.0,
        lease_started_s=0.0,  # 1000 s ago, no checkpoints: a move would lose 970 s of run
    )
    pending = JobView(job_id=2, num_gpus=1, arrival_s=5.0, profile=profile, total_iters=100.0, startup_s=30.0)

    def finishes(restarts: RestartPolicy | None) -> tuple[float | None, float | None]:
        calls.clear()
        out = forecast(
            snapshot,
            [running, pending],
            policy=FifoPolicy(),
            allocator=Spy(),
            first_round_s=1000.0,
            round_s=100.0,
            restarts=restarts,
        )
        return out[1].finish_s, out[2].finish_s

    # Free restarts: moved every round at no cost, and the new job starts at once.
    assert finishes(None) == (pytest.approx(1250.0), pytest.approx(1100.0))
    assert len(calls) == 3
    # With the policy: the rounds decide twice (the guard's pinned plan) and keep job 1 where it runs,
    # so it loses nothing; job 2 waits its 30 s start-up.
    assert finishes(RestartPolicy()) == (pytest.approx(1250.0), pytest.approx(1130.0))
    assert len(calls) > 3
