"""The forecast's shortcuts (a plan that leaves every job as it was counts as repeated) change no estimate."""

from __future__ import annotations

from dataclasses import replace
from itertools import pairwise

import pytest

from scheduler_app.core.allocators.genie import GenieAllocator, GenieRound
from scheduler_app.core.engine import schedule_round
from scheduler_app.core.policies.aging import Aging
from scheduler_app.core.policies.sjf import SjfPolicy
from scheduler_app.core.policies.srtf import SrtfPolicy
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


# Time limits on every third job, some shorter than its work (forecast_limits.py): a stretch of
# rounds played in one step must stop where one of them ends a job.
TIME_LEFT_S = {job_id: 30.0 + 20.0 * (job_id % 5) for job_id in range(1, 41, 3)}


@pytest.mark.parametrize("allocator", ["proportional", "tune"])
@pytest.mark.parametrize("restarts", [None, RestartPolicy()], ids=["free restarts", "restart costs"])
@pytest.mark.parametrize("time_left_s", [None, TIME_LEFT_S], ids=["no time limits", "time limits"])
def test_shortcuts_give_the_same_forecast_with_fewer_rounds(allocator, restarts, time_left_s, monkeypatch):
    calls: list[float] = []

    def counted(*args, **kwargs):
        calls.append(kwargs["now_s"])
        return schedule_round(*args, **kwargs)

    monkeypatch.setattr("scheduler_app.simulator.forecast.schedule_round", counted)
    cluster = make_cluster(3, gpus=4, cpus=12, mem_gb=250.0)
    jobs = deep_queue(40)
    kwargs = dict(
        policy="fifo",
        allocator=allocator,
        first_round_s=0.0,
        round_s=60.0,
        restarts=restarts,
        time_left_s=time_left_s,
    )
    fast = forecast(cluster, jobs, **kwargs)
    fast_rounds = len(calls)
    slow = forecast(cluster, jobs, **kwargs, shortcuts=False)
    assert fast_rounds < len(calls) - fast_rounds  # the shortcut saved rounds
    assert all(f.finish_s is not None for f in slow.values())  # a whole forecast, not cut short
    assert {j: (f.start_s, pytest.approx(f.finish_s), f.timed_out) for j, f in fast.items()} == {
        j: (f.start_s, f.finish_s, f.timed_out) for j, f in slow.items()
    }
    assert any(f.timed_out for f in slow.values()) == bool(time_left_s)


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


def long_runs_and_a_queue(n_waiting: int) -> list:
    """Long runs of different models (different speeds: the shortest-first order among them changes
    as they progress) on 1 and 2 GPUs, and jobs waiting behind them, some long enough to age."""
    models = ["res18", "alexnet", "lstm", "m5", "res50", "mobilenet"]
    running = [
        make_job(
            i, models[i % 6], gpus=(1, 2)[i % 2], arrival_s=float(i), total_iters=3000.0 + 1700 * (i % 5)
        )
        for i in range(1, 7)
    ]
    waiting = [
        make_job(100 + i, models[(i + 2) % 6], gpus=1, arrival_s=50.0 + i, total_iters=900.0 + 2500 * (i % 3))
        for i in range(n_waiting)
    ]
    return running + waiting


