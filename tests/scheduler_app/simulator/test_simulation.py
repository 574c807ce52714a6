"""Hand-checked tiny traces: exact vs round-end completion, restarts, idle jumps, windows, results."""

from __future__ import annotations

import json
import math

import pytest

from scheduler_app.core.registry import UnknownNameError
from scheduler_app.simulator import (
    ClusterSpec,
    TraceError,
    TraceJob,
    default_first_round_s,
    philly_derived_trace,
    simulate,
)
from tests.scheduler_app.simulator.fakes import (
    FifoPolicy,
    LeastServicePolicy,
    NeverAllocator,
    RotatingAllocator,
    StickyProportionalAllocator,
    toy_profile,
)

CATALOG = {"toy": toy_profile(), "slow": toy_profile("slow", iter_time_s=0.3)}
TWO_GPUS = ClusterSpec(servers=1, gpus_per_server=2, cpus_per_server=6, mem_gb_per_server=100.0)
ONE_GPU = ClusterSpec(servers=1, gpus_per_server=1, cpus_per_server=3, mem_gb_per_server=50.0)


def run(trace, cluster=TWO_GPUS, *, policy=None, allocator=None, **kwargs):
    kwargs.setdefault("round_s", 100.0)
    kwargs.setdefault("first_round_s", 0.0)
    return simulate(
        trace,
        cluster,
        policy=policy or FifoPolicy(),
        allocator=allocator or StickyProportionalAllocator(),
        catalog=CATALOG,
        **kwargs,
    )


def jcts(result) -> dict[int, float | None]:
    return {r.job_id: r.jct_s for r in result.records}


# Three 1-GPU jobs on 2 GPUs, 100 s rounds, 1 s per iteration (iterations = seconds):
#   t=0   A, B run (C arrives at 10)       A 100/150, B 100/250
#   t=100 FIFO: A, B run, C waits          A needs 50 -> exact finish 150;  B 200/250
#   t=200 B, C run                         B needs 50 -> exact finish 250;  C 100/120
#   t=300 C runs                           C needs 20 -> exact finish 320
# Round-end: each finishes at the end of that round instead: A 200, B 300, C 400.
THREE_JOBS = [
    TraceJob(0, "toy", 0.0, 150, 1),
    TraceJob(1, "toy", 0.0, 250, 1),
    TraceJob(2, "toy", 10.0, 120, 1),
]


def test_exact_completion_three_jobs() -> None:
    result = run(THREE_JOBS)
    assert jcts(result) == {0: 150.0, 1: 250.0, 2: 310.0}
    assert result.rounds == 4
    assert result.makespan_s == 320.0
    assert result.avg_jct_h == pytest.approx((150 + 250 + 310) / 3 / 3600)
    assert [r.start_s for r in result.records] == [0.0, 0.0, 200.0]
    assert all(r.preemptions == 0 for r in result.records)


def test_round_end_completion_three_jobs() -> None:
    result = run(THREE_JOBS, finish_at_round_end=True)
    assert jcts(result) == {0: 200.0, 1: 300.0, 2: 390.0}
    assert result.makespan_s == 400.0
    assert result.finish_at_round_end is True


def test_allocation_percent_counts_held_time() -> None:
    # Exact mode: GPU-seconds held = 150 (A) + 250 (B) + 120 (C) = 520 over 2 GPUs x 320 s.
    result = run(THREE_JOBS)
    assert result.gpu_alloc_pct == pytest.approx(100 * 520 / (2 * 320))
    # Round-end mode: A 2 rounds, B 3, C 2 = 700 GPU-seconds over 2 x 400.
    result = run(THREE_JOBS, finish_at_round_end=True)
    assert result.gpu_alloc_pct == pytest.approx(100 * 700 / (2 * 400))
    # Proportional shares: 3 cores and 50 GB per GPU, so CPU and memory follow the GPUs.
    assert result.cpu_alloc_pct == pytest.approx(result.gpu_alloc_pct)
    assert result.mem_alloc_pct == pytest.approx(result.gpu_alloc_pct)


