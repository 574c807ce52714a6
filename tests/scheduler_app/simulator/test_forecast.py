"""The forecast plays the queue forward with the core; checked by hand on one-GPU clusters."""

from __future__ import annotations

import dataclasses

import pytest

from profiles_app.catalog import load_catalog
from scheduler_app.core.engine import schedule_round
from scheduler_app.core.policies.fifo import FifoPolicy
from scheduler_app.core.types import Placement, ServerShare
from scheduler_app.simulator.forecast import forecast
from tests.builders import make_cluster, make_job

RES18_ITER_S = load_catalog()["res18"].iter_time_s


def test_fifo_queue_on_one_gpu_runs_back_to_back_with_exact_finishes():
    # One GPU, proportional: job 1 needs 100 s of work, job 2 (behind it) 50 s; rounds of 300 s.
    # Job 1 runs in round 0 (t=1000) and ends at 1100; its GPU idles until the next round (1300).
    cluster = make_cluster(1, gpus=1, cpus=3, mem_gb=62.5)
    jobs = [
        make_job(1, total_iters=100 / RES18_ITER_S, arrival_s=0.0),
        make_job(2, total_iters=50 / RES18_ITER_S, arrival_s=10.0),
    ]
    out = forecast(cluster, jobs, policy="fifo", allocator="proportional", first_round_s=1000.0)
    assert (out[1].start_s, out[1].finish_s) == (1000.0, pytest.approx(1100.0))
    assert (out[2].start_s, out[2].finish_s) == (1300.0, pytest.approx(1350.0))


def test_progress_and_real_start_of_a_running_job_are_kept():
    cluster = make_cluster(1, gpus=1, cpus=3, mem_gb=62.5)
    running = dataclasses.replace(
        make_job(1, total_iters=1000 / RES18_ITER_S, done_iters=900 / RES18_ITER_S),
        current=Placement(1, (ServerShare(0, (0,), 3, 62.5),), 1.0),
    )
    out = forecast(
        cluster, [running], policy="fifo", allocator="proportional", first_round_s=500.0, started_s={1: 42.0}
    )
    assert out[1].start_s == 42.0 and out[1].finish_s == pytest.approx(600.0)


def test_edf_lets_the_urgent_job_go_first_and_stops_once_the_target_is_done():
    cluster = make_cluster(1, gpus=1, cpus=3, mem_gb=62.5)
    relaxed = make_job(1, total_iters=600 / RES18_ITER_S, arrival_s=0.0, deadline_s=10_000.0)
    urgent = make_job(2, total_iters=60 / RES18_ITER_S, arrival_s=5.0, deadline_s=400.0)
    out = forecast(
        cluster,
        [relaxed, urgent],
        policy="edf",
        allocator="proportional",
        first_round_s=0.0,
        until_finished=[2],
    )
    assert out[2].start_s == 0.0 and out[2].finish_s == pytest.approx(60.0)
    assert out[1] == dataclasses.replace(out[1], start_s=None, finish_s=None)  # stopped after job 2


def test_a_job_that_never_fits_and_the_horizon_give_no_finish():
    cluster = make_cluster(1, gpus=1, cpus=3, mem_gb=62.5)
    too_big = make_job(1, gpus=2)
    long = make_job(2, total_iters=10_000 / RES18_ITER_S)
    out = forecast(
        cluster, [too_big, long], policy="fifo", allocator="proportional", first_round_s=0.0, max_rounds=3
    )
    assert out[1] == dataclasses.replace(out[1], start_s=None, finish_s=None)
    assert out[2].start_s == 0.0 and out[2].finish_s is None  # 900 s of 10,000 done in 3 rounds


def test_bad_round_length_is_refused():
    with pytest.raises(ValueError, match="round_s"):
        forecast(make_cluster(1), [make_job(1)], policy="fifo", allocator="tune", first_round_s=0, round_s=0)


def test_the_time_budget_stops_the_forecast():
    cluster = make_cluster(1, gpus=1, cpus=3, mem_gb=62.5)
    jobs = [make_job(i, total_iters=10 / RES18_ITER_S) for i in range(1, 4)]
    out = forecast(
        cluster, jobs, policy="fifo", allocator="proportional", first_round_s=0.0, time_budget_s=0.0
    )
    assert all(f.finish_s is None for f in out.values())  # stopped before the first round


class FifoWithoutShortcuts(FifoPolicy):
    """FIFO's order, but claiming it may change: without shortcuts the forecast then simulates every
    round and job."""

    static_order = False


def queue_of(n: int) -> list:
    models = ["res18", "alexnet", "lstm", "m5", "res50"]
    return [
        make_job(i, models[i % 5], gpus=1 + (i % 3 == 0) * 3, arrival_s=float(i), total_iters=500.0 + 137 * i)
        for i in range(1, n + 1)
    ]