@pytest.mark.parametrize(
    ("policy", "allocator"),
    [
        (SwafPolicy(aging=Aging(factor=1.0, floor_s=0.0)), "genie"),
        (SwafPolicy(aging=None), "genie"),
        (SwafPolicy(aging=Aging(factor=0.5, floor_s=600.0)), "tune"),
        ("las", "tune"),
        ("las", "proportional"),
        (SrtfPolicy(aging=Aging(factor=0.5, floor_s=600.0)), "tune"),
        (SjfPolicy(aging=Aging(factor=1.0, floor_s=0.0)), "genie"),
    ],
    ids=[
        "swaf+genie, aging",
        "swaf+genie",
        "swaf+tune, aging",
        "las+tune",
        "las+proportional",
        "srtf+tune, aging",
        "sjf+genie, aging",
    ],
)
@pytest.mark.parametrize("late", [False, True], ids=["no deadline", "a deadline out of reach"])
@pytest.mark.parametrize("costs", [False, True], ids=["free restarts", "restart costs, checkpoints"])
def test_stretches_of_a_reused_plan_checked_once_give_the_same_forecast(
    policy, allocator, late, costs, monkeypatch
):
    """A plan reused under an order that moves linearly (Policy.linear_regime) is checked at
    the end of a stretch of rounds, not at each (ForecastRun._jump): the estimates are those of
    deciding every round, to the last bit, where the order among the running jobs changes as they
    progress, waiting jobs age and jobs finish in the middle of what would be a stretch."""
    from scheduler_app.simulator.forecast import ForecastRun

    jumped = {"stretches": 0, "rounds": 0}
    real_jump = ForecastRun._jump

    def counted_jump(self, plan, views, k):
        to = real_jump(self, plan, views, k)
        jumped["stretches"] += to > k
        jumped["rounds"] += to - k
        return to

    monkeypatch.setattr(ForecastRun, "_jump", counted_jump)
    cluster = make_cluster(2, gpus=4, cpus=12, mem_gb=250.0)
    jobs = long_runs_and_a_queue(5)
    if late:  # a deadline job in the late tail (genie's need key: out of reach)
        jobs[2] = replace(jobs[2], deadline_s=30.0)
    kwargs = dict(policy=policy, allocator=allocator, first_round_s=0.0, round_s=60.0, max_rounds=20000)
    if costs:  # start-ups, checkpoints (the run since the last one lost at a restart) and the guard
        jobs = [replace(j, startup_s=30.0, checkpoint_every_s=600.0) for j in jobs]
        kwargs["restarts"] = RestartPolicy()
    fast = forecast(cluster, jobs, **kwargs)
    assert jumped["stretches"] > 0 and jumped["rounds"] > 5 * jumped["stretches"]
    slow = forecast(cluster, jobs, **kwargs, shortcuts=False)
    assert all(f.finish_s is not None for f in slow.values())  # a whole forecast, not cut short
    assert fast == slow


def test_no_stretch_where_a_qos_target_may_be_met_or_a_job_runs_on_other_gpus_than_asked():
    """SWAF's keys are linear only where every deadline is out of reach (the late tail, by E_best) and
    every running job holds the GPUs it asked for (its wait is then constant while it runs); the
    groups it gives are the aged jobs."""
    from dataclasses import replace as with_

    cluster = make_cluster(1, gpus=4, cpus=12, mem_gb=250.0)
    jobs = long_runs_and_a_queue(2)
    swaf = SwafPolicy(aging=Aging(factor=1.0, floor_s=0.0))
    assert swaf.linear_regime(jobs, cluster, 0.0) == frozenset()
    late = with_(jobs[-1], deadline_s=5.0)  # out of reach at 100 s
    assert swaf.linear_regime([*jobs[:-1], late], cluster, 100.0) is not None
    assert swaf.linear_regime([*jobs[:-1], with_(late, deadline_s=1e9)], cluster, 100.0) is None
    for rate in (0.1, 1e6):  # a minimum rate the best case reaches (its group), and one it does not
        assert (
            swaf.linear_regime([*jobs[:-1], with_(jobs[-1], min_rate_iters_per_s=rate)], cluster, 0.0)
            == set()
        )
    two = jobs[0]
    assert two.num_gpus == 2
    placed = schedule_round(cluster, [two], policy="fifo", allocator="tune", now_s=0.0).placements()
    on_two = with_(two, current=placed[two.job_id])
    assert swaf.linear_regime([on_two], cluster, 0.0) is not None
    assert swaf.linear_regime([with_(on_two, num_gpus=1)], cluster, 0.0) is None  # holds 2, asked 1
    # The aged jobs are the groups: a job that waited longer than it is long.
    assert swaf.linear_regime(jobs, cluster, 1e6) == frozenset(j.job_id for j in jobs)

    class OwnThreshold(Aging):
        def threshold_for_s(self, proportional_s: float) -> float:
            return 100.0

    for policy in (
        SwafPolicy(aging=OwnThreshold()),
        SrtfPolicy(aging=OwnThreshold()),
        SjfPolicy(aging=OwnThreshold()),
    ):
        assert policy.linear_regime(jobs, cluster, 0.0) is None  # a threshold of its own: not known