def test_round_end_credits_whole_iterations_per_round() -> None:
    # 0.3 s per iteration: floor(100 / 0.3) = 333 iterations per round, as the reference counts them.
    fits = run([TraceJob(0, "slow", 0.0, 666, 1)], finish_at_round_end=True)
    spills = run([TraceJob(0, "slow", 0.0, 667, 1)], finish_at_round_end=True)
    assert jcts(fits)[0] == 200.0
    assert jcts(spills)[0] == 300.0
    exact = run([TraceJob(0, "slow", 0.0, 667, 1)])
    assert jcts(exact)[0] == pytest.approx(667 * 0.3)


def test_speedup_shortens_the_job() -> None:
    trace = [TraceJob(0, "toy", 0.0, 300, 1)]
    twice = StickyProportionalAllocator(speedup=2.0)
    assert jcts(run(trace, allocator=twice))[0] == pytest.approx(150.0)
    assert jcts(run(trace, allocator=twice, finish_at_round_end=True))[0] == 200.0


# One GPU, LAS, 30 s restart overhead:
#   t=0   A runs (tie on service: earlier id)       A 100/150
#   t=100 B has less service: B runs, A paused      B needs 100 -> finishes at 200 (first start: no overhead)
#   t=200 A resumes: 30 s restart, then 50 s        A finishes at 280; round-end: 300
def test_restart_overhead_after_preemption() -> None:
    trace = [TraceJob(0, "toy", 0.0, 150, 1), TraceJob(1, "toy", 0.0, 100, 1)]
    las = LeastServicePolicy()
    result = run(trace, ONE_GPU, policy=las, restart_overhead_s=30.0)
    assert jcts(result) == {0: 280.0, 1: 200.0}
    assert {r.job_id: r.preemptions for r in result.records} == {0: 1, 1: 0}
    result = run(trace, ONE_GPU, policy=las, restart_overhead_s=30.0, finish_at_round_end=True)
    assert jcts(result) == {0: 300.0, 1: 200.0}


def test_restart_overhead_when_moved() -> None:
    # Moved to another GPU every round: 100, then 20 s restart + 80, then 20 s restart + the last 70.
    trace = [TraceJob(0, "toy", 0.0, 250, 1)]
    result = run(trace, allocator=RotatingAllocator(), restart_overhead_s=20.0)
    assert jcts(result)[0] == pytest.approx(290.0)
    assert result.records[0].preemptions == 2
    # Without overhead a move costs nothing.
    assert jcts(run(trace, allocator=RotatingAllocator()))[0] == pytest.approx(250.0)


def test_unchanged_placement_continues_its_lease() -> None:
    result = run([TraceJob(0, "toy", 0.0, 450, 1)], restart_overhead_s=50.0)
    assert jcts(result)[0] == pytest.approx(450.0)
    assert result.records[0].preemptions == 0


def test_real_allocator_keeps_running_jobs_where_they_are() -> None:
    # FIFO, 1-GPU jobs at the proportional share, a queue most of the time: a running job stays
    # admitted (everyone ahead of it arrived earlier), and the allocator hands it its GPU of last
    # round every round, so nothing is ever preempted (627 moves before placements were sticky).
    trace = philly_derived_trace(120, jobs_per_hour=30.0, seed=3)
    result = simulate(trace, ClusterSpec(servers=2), policy="fifo", allocator="proportional")
    assert result.finished_jobs == 120
    assert result.to_dict()["preemptions"] == 0


def test_idle_cluster_jumps_to_round_after_next_arrival() -> None:
    trace = [TraceJob(0, "toy", 0.0, 50, 1), TraceJob(1, "toy", 1000.5, 10, 1)]
    result = run(trace)
    # Job 1 waits for the round at 1100 (the grid is 0, 100, 200, ...).
    assert result.records[1].start_s == 1100.0
    assert jcts(result)[1] == pytest.approx(1110.0 - 1000.5)
    assert result.rounds == 2


def test_arrival_exactly_on_a_round_boundary_joins_that_round() -> None:
    result = run([TraceJob(0, "toy", 200.0, 10, 1)])
    assert result.records[0].start_s == 200.0


