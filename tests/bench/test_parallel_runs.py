"""The reproduction benches' runs in worker processes: the same rows, in the same order, as in one process."""

from __future__ import annotations

import os

from bench import reproduce_genie
from bench.common import parallel_map
from scheduler_app.simulator.parallel import SIMULATION_GC_THRESHOLDS


def _square_after(x: int) -> int:
    # Later items finish first: the order of the results must still be the items'.
    import time

    time.sleep(0.02 * (5 - x))
    return x * x


def _gc_thresholds(_x: int) -> tuple[int, ...]:
    import gc

    return gc.get_threshold()


def test_parallel_map_workers_collect_garbage_for_simulations() -> None:
    assert parallel_map(_gc_thresholds, range(2), workers=2) == [SIMULATION_GC_THRESHOLDS] * 2


def test_parallel_map_keeps_the_items_order() -> None:
    assert parallel_map(_square_after, range(5), workers=2) == [0, 1, 4, 9, 16]
    assert parallel_map(_square_after, range(5), workers=1) == [0, 1, 4, 9, 16]


def test_genie_rows_alike_with_one_or_two_workers() -> None:
    schedulers = (reproduce_genie.BASELINES[0], reproduce_genie.SWAF_FAMILY[2])
    one = reproduce_genie.run_all(20, [2.0], [1, 2], schedulers, workers=1)
    two = reproduce_genie.run_all(20, [2.0], [1, 2], schedulers, workers=2)
    for rows in (one, two):
        for row in rows:
            row.pop("wall_s")
    assert one == two
    assert [(r["seed"], r["scheduler"]) for r in two] == [
        (1, "FIFO"),
        (1, "GENIE (SWAF+genie)"),
        (2, "FIFO"),
        (2, "GENIE (SWAF+genie)"),
    ]


def test_workers_default_is_every_core() -> None:
    import argparse

    from bench.common import add_workers_argument

    parser = argparse.ArgumentParser()
    add_workers_argument(parser)
    assert parser.parse_args([]).workers == (os.cpu_count() or 1)
    assert parser.parse_args(["--workers", "1"]).workers == 1


def test_synergy_runs_handed_longest_first_recorded_in_order(monkeypatch) -> None:
    """reproduce_synergy hands its sweep runs to the workers longest first (multi-GPU las + tune first,
    fifo + proportional last) and records them in the keys' order whatever the workers."""
    from bench import synergy_runs
    from bench.reproduce_synergy import FULL
    from bench.synergy_sweeps import sweep_keys

    cfg = FULL
    keys = list(dict.fromkeys(sweep_keys(cfg, {"load", "multi"})))
    order = synergy_runs.longest_first(keys)
    assert sorted(order) == list(range(len(keys)))
    assert keys[order[0]][1:3] == ("las", "tune") and keys[order[0]][0].multi_gpu
    assert keys[order[-1]][1:3] == ("fifo", "proportional")
    costs = [synergy_runs.run_cost_s(keys[i]) for i in order]
    assert costs == sorted(costs, reverse=True) and 60.0 not in costs  # every kind of the sweep known

    seen: list[object] = []

    def fake_map(fn, items, *, workers):  # answers each run with its position in the keys
        items = list(items)
        seen.extend(items)
        return [({(0, 1): float(keys.index(k))}, 0.0, 0) for k in items]

    recorded: list[object] = []
    monkeypatch.setattr(synergy_runs, "parallel_map", fake_map)
    monkeypatch.setattr(synergy_runs, "_record", lambda key, outcome: recorded.append((key, outcome)))
    monkeypatch.setattr(synergy_runs, "_RUNS", {})
    few = keys[:3] + keys[-3:]
    synergy_runs.prefetch(few, workers=2)
    assert seen[0] in keys[-3:]  # the multi-GPU runs went first
    assert [k for k, _ in recorded] == few
    assert all(outcome[0][(0, 1)] == float(keys.index(k)) for k, outcome in recorded)


def test_synergy_side_tasks_run_among_the_sweeps_runs_by_cost_and_come_back_in_order(monkeypatch) -> None:
    """The OPT section's workloads and the capacity table go to the workers beside the sweep's runs,
    by their rough cost, in real processes; prefetch returns their results in their order."""
    from functools import partial

    from bench import synergy_runs
    from bench.reproduce_synergy import FULL
    from bench.synergy_sweeps import sweep_keys

    keys = list(dict.fromkeys(sweep_keys(FULL, {"load", "multi"})))
    few = [keys[0], keys[-1]]  # a single-GPU fifo run (cost 6) and a multi-GPU las run (45)
    handed: list[object] = []

    def in_workers(fn, items, *, workers):  # runs the side tasks for real, in two processes
        items = list(items)
        handed.extend(items)
        tasks = [x for x in items if callable(x)]
        done = iter(parallel_map(fn, tasks, workers=workers))
        return [next(done) if callable(x) else ({(0, 1): 1.0}, 0.0, 0) for x in items]

    recorded: list[object] = []
    monkeypatch.setattr(synergy_runs, "parallel_map", in_workers)
    monkeypatch.setattr(synergy_runs, "_record", lambda key, outcome: recorded.append(key))
    monkeypatch.setattr(synergy_runs, "_RUNS", {})
    side = [(50.0, partial(pow, 2, 10)), (1.0, partial(pow, 3, 2)), (20.0, partial(divmod, 7, 2))]
    assert synergy_runs.prefetch(few, workers=2, side_tasks=side) == [1024, 9, (3, 1)]
    assert handed[0] is side[0][1] and handed[1] == few[1] and handed[2] is side[2][1]
    assert handed[3] == few[0] and handed[4] is side[1][1]  # longest first, the cheapest last
    assert recorded == few
    # With one worker, in the items' order, the same results.
    handed.clear()
    assert synergy_runs.prefetch(few, workers=1, side_tasks=side) == [1024, 9, (3, 1)]
    assert handed[:2] == few