@pytest.mark.parametrize("allocator", ["proportional", "tune"])
def test_skipping_steady_rounds_changes_nothing(allocator, monkeypatch):
    calls: list[float] = []

    def counted(*args, **kwargs):
        calls.append(kwargs["now_s"])
        return schedule_round(*args, **kwargs)

    monkeypatch.setattr("scheduler_app.simulator.forecast.schedule_round", counted)
    cluster = make_cluster(2, gpus=4, cpus=12, mem_gb=250.0)
    jobs = queue_of(24)
    fast = forecast(cluster, jobs, policy="fifo", allocator=allocator, first_round_s=0.0)
    fast_rounds = len(calls)
    slow = forecast(
        cluster, jobs, policy=FifoWithoutShortcuts(), allocator=allocator, first_round_s=0.0, shortcuts=False
    )
    assert fast_rounds < len(calls) - fast_rounds  # rounds were skipped
    assert {j: (f.start_s, pytest.approx(f.finish_s)) for j, f in fast.items()} == {
        j: (f.start_s, f.finish_s) for j, f in slow.items()
    }


def test_jobs_behind_the_target_are_left_out_without_moving_its_times():
    cluster = make_cluster(2, gpus=4, cpus=12, mem_gb=250.0)
    jobs = queue_of(24)
    target = 12
    fast = forecast(
        cluster, jobs, policy="fifo", allocator="proportional", first_round_s=0.0, until_finished=[target]
    )
    slow = forecast(cluster, jobs, policy=FifoWithoutShortcuts(), allocator="proportional", first_round_s=0.0)
    assert set(fast) == set(range(1, target + 1))
    assert fast[target].start_s == slow[target].start_s
    assert fast[target].finish_s == pytest.approx(slow[target].finish_s)


def test_a_job_after_another_joins_the_queue_the_round_after_it_finishes():
    # Two GPUs: job 2 (1 GPU) waits for job 1 (100 s of work, ends at 1100) although a GPU is free;
    # job 3, independent, takes that GPU at once. Job 2 starts at the next round, 1300.
    cluster = make_cluster(1, gpus=2, cpus=6, mem_gb=125)
    jobs = [
        make_job(1, total_iters=100 / RES18_ITER_S, arrival_s=0.0),
        make_job(2, total_iters=50 / RES18_ITER_S, arrival_s=1.0),
        make_job(3, total_iters=500 / RES18_ITER_S, arrival_s=2.0),
    ]
    out = forecast(
        cluster, jobs, policy="fifo", allocator="proportional", first_round_s=1000.0, after={2: [1]}
    )
    assert (out[1].start_s, out[1].finish_s) == (1000.0, pytest.approx(1100.0))
    assert out[3].start_s == 1000.0
    assert (out[2].start_s, out[2].finish_s) == (1300.0, pytest.approx(1350.0))
    # FIFO with a target: the queue is not cut behind job 2, or job 1 (ahead of it here anyway) and a
    # dependency ordered after it by priority would be lost.
    urgent = dataclasses.replace(jobs[1], priority=5)
    out = forecast(
        cluster,
        [jobs[0], urgent],
        policy="fifo",
        allocator="proportional",
        first_round_s=1000.0,
        until_finished=[2],
        after={2: [1]},
    )
    assert out[2].start_s == 1300.0


def test_a_job_after_one_that_never_finishes_never_starts():
    cluster = make_cluster(1, gpus=1, cpus=3, mem_gb=62.5)
    too_big = make_job(1, gpus=2, total_iters=10, arrival_s=0.0)  # dropped as infeasible
    after_it = make_job(2, total_iters=10, arrival_s=1.0)
    after_unknown = make_job(3, total_iters=10, arrival_s=2.0)
    out = forecast(
        cluster,
        [too_big, after_it, after_unknown],
        policy="fifo",
        allocator="proportional",
        first_round_s=0.0,
        after={2: [1], 3: [99]},
    )
    assert out[2].start_s is None and out[3].start_s is None


def test_an_arrays_limit_lets_its_next_task_in_the_round_after_one_ends():
    # Four GPUs, an array of four 1-GPU tasks (ids 1-4) limited to 2 at once, and task 1 already
    # running. Task 2 takes the second place; 3 and 4 wait although GPUs are free. Task 1 ends at
    # 1100, so task 3 starts in the round after, at 1300; task 4 once task 2 ends (at 1400: 1600).
    cluster = make_cluster(1, gpus=4, cpus=12, mem_gb=250)
    running = dataclasses.replace(
        make_job(1, total_iters=1000 / RES18_ITER_S, done_iters=900 / RES18_ITER_S, arrival_s=0.0),
        current=Placement(1, (ServerShare(0, (0,), 3, 62.5),), 1.0),
    )
    tasks = [running] + [make_job(i, total_iters=400 / RES18_ITER_S, arrival_s=0.0) for i in (2, 3, 4)]
    other = make_job(5, total_iters=400 / RES18_ITER_S, arrival_s=1.0)  # not of the array: starts at once
    out = forecast(
        cluster,
        [*tasks, other],
        policy="fifo",
        allocator="proportional",
        first_round_s=1000.0,
        started_s={1: 500.0},
        array_limits={1: (2, [1, 2, 3, 4])},
    )
    assert out[1].finish_s == pytest.approx(1100.0)
    assert out[2].start_s == out[5].start_s == 1000.0
    assert out[3].start_s == 1300.0 and out[4].start_s == 1600.0
    # Without the limit every task starts at once.
    free = forecast(cluster, tasks, policy="fifo", allocator="proportional", first_round_s=1000.0)
    assert free[3].start_s == free[4].start_s == 1000.0


