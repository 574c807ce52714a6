"""The forecast's shortcuts (a plan that leaves every job as it was counts as repeated) change no estimate."""

from __future__ import annotations

from dataclasses import replace

import pytest

from scheduler_app.core.allocators.genie import GenieAllocator, GenieRound
from scheduler_app.core.engine import schedule_round
from scheduler_app.core.policies.aging import Aging
from scheduler_app.core.policies.swaf import SwafPolicy
from scheduler_app.core.restarts import RestartPolicy
from scheduler_app.simulator.forecast import forecast
from scheduler_app.simulator.reuse import holds
from tests.builders import make_cluster, make_job


def deep_queue(n: int) -> list:
    """Jobs of 1 to 4 GPUs and varied lengths: finishes come one by one, and some free GPUs that the
    job at the head of the queue cannot use (rounds that leave everyone as they were)."""
    models = ["res18", "alexnet", "lstm", "m5", "res50"]
    return [
        make_job(
            i, models[i % 5], gpus=(1, 2, 1, 4)[i % 4], arrival_s=float(i), total_iters=300.0 + 211 * (i % 7)
        )
        for i in range(1, n + 1)
    ]


@pytest.mark.parametrize("allocator", ["proportional", "tune"])
@pytest.mark.parametrize("restarts", [None, RestartPolicy()], ids=["free restarts", "restart costs"])
def test_shortcuts_give_the_same_forecast_with_fewer_rounds(allocator, restarts, monkeypatch):
    calls: list[float] = []

    def counted(*args, **kwargs):
        calls.append(kwargs["now_s"])
        return schedule_round(*args, **kwargs)

    monkeypatch.setattr("scheduler_app.simulator.forecast.schedule_round", counted)
    cluster = make_cluster(3, gpus=4, cpus=12, mem_gb=250.0)
    jobs = deep_queue(40)
    kwargs = dict(policy="fifo", allocator=allocator, first_round_s=0.0, round_s=60.0, restarts=restarts)
    fast = forecast(cluster, jobs, **kwargs)
    fast_rounds = len(calls)
    slow = forecast(cluster, jobs, **kwargs, shortcuts=False)
    assert fast_rounds < len(calls) - fast_rounds  # the shortcut saved rounds
    assert all(f.finish_s is not None for f in slow.values())  # a whole forecast, not cut short
    assert {j: (f.start_s, pytest.approx(f.finish_s)) for j, f in fast.items()} == {
        j: (f.start_s, f.finish_s) for j, f in slow.items()
    }


class GenieDecidingEveryRound(GenieAllocator):
    """genie without its keyed allocations: every allocation decided afresh."""

    allocate_keyed = None  # type: ignore[assignment]


def qos_queue(n: int) -> list:
    """deep_queue with a deadline on every fourth job (made longer) and a
    long 4-GPU job that the short ones would keep waiting without aging."""
    jobs = deep_queue(n)
    out = []
    for job in jobs:
        if job.job_id % 4 == 0:  # long runs, with from a few hours to a few minutes to spare
            job = replace(job, total_iters=job.total_iters * 8, deadline_s=3000.0 * (1 + job.job_id % 9))
        out.append(job)
    out.append(make_job(n + 1, "res50", gpus=4, arrival_s=0.5, total_iters=4000.0))
    return out


@pytest.mark.parametrize("restarts", [None, RestartPolicy()], ids=["free restarts", "restart costs"])
@pytest.mark.parametrize("aging", [Aging(factor=1.0, floor_s=0.0), None], ids=["aging", "no aging"])
def test_swaf_genie_reuse_gives_the_same_forecast_with_fewer_allocations(restarts, aging, monkeypatch):
    """swaf + genie (an order by progress and the clock, deadlines read against the clock): rounds and
    allocations reused only where deciding gives the same plan (simulator/reuse.py); estimates identical
    to deciding every round, to the last bit (every round is applied one by one)."""
    calls: list[float] = []
    allocations = {"n": 0}

    def counted(*args, **kwargs):
        calls.append(kwargs["now_s"])
        return schedule_round(*args, **kwargs)

    real_run = GenieRound.run

    def counted_run(self):
        allocations["n"] += 1
        return real_run(self)

    keyed_reuses = {"n": 0}  # rounds reused while a deadline job's need was in the key

    def counted_holds(plan, progress, *args):
        held = holds(plan, progress, *args)
        keyed_reuses["n"] += held and progress != ()
        return held

    monkeypatch.setattr("scheduler_app.simulator.forecast.schedule_round", counted)
    monkeypatch.setattr("scheduler_app.simulator.forecast.holds", counted_holds)
    monkeypatch.setattr(GenieRound, "run", counted_run)
    cluster = make_cluster(3, gpus=4, cpus=12, mem_gb=250.0)
    jobs = qos_queue(40)
    kwargs = dict(policy=SwafPolicy(aging=aging), first_round_s=0.0, round_s=60.0, restarts=restarts)
    fast = forecast(cluster, jobs, allocator=GenieAllocator(), **kwargs)
    fast_rounds, fast_allocations = len(calls), allocations["n"]
    calls.clear()
    allocations["n"] = 0
    slow = forecast(cluster, jobs, allocator=GenieDecidingEveryRound(), **kwargs, shortcuts=False)
    assert all(f.finish_s is not None for f in slow.values())  # a whole forecast, not cut short
    assert fast == slow
    assert fast_rounds < len(calls)  # rounds reused
    assert fast_allocations < 0.8 * allocations["n"]  # and allocations
    assert keyed_reuses["n"] > 0  # some while deadline jobs were running


