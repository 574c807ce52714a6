"""CPU used by each part of a bench's stack (web tier, workers, PostgreSQL, Redis, the bench) over a window.

A thread samples every part's cumulative CPU time (user + system, psutil) once a second; `cores()`
gives each part's average cores between two wall-clock instants from the samples nearest inside them.
Latency under saturation is queueing and moves by seconds between runs; CPU per call is what a change
to the service's own code moves, and it is steady where percentiles are not. PostgreSQL and Redis are
read by process name; PostgreSQL's sessions of other databases are left out when the bench names its
own (`database`).
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable

import psutil

SAMPLE_S = 1.0


def tree_cpu_s(pid: int) -> float:
    """CPU seconds of a process and its living descendants (a gunicorn master and its workers)."""
    try:
        root = psutil.Process(pid)
        family = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return 0.0
    total = 0.0
    for proc in family:
        try:
            times = proc.cpu_times()
        except psutil.NoSuchProcess:
            continue
        total += times.user + times.system
    return total


def _named_cpu_s(name: str) -> float:
    """CPU seconds of every process called `name` (PostgreSQL's backends, redis-server): the machine's,
    not only the bench's, so measure on a machine otherwise quiet."""
    total = 0.0
    for proc in psutil.process_iter(["name", "cpu_times"]):
        if proc.info["name"] == name and proc.info["cpu_times"] is not None:
            total += proc.info["cpu_times"].user + proc.info["cpu_times"].system
    return total


def postgres_counts(title: str, database: str | None) -> bool:
    """Whether a PostgreSQL process (by its title, `ps`'s args) counts as the bench's: with `database`,
    its sessions and autovacuum workers on that database and the server's own background processes
    (WAL writer, checkpointer...: they write what every session commits), not other databases'
    sessions; every process without one."""
    if database is None:
        return True
    session = "(" in title or "[local]" in title or "autovacuum worker" in title
    return not session or database in title.split()


def postgres_cpu_s(database: str | None) -> float:
    """CPU seconds of the PostgreSQL processes that count for `database` (postgres_counts)."""
    total = 0.0
    for proc in psutil.process_iter(["name", "cmdline", "cpu_times"]):
        if proc.info["name"] != "postgres" or proc.info["cpu_times"] is None:
            continue
        if postgres_counts(" ".join(proc.info["cmdline"] or ()), database):
            total += proc.info["cpu_times"].user + proc.info["cpu_times"].system
    return total


class CpuShares:
    """Samples the parts' cumulative CPU seconds on a thread of its own until `stop()`."""

    def __init__(self, pids: dict[str, int], *, database: str | None = None) -> None:
        """`pids`: part -> the root process of that part; `database`: PostgreSQL's share counts that
        database's sessions and the server's background processes only (postgres_counts), so that
        other work on a shared server stays out of it; without it, every PostgreSQL process."""
        self._pids = pids
        self._parts: dict[str, Callable[[], float]] = {
            **{part: (lambda pid=pid: tree_cpu_s(pid)) for part, pid in pids.items()},
            "postgres": lambda: postgres_cpu_s(database),
            "redis": lambda: _named_cpu_s("redis-server"),
        }
        self._samples: list[tuple[float, dict[str, float]]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="cpu-shares", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        bench = os.getpid()
        while not self._stop.is_set():
            sample = {part: read() for part, read in self._parts.items()}
            # The bench's own emulated agents: the stack's processes are its children, taken out.
            sample["bench"] = tree_cpu_s(bench) - sum(sample[part] for part in self._pids)
            self._samples.append((time.time(), sample))
            self._stop.wait(SAMPLE_S)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def cores(self, since: float, until: float) -> dict[str, float]:
        """Part -> average cores used between the first sample at or after `since` and the last at or
        before `until` (empty when fewer than two samples fall inside)."""
        inside = [(at, cpu) for at, cpu in self._samples if since <= at <= until]
        if len(inside) < 2:
            return {}
        (t0, first), (t1, last) = inside[0], inside[-1]
        return {part: max(0.0, (last[part] - first[part]) / (t1 - t0)) for part in first}