ONE_GPU = make_cluster(1, gpus=1, cpus=3, mem_gb=62.5)


def on_gpu0(job):
    """`job` running on the one GPU of ONE_GPU with its proportional share."""
    return dataclasses.replace(job, current=Placement(1, (ServerShare(0, (0,), 3, 62.5),), 1.0))


def fifo_from_1000(jobs, **kwargs):
    """The forecast of `jobs` on ONE_GPU, fifo + proportional, from t=1000."""
    return forecast(ONE_GPU, jobs, policy="fifo", allocator="proportional", first_round_s=1000.0, **kwargs)


@pytest.mark.parametrize("shortcuts", [True, False])
def test_a_job_ends_at_its_time_limit_and_frees_its_gpu_for_the_next(shortcuts):
    # One GPU. Job 1 runs (started at 400) with 10,000 s of work left but 950 s of run time left at
    # 1000: it ends at 1950 (TIMEOUT), and job 2, behind it, starts at the next round, 2200, not after
    # job 1's work. Job 3 waits for job 1 (afterok): a job that timed out never completes, so it never
    # starts. Job 4 has a limit longer than its work: it completes.
    running = on_gpu0(
        make_job(1, total_iters=20_000 / RES18_ITER_S, done_iters=10_000 / RES18_ITER_S, arrival_s=0.0)
    )
    jobs = [
        running,
        make_job(2, total_iters=100 / RES18_ITER_S, arrival_s=1.0),
        make_job(3, total_iters=100 / RES18_ITER_S, arrival_s=2.0),
        make_job(4, total_iters=100 / RES18_ITER_S, arrival_s=3.0),
    ]
    out = fifo_from_1000(
        jobs, started_s={1: 400.0}, after={3: [1]}, time_left_s={1: 950.0, 4: 5000.0}, shortcuts=shortcuts
    )
    assert (out[1].start_s, out[1].finish_s, out[1].timed_out) == (400.0, pytest.approx(1950.0), True)
    assert (out[2].start_s, out[2].finish_s, out[2].timed_out) == (2200.0, pytest.approx(2300.0), False)
    assert out[3].start_s is None
    assert (out[4].start_s, out[4].finish_s, out[4].timed_out) == (2500.0, pytest.approx(2600.0), False)
    # Without the limit, job 1 runs its 10,000 s of work and job 2 waits for it.
    out = fifo_from_1000(jobs, started_s={1: 400.0})
    assert out[1].finish_s == pytest.approx(11_000.0) and out[2].start_s == 11_200.0


def test_a_job_started_in_the_forecast_is_charged_from_its_start_and_a_limit_past_the_work_is_no_timeout():
    # Job 2 starts at 1300 (after job 1's 100 s, at the next round) with 400 s of run time left and
    # 1,000 s of work: it ends at 1700. A stretch of repeated rounds (shortcuts) does not pass it.
    jobs = [
        make_job(1, total_iters=100 / RES18_ITER_S, arrival_s=0.0),
        make_job(2, total_iters=1000 / RES18_ITER_S, arrival_s=1.0),
        make_job(3, total_iters=50 / RES18_ITER_S, arrival_s=2.0),
    ]
    out = fifo_from_1000(jobs, time_left_s={1: 100.0, 2: 400.0})
    assert (out[1].finish_s, out[1].timed_out) == (pytest.approx(1100.0), False)
    assert (out[2].start_s, out[2].finish_s, out[2].timed_out) == (1300.0, pytest.approx(1700.0), True)
    assert out[3].start_s == 1900.0


def test_a_job_already_past_its_limit_ends_in_the_first_round():
    running = on_gpu0(make_job(1, total_iters=1000 / RES18_ITER_S, arrival_s=0.0))
    waiting = make_job(2, total_iters=100 / RES18_ITER_S, arrival_s=1.0)
    out = fifo_from_1000([running, waiting], started_s={1: 0.0}, time_left_s={1: -30.0})
    assert (out[1].finish_s, out[1].timed_out) == (1000.0, True)
    assert out[2].start_s == 1300.0