@pytest.mark.parametrize("allocator", ["genie", "tune", "proportional"])
@pytest.mark.parametrize("policy_class", [SwafPolicy, SrtfPolicy, SjfPolicy])
def test_a_job_that_ages_in_the_middle_of_a_stretch_starts_when_it_would(
    allocator, policy_class, monkeypatch
):
    """Four long runs fill the cluster and a longer job waits behind them, shortest first, until it has
    waited a third of its length (aging factor 0.3): then it goes first and starts. The stretches of
    the reused plan end where the order no longer holds, and the forecast is deciding every round's."""
    from scheduler_app.simulator.forecast import ForecastRun

    jumped = {"rounds": 0}
    real_jump = ForecastRun._jump

    def counted_jump(self, plan, views, k):
        to = real_jump(self, plan, views, k)
        jumped["rounds"] += to - k
        return to

    monkeypatch.setattr(ForecastRun, "_jump", counted_jump)
    cluster = make_cluster(1, gpus=4, cpus=12, mem_gb=250.0)
    running = [make_job(i, "res18", arrival_s=float(i), total_iters=40000.0 + 3000 * i) for i in range(1, 5)]
    waiting = make_job(9, "res18", arrival_s=10.0, total_iters=60000.0)
    policy = policy_class(aging=Aging(factor=0.3, floor_s=0.0))
    kwargs = dict(policy=policy, allocator=allocator, first_round_s=0.0, round_s=60.0, max_rounds=50000)
    fast = forecast(cluster, [*running, waiting], **kwargs)
    slow = forecast(cluster, [*running, waiting], **kwargs, shortcuts=False)
    assert fast == slow
    assert jumped["rounds"] > 100
    # It started (aged) before the first of the long runs finished.
    assert fast[9].start_s < min(fast[i].finish_s for i in range(1, 5))


def test_a_stretch_applies_at_most_its_cap_of_rounds_between_two_budget_checks(monkeypatch):
    """`play` asks its caller's budget before each round; a stretch of a reused plan plays at most
    STRETCH_MOST_ROUNDS rounds (then the round at its end) in one go, so a bounded refresh cannot run
    far past its CPU budget in one stretch, and the cap changes no estimate."""
    from scheduler_app.simulator import forecast as forecast_module
    from scheduler_app.simulator.forecast import ForecastRun

    cluster = make_cluster(2, gpus=4, cpus=12, mem_gb=250.0)
    jobs = long_runs_and_a_queue(5)
    kwargs = dict(policy="las", allocator="tune", first_round_s=0.0, round_s=60.0, max_rounds=20000)
    slow = forecast(cluster, jobs, **kwargs, shortcuts=False)

    def longest_stretch(most_rounds: int) -> int:
        monkeypatch.setattr(forecast_module, "STRETCH_MOST_ROUNDS", most_rounds)
        run = ForecastRun(cluster, jobs, **kwargs)
        asked_at: list[int] = []

        def never_stop(_cpu_s: float) -> bool:
            asked_at.append(run.k)
            return False

        assert run.play(never_stop)
        assert run.results() == slow
        return max(b - a for a, b in pairwise(asked_at)) - 1

    assert longest_stretch(10**6) > 4  # uncapped, some stretch is longer than 4 rounds
    assert longest_stretch(4) == 4


@pytest.mark.parametrize(("n", "servers"), [(18, 4), (62, 3), (64, 2)])
def test_under_the_move_guard_no_round_is_skipped_where_the_guard_would_start_a_job_later(n, servers):
    # The guard reads lease ages and the clock: it may hold a waiting job back (a move to make room
    # does not pay yet) and let it start rounds later with no job arriving or finishing in between.
    # Skipping those "steady" rounds, as is exact without the guard, started it only at the next
    # finish: these queues gave other starts than playing every round.
    cluster = make_cluster(servers, gpus=4, cpus=12, mem_gb=250.0)
    kwargs = dict(
        policy="fifo", allocator="proportional", first_round_s=0.0, round_s=60.0, restarts=RestartPolicy()
    )
    fast = forecast(cluster, deep_queue(n), **kwargs)
    slow = forecast(cluster, deep_queue(n), **kwargs, shortcuts=False)
    assert {j: (f.start_s, pytest.approx(f.finish_s)) for j, f in fast.items()} == {
        j: (f.start_s, f.finish_s) for j, f in slow.items()
    }
