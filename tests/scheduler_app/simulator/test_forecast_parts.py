"""A forecast played in parts (ForecastRun), pickled between them, gives what one call gives."""

from __future__ import annotations

import itertools
import pickle

import pytest

from scheduler_app.core.policies.aging import Aging
from scheduler_app.core.policies.swaf import SwafPolicy
from scheduler_app.core.restarts import RestartPolicy
from scheduler_app.simulator.forecast import RECENT_ROUNDS, ForecastRun, forecast
from tests.builders import make_cluster
from tests.scheduler_app.simulator.test_forecast_shortcuts import deep_queue, qos_queue


def play_in_parts(
    run: ForecastRun, rounds_per_part: int, *, pickled: bool
) -> tuple[ForecastRun, list[set[int]]]:
    """Play `run` `rounds_per_part` rounds at a time (pickled and read back between parts, as the
    refresh keeps it in Redis); returns the run and what each part found settled."""
    settled = []
    while not run.done:
        asked = itertools.count()
        run.play(lambda last_s, asked=asked: last_s < 0.0 or next(asked) >= rounds_per_part)
        settled.append(run.settled())
        if pickled:
            run = pickle.loads(pickle.dumps(run, protocol=pickle.HIGHEST_PROTOCOL))
    return run, settled


# Time limits (forecast_limits.py) on every third job, a few of them shorter than the job's work.
TIME_LEFT_S = {job_id: 30.0 + 20.0 * (job_id % 5) for job_id in range(1, 41, 3)}
CASES = {
    "fifo + tune, restart costs": (deep_queue(40), "fifo", "tune", RestartPolicy(), None),
    "fifo + proportional": (deep_queue(40), "fifo", "proportional", None, None),
    "fifo + proportional, time limits": (deep_queue(40), "fifo", "proportional", None, TIME_LEFT_S),
    "swaf + genie, restart costs": (
        qos_queue(24),
        SwafPolicy(aging=Aging(1.0, 0.0)),
        "genie",
        RestartPolicy(),
        None,
    ),
}


@pytest.mark.parametrize("case", CASES, ids=list(CASES))
@pytest.mark.parametrize("pickled", [True, False], ids=["pickled between parts", "in memory"])
def test_a_forecast_played_in_parts_is_the_forecast_played_at_once(case, pickled):
    jobs, policy, allocator, restarts, time_left_s = CASES[case]
    cluster = make_cluster(3, gpus=4, cpus=12, mem_gb=250.0)
    kwargs = dict(
        policy=policy,
        allocator=allocator,
        first_round_s=0.0,
        round_s=60.0,
        restarts=restarts,
        time_left_s=time_left_s,
    )
    whole = forecast(cluster, jobs, **kwargs)
    assert sum(f.finish_s is not None for f in whole.values()) == len(jobs)  # played to the end
    if time_left_s:
        assert sum(f.timed_out for f in whole.values()) >= 3  # some ended at their limit

    run, settled = play_in_parts(ForecastRun(cluster, jobs, **kwargs), 1, pickled=pickled)

    assert len(settled) > 3  # in parts indeed
    assert run.results() == whole  # exactly: the same rounds
    # A job settled after a part keeps the times it had then, to the end.
    for i, part in enumerate(settled[:-1]):
        assert part <= settled[i + 1]
    first = next(part for part in settled if part)
    assert all(whole[job_id].finish_s is not None for job_id in first)


def test_the_budget_stops_a_part_before_the_round_that_would_overrun_it():
    """`stop` is asked before each round with the costliest of the last rounds' CPU, across parts."""
    cluster = make_cluster(3, gpus=4, cpus=12, mem_gb=250.0)
    run = ForecastRun(
        cluster, deep_queue(40), policy="fifo", allocator="tune", first_round_s=0.0, round_s=60.0
    )
    asked: list[float] = []
    run.play(lambda round_s: asked.append(round_s) or len(asked) > 2)
    assert asked[0] == 0.0 and asked[1] > 0.0 and run.k >= 2 and not run.done
    assert asked[2] == max(run.recent_round_cpu_s)
    run.play(lambda round_s: asked.append(round_s) or True)  # a later part: the rounds before
    assert asked[-1] == asked[2] > 0.0
    run.recent_round_cpu_s.extend([9.0] + [0.001] * (RECENT_ROUNDS - 1))
    run.play(lambda round_s: asked.append(round_s) or True)
    assert asked[-1] == 9.0  # the costliest of the last RECENT_ROUNDS, not the last one
    run.recent_round_cpu_s.append(0.001)
    run.play(lambda round_s: asked.append(round_s) or True)
    assert asked[-1] == 0.001  # ... and only of those
    assert run.play() and run.done and run.settled() == set(run.sim_jobs)


def test_a_time_budget_of_nothing_plays_no_round():
    cluster = make_cluster(1, gpus=1, cpus=3, mem_gb=62.5)
    run = ForecastRun(cluster, deep_queue(3), policy="fifo", allocator="proportional", first_round_s=0.0)
    assert not run.play(lambda _last_s: True)
    assert run.k == 0 and run.settled() == set()
    assert all(f.start_s is None and f.finish_s is None for f in run.results().values())


def test_a_run_pickled_without_time_limits_plays_on_with_none():
    # As a refresh cycle's part pickled before the forecast had time limits, read after an upgrade.
    jobs = deep_queue(12)
    cluster = make_cluster(3, gpus=4, cpus=12, mem_gb=250.0)
    kwargs = dict(policy="fifo", allocator="proportional", first_round_s=0.0, round_s=60.0)
    run = ForecastRun(cluster, jobs, **kwargs)
    asked = itertools.count()
    run.play(lambda _last_s: next(asked) >= 2)
    state = run.__getstate__()
    del state["limits"]
    old = ForecastRun.__new__(ForecastRun)
    old.__setstate__(state)
    old = pickle.loads(pickle.dumps(old))
    old.play()
    assert old.results() == forecast(cluster, jobs, **kwargs)
