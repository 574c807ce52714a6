"""Shared helpers for benchmarks: timing with repeats, peak memory, a plain table printer, parallel runs."""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import statistics
import time
import tracemalloc
from collections.abc import Callable, Iterable
from concurrent.futures import ProcessPoolExecutor
from typing import Any, TypeVar

from scheduler_app.simulator.parallel import tune_gc_for_simulations

T = TypeVar("T")
R = TypeVar("R")


def time_call(fn: Callable[[], Any], *, repeats: int, warmup: int = 1) -> tuple[float, float]:
    """Median and best wall time in seconds of `fn()` over `repeats` calls after `warmup` calls."""
    for _ in range(warmup):
        fn()
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples), min(samples)


def peak_memory_mb(fn: Callable[[], Any]) -> tuple[Any, float]:
    """Run `fn` once under tracemalloc; return its result and the peak Python allocation in MB."""
    tracemalloc.start()
    try:
        result = fn()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return result, peak / 1e6


def print_table(headers: list[str], rows: list[list[Any]]) -> None:
    cells = [headers] + [[f"{c:.3f}" if isinstance(c, float) else str(c) for c in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    for row in cells:
        print("  ".join(cell.rjust(w) for cell, w in zip(row, widths, strict=True)))


def add_workers_argument(parser: argparse.ArgumentParser) -> None:
    """`--workers N`: processes for a bench's independent simulations (default: every core)."""
    parser.add_argument(
        "--workers",
        type=int,
        default=os.cpu_count() or 1,
        help="processes running the independent simulations at once (default: every core, "
        f"{os.cpu_count() or 1} here); 1 runs them one after the other in this process",
    )


def parallel_map(fn: Callable[[T], R], items: Iterable[T], *, workers: int) -> list[R]:
    """`[fn(x) for x in items]`, spread over `workers` processes; results in the items' order, so a
    bench's output does not depend on which run ends first. `fn` and the items must pickle (a
    module-level function and plain data)."""
    items = list(items)
    if workers <= 1 or len(items) <= 1:
        return [fn(x) for x in items]
    pool_size = min(workers, len(items))
    with ProcessPoolExecutor(max_workers=pool_size, initializer=tune_gc_for_simulations) as pool:
        # One item per task: runs differ in length by minutes, so small chunks balance the cores.
        return list(pool.map(fn, items, chunksize=1))


def profile_print(profiler: cProfile.Profile, lines: int) -> None:
    """A profile's costliest `lines` functions, by cumulative then by own time."""
    stats = pstats.Stats(profiler).strip_dirs()
    stats.sort_stats("cumulative").print_stats(lines)
    stats.sort_stats("tottime").print_stats(lines)