def busy_cluster_queue(checkpoint_every_s: float | None) -> tuple:
    """A full cluster of long runs placed a few minutes ago, and shorter jobs waiting behind them: under
    a shortest-first order the allocator's plan would preempt the long runs each round and the
    restart guard keeps them (their minimum run time, then their restart costs)."""
    cluster = make_cluster(2, gpus=4, cpus=12, mem_gb=250.0)
    models = ["res18", "alexnet", "lstm", "m5"]
    long_runs = [
        make_job(i, models[i % 4], arrival_s=float(i), total_iters=6000.0 + 500 * i) for i in range(1, 9)
    ]
    placed = schedule_round(cluster, long_runs, policy="fifo", allocator="genie", now_s=0.0).placements()
    running = [
        replace(
            j,
            current=placed[j.job_id],
            lease_started_s=-30.0 * j.job_id,
            startup_s=30.0,
            checkpoint_every_s=checkpoint_every_s,
        )
        for j in long_runs
    ]
    waiting = [
        make_job(100 + i, models[i % 4], arrival_s=10.0 + i, total_iters=400.0 + 150 * i) for i in range(6)
    ]
    return cluster, running + [replace(j, startup_s=30.0) for j in waiting]


@pytest.mark.parametrize("aging", [Aging(factor=1.0, floor_s=0.0), None], ids=["aging", "no aging"])
@pytest.mark.parametrize("checkpoint_every_s", [None, 600.0], ids=["no checkpoints", "checkpoints"])
def test_swaf_genie_guarded_plans_replayed_give_the_same_forecast(aging, checkpoint_every_s, monkeypatch):
    """Plans the restart guard pinned or weighed are replayed (core/guard_trace.py: the lease ages, the
    weighing and the urgent jobs redone on the round's progress and clock, the allocations not), and
    the estimates are those of deciding every round, to the last bit."""
    from scheduler_app.core.move_guard import guarded_replay

    replays = {"plans": 0, "weighed": 0}

    def counted_replay(trace, *args):
        plan = guarded_replay(trace, *args)
        replays["plans"] += plan is not None
        replays["weighed"] += plan is not None and trace.kept is not None
        return plan

    monkeypatch.setattr("scheduler_app.simulator.forecast.guarded_replay", counted_replay)
    cluster, jobs = busy_cluster_queue(checkpoint_every_s)
    kwargs = dict(policy=SwafPolicy(aging=aging), first_round_s=0.0, round_s=60.0, restarts=RestartPolicy())
    fast = forecast(cluster, jobs, allocator=GenieAllocator(), **kwargs)
    slow = forecast(cluster, jobs, allocator=GenieDecidingEveryRound(), **kwargs, shortcuts=False)
    assert all(f.finish_s is not None for f in slow.values())  # a whole forecast, not cut short
    assert fast == slow
    assert replays["plans"] > 0  # guarded plans replayed instead of decided
    assert replays["weighed"] > 0  # the weighing redone on the round's progress, not the allocations


def test_a_guarded_forecast_played_in_pickled_parts_is_the_one_call():
    """A part pickled while a guarded plan is being replayed leaves the trace out (its plans are large):
    the next part decides that round, and the estimates are those of one call."""
    import pickle

    from scheduler_app.simulator.forecast import ForecastRun

    cluster, jobs = busy_cluster_queue(None)
    kwargs = dict(policy=SwafPolicy(aging=None), first_round_s=0.0, round_s=60.0, restarts=RestartPolicy())
    whole = forecast(cluster, jobs, allocator=GenieAllocator(), **kwargs)
    run = ForecastRun(cluster, jobs, allocator=GenieAllocator(), **kwargs)
    guarded = 0
    while not run.done:
        asked = {"n": 0}

        def three_rounds(_cpu_s: float, asked: dict = asked) -> bool:
            asked["n"] += 1
            return asked["n"] > 3

        run.play(three_rounds)
        guarded += run.guard is not None
        run = pickle.loads(pickle.dumps(run))
        assert run.guard is None
    assert guarded > 0  # some parts ended while a guarded plan was replayed
    assert run.results() == whole
