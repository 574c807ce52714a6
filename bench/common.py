"""Shared helpers for benchmarks: timing with repeats, peak memory, a plain table printer."""

from __future__ import annotations

import statistics
import time
import tracemalloc
from collections.abc import Callable
from typing import Any


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