def test_default_first_round_follows_the_reference() -> None:
    assert default_first_round_s([409.0, 951.0], 300.0) == 600.0
    assert default_first_round_s([600.0, 951.0], 300.0) == 600.0
    assert default_first_round_s([0.0, 0.001, 0.099], 300.0) == 1.0  # static trace: first round at 1 s


def test_infeasible_job_is_dropped_not_looped_on() -> None:
    trace = [TraceJob(0, "toy", 0.0, 50, 4), TraceJob(1, "toy", 0.0, 50, 1)]
    result = run(trace)
    assert jcts(result) == {0: None, 1: 50.0}
    assert result.finished_jobs == 1
    assert result.infeasible_jobs == 1


def test_stalled_simulation_stops() -> None:
    result = run([TraceJob(0, "toy", 0.0, 50, 1)], allocator=NeverAllocator())
    assert result.finished_jobs == 0
    assert result.stopped_early
    assert math.isnan(result.avg_jct_h)
    assert result.to_dict()["avg_jct_h"] is None


def test_measured_window_and_stop_when_measured() -> None:
    result = run(THREE_JOBS, measured_job_ids=(1, 2))
    assert result.jct.count == 1
    assert result.avg_jct_h == pytest.approx(250 / 3600)
    stopped = run(THREE_JOBS, measured_job_ids=(0, 1), stop_when_measured=True)
    assert stopped.records[0].jct_s == 150.0
    assert stopped.records[2].finish_s is None
    assert stopped.stopped_early


def test_utilisation_series_one_sample_per_round() -> None:
    result = run(THREE_JOBS)
    series = result.utilisation
    assert series.t_s == [0.0, 100.0, 200.0, 300.0]
    assert series.gpus_alloc == [2, 2, 2, 1]
    assert series.running_jobs == [2, 2, 2, 1]
    assert series.pending_jobs == [0, 1, 0, 0]
    assert series.cpus_alloc == [6, 6, 6, 3]
    # The toy profile's best case is 3 cores and 62.5 GB per GPU; it is given 50 GB, all of it useful.
    assert series.cpus_used == [6, 6, 6, 3]
    assert series.mem_gb_used == [100, 100, 100, 50]


def test_progress_callback_reports_fractions() -> None:
    seen: list[float] = []
    run(THREE_JOBS, progress=seen.append)
    assert seen == pytest.approx([1 / 3, 2 / 3, 1.0])


def test_to_dict_is_json_ready() -> None:
    result = run(THREE_JOBS)
    data = json.loads(json.dumps(result.to_dict()))
    for key in (
        "policy",
        "allocator",
        "jobs",
        "avg_jct_h",
        "median_jct_h",
        "p99_jct_h",
        "makespan_h",
        "gpu_alloc_pct",
        "cpu_alloc_pct",
        "mem_alloc_pct",
        "wall_s",
        "rounds",
        "finish_at_round_end",
        "round_s",
        "records",
        "utilisation",
    ):
        assert key in data
    assert data["policy"] == "test-fifo"
    assert data["allocator"] == "test-proportional"
    assert data["records"][2]["jct_s"] == 310.0
    assert "records" not in result.summary() and "utilisation" not in result.summary()


def test_unknown_names_raise_registry_error() -> None:
    with pytest.raises(UnknownNameError, match="unknown policy 'nope'"):
        simulate(THREE_JOBS, TWO_GPUS, policy="nope", allocator="test-unregistered", catalog=CATALOG)
    with pytest.raises(UnknownNameError, match="unknown allocator 'nope'"):
        simulate(THREE_JOBS, TWO_GPUS, policy=FifoPolicy(), allocator="nope", catalog=CATALOG)


def test_unknown_model_raises_trace_error() -> None:
    with pytest.raises(TraceError, match="unknown model 'nope'"):
        run([TraceJob(0, "nope", 0.0, 10, 1)])


def test_bad_arguments() -> None:
    with pytest.raises(ValueError, match="round_s"):
        run(THREE_JOBS, round_s=0)
    with pytest.raises(ValueError, match="empty trace"):
        run([])
    with pytest.raises(ValueError, match="positive integer"):
        ClusterSpec(servers=0)
