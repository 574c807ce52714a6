"""Independent simulations in worker processes: results in the items' order, progress back on the
caller's thread, a run's exception raised in the caller as it was raised in the run (no Django).

The workers are started by a 'forkserver' (or, where there is none, 'spawn'), never forked from the
caller: the caller may be a web process or a Celery worker holding database connections and threads.
The fork server is a fresh interpreter that imports only the simulator (`set_forkserver_preload`),
started on the first parallel run and kept for the process's life, so later runs start their workers
in milliseconds; each worker still imports the caller's `__main__` module, as every spawned process does
(a script calling this needs the `if __name__ == "__main__":` guard).

A daemonic process cannot start processes (multiprocessing refuses): there, e.g. in a child of a
Celery prefork worker (`celery worker`'s default pool; the forecasts queue's worker in
docker-compose.yml runs two), the runs run one after the other in the calling process. A worker with
`--pool solo` or `--pool threads` runs them in parallel.
"""

from __future__ import annotations

import functools
import gc
import multiprocessing
import queue as queue_module
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_EXCEPTION, Future, ProcessPoolExecutor, wait
from multiprocessing.context import BaseContext
from typing import Any, TypeVar

__all__ = ["process_context", "run_parallel", "tune_gc_for_simulations"]

T = TypeVar("T")
R = TypeVar("R")

# What a worker needs before its first run; the fork server imports it once for every worker.
_PRELOAD = ["scheduler_app.simulator.compare"]
# A round allocates hundreds of thousands of short-lived tuples, lists and views and almost no cycles:
# the default young threshold (700) runs a collection every few jobs and a full one (over every live
# object) dozens of times a run. These take about 10 % off a long run at the same peak memory
# (docs/performance.md).
SIMULATION_GC_THRESHOLDS = (20_000, 20, 100)
_POLL_S = 0.05  # how often the caller looks for a worker that died without a word (a killed process)

_progress_queue: Any = None  # in a worker: where its runs' progress goes (set by _worker_init)


def process_context() -> BaseContext:
    """The 'forkserver' context (preloading the simulator) where the platform has one, else 'spawn'."""
    if "forkserver" in multiprocessing.get_all_start_methods():
        ctx = multiprocessing.get_context("forkserver")
        ctx.set_forkserver_preload(_PRELOAD)  # no effect once the fork server has started
        return ctx
    return multiprocessing.get_context("spawn")


def run_parallel(
    fn: Callable[[T, Callable[[float], None] | None], R],
    items: Sequence[T],
    *,
    workers: int,
    progress: Callable[[int, float], None] | None = None,
) -> list[R]:
    """`[fn(item, report) for item in items]` over `workers` processes, results in the items' order.

    In-process as well in a daemonic process, which may not start processes (see the module's text).
    `fn(item, report)` must be a module-level function and the items must pickle; `report(fraction)`
    is None without `progress`. `progress(index, fraction)` is called on this thread: with one worker
    (or one item), in this process, on every report; with processes, each item's fraction at every
    whole percent it crosses (its reports in order; items interleave). If runs fail, runs not started
    are cancelled, the running ones are waited for, and the first failing item's exception (in the
    items' order) is raised, its worker's traceback as its cause.
    """
    items = list(items)
    if workers <= 1 or len(items) <= 1 or multiprocessing.current_process().daemon:
        if progress is None:
            return [fn(item, None) for item in items]
        return [fn(item, functools.partial(progress, i)) for i, item in enumerate(items)]
    ctx = process_context()
    reports = ctx.Queue() if progress is not None else None
    with ProcessPoolExecutor(
        max_workers=min(workers, len(items)),
        mp_context=ctx,
        initializer=_worker_init,
        initargs=(reports,),
    ) as pool:
        futures = [pool.submit(_worker_call, fn, i, item) for i, item in enumerate(items)]
        if progress is not None:
            _relay(reports, futures, progress)
        else:
            wait(futures, return_when=FIRST_EXCEPTION)
        if any(_failed(f) for f in futures):
            for future in futures:
                future.cancel()  # those not started; leaving the block waits for the running ones
    for future in futures:
        if _failed(future):
            future.result()  # raises the run's exception
    return [future.result() for future in futures]


def _failed(future: Future) -> bool:
    return future.done() and not future.cancelled() and future.exception() is not None


def _relay(reports: Any, futures: list[Future], progress: Callable[[int, float], None]) -> None:
    """Pass the workers' reports to `progress` until every run has ended or one has failed."""
    ended = 0
    while ended < len(futures):
        try:
            index, fraction = reports.get(timeout=_POLL_S)
        except queue_module.Empty:
            if any(_failed(f) for f in futures) or all(f.done() for f in futures):
                return  # a failure, or a worker gone without its last report (the pool is broken)
            continue
        if fraction is None:  # the run has ended, returned or raised
            ended += 1
            if any(_failed(f) for f in futures):
                return
        else:
            progress(index, fraction)


def tune_gc_for_simulations() -> None:
    """Set this process's collector for simulations (SIMULATION_GC_THRESHOLDS): only in a process
    that runs nothing else, a pool's worker."""
    gc.set_threshold(*SIMULATION_GC_THRESHOLDS)


def _worker_init(reports: Any) -> None:
    global _progress_queue
    _progress_queue = reports
    tune_gc_for_simulations()


def _worker_call(fn: Callable[[T, Callable[[float], None] | None], R], index: int, item: T) -> R:
    """In a worker: run `fn` on one item, reporting its progress at whole percents and its end."""
    reports = _progress_queue
    if reports is None:
        return fn(item, None)
    sent = [-1]

    def report(fraction: float) -> None:
        percent = int(fraction * 100)
        if percent > sent[0]:
            sent[0] = percent
            reports.put((index, fraction))

    try:
        return fn(item, report)
    finally:
        reports.put((index, None))
