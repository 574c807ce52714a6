"""simulation_compare's runs in worker processes (simulator/parallel.py): the same summaries in the
same order as in-process, progress back on the caller's thread, a run's exception raised as before."""

from __future__ import annotations

import dataclasses
import gc
import os
import sys
from collections.abc import Callable

import pytest

from scheduler_app.simulator.compare import SimulationRequest, simulation_compare, simulation_trace_build
from scheduler_app.simulator.parallel import SIMULATION_GC_THRESHOLDS, run_parallel
from scheduler_app.simulator.trace import TraceError

REQUEST = SimulationRequest(
    servers=2, num_jobs=40, jobs_per_hour=20.0, policies=("fifo", "srtf"), allocators=("proportional", "tune")
)


def _without_wall(runs: list[dict]) -> list[dict]:
    return [{k: v for k, v in r.items() if k != "wall_s"} for r in runs]


def test_same_summaries_in_the_same_order_with_one_and_two_workers() -> None:
    trace = simulation_trace_build(REQUEST)
    alone = simulation_compare(REQUEST, trace=trace, workers=1)
    two = simulation_compare(REQUEST, trace=trace, workers=2)
    assert [(r["policy"], r["allocator"]) for r in two] == [
        ("fifo", "proportional"),
        ("fifo", "tune"),
        ("srtf", "proportional"),
        ("srtf", "tune"),
    ]
    assert _without_wall(two) == _without_wall(alone)
    assert all(r["finished_jobs"] == 40 for r in two)
    assert two[1]["speedup_vs_proportional"] == pytest.approx(two[0]["avg_jct_h"] / two[1]["avg_jct_h"])


@pytest.mark.parametrize("workers", [1, 2])
def test_progress_reaches_the_caller_for_every_run(workers: int) -> None:
    seen: list[tuple[str, str, float]] = []
    simulation_compare(REQUEST, workers=workers, progress=lambda p, a, f: seen.append((p, a, f)))
    for policy in REQUEST.policies:
        for allocator in REQUEST.allocators:
            mine = [f for p, a, f in seen if (p, a) == (policy, allocator)]
            assert len(mine) >= 2, (policy, allocator, mine)  # along the way, not only at the end
            assert mine == sorted(mine) and mine[-1] == 1.0


@pytest.mark.parametrize("workers", [1, 2])
def test_a_failing_run_raises_its_exception(workers: int) -> None:
    trace = simulation_trace_build(REQUEST)
    bad = [dataclasses.replace(trace[0], model="no-such-model"), *trace[1:]]
    with pytest.raises(TraceError, match="unknown model 'no-such-model'"):
        simulation_compare(REQUEST, trace=bad, workers=workers)


# run_parallel's own contract, with module-level functions a worker process can import.
def _square_unless_three(item: int, report: Callable[[float], None] | None) -> int:
    if report is not None:
        report(0.5)
        report(1.0)
    if item == 3:
        raise ValueError(f"item {item} refused")
    return item * item


def _worker_state(item: int, report: Callable[[float], None] | None) -> tuple[int, bool]:
    return os.getpid(), any(m == "django" or m.startswith("django.") for m in sys.modules)


def _gc_thresholds(item: int, report: Callable[[float], None] | None) -> tuple[int, ...]:
    return gc.get_threshold()


def test_results_in_the_items_order_and_progress_by_index() -> None:
    seen: list[tuple[int, float]] = []
    out = run_parallel(
        _square_unless_three, [5, 1, 4, 2], workers=2, progress=lambda i, f: seen.append((i, f))
    )
    assert out == [25, 1, 16, 4]
    assert sorted(seen) == [(i, f) for i in range(4) for f in (0.5, 1.0)]


def test_the_first_failing_items_exception_is_raised() -> None:
    with pytest.raises(ValueError, match="item 3 refused"):
        run_parallel(_square_unless_three, [1, 3, 2, 3], workers=2)
    with pytest.raises(ValueError, match="item 3 refused"):
        run_parallel(_square_unless_three, [1, 3, 2], workers=2, progress=lambda i, f: None)


def test_workers_are_fresh_processes_without_django() -> None:
    # This test process may hold Django (conftest); the workers come from the fork server, not a fork of it.
    states = run_parallel(_worker_state, [0, 1], workers=2)
    assert all(pid != os.getpid() for pid, _ in states)
    assert not any(django for _, django in states)


def test_workers_collect_garbage_for_simulations_and_the_caller_keeps_its_own() -> None:
    before = gc.get_threshold()
    assert run_parallel(_gc_thresholds, [0, 1], workers=2) == [SIMULATION_GC_THRESHOLDS] * 2
    assert run_parallel(_gc_thresholds, [0, 1], workers=1) == [before] * 2  # in-process: untouched
    assert gc.get_threshold() == before


def _compare_in_a_daemonic_process(workers: int) -> tuple[bool, list[dict]]:
    import multiprocessing

    small = dataclasses.replace(REQUEST, num_jobs=10, policies=("fifo",))
    return multiprocessing.current_process().daemon, _without_wall(simulation_compare(small, workers=workers))


def test_a_daemonic_process_runs_the_grid_in_process() -> None:
    # A Celery prefork child is daemonic and may not start processes: the runs run there, in order.
    billiard = pytest.importorskip("billiard")
    with billiard.Pool(1) as pool:
        daemonic, runs = pool.apply(_compare_in_a_daemonic_process, (2,))
    assert daemonic
    assert runs == _compare_in_a_daemonic_process(1)[1]
