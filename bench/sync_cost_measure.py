"""The sync bench's CPU measurement: this process's and the database backend's, per call, and cProfile."""

from __future__ import annotations

import time
from collections.abc import Callable


def backend_cpu_clock():
    """A function giving the database backend's CPU seconds so far (PostgreSQL on this machine): its
    exact run time from /proc/PID/schedstat where Linux has it, else psutil's user + system time, which
    the kernel samples in ticks (at a few hundred calls, identical code read 0.43 and 0.78 ms a sync)."""
    import psutil
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        pid = cursor.fetchone()[0]
    schedstat = f"/proc/{pid}/schedstat"
    try:
        with open(schedstat) as f:
            int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        backend = psutil.Process(pid)
        return lambda: sum(backend.cpu_times()[:2])

    def run_time_s() -> float:
        with open(schedstat) as f:
            return int(f.read().split()[0]) / 1e9

    return run_time_s


def measure(call, count: int) -> tuple[list[float], float, int]:
    """CPU ms of each of `count` calls (after 10 unmeasured), the database backend's mean CPU ms per
    call, and the statements per call."""
    from django.db import connection

    for _ in range(10):
        call()
    statements = []

    def counted(execute, sql, params, many, context):
        statements.append(sql)
        return execute(sql, params, many, context)

    # Not CaptureQueriesContext: each request clears the connection's query log when it starts.
    with connection.execute_wrapper(counted):
        call()
    backend_cpu_s = backend_cpu_clock()

    cpu_ms = []
    backend_before = backend_cpu_s()
    for _ in range(count):
        start = time.process_time()
        call()
        cpu_ms.append((time.process_time() - start) * 1000)
    return cpu_ms, (backend_cpu_s() - backend_before) * 1000 / count, len(statements)


def applier_row(pending: int, base: float) -> list:
    """One run of the applier over `pending` stored reports: CPU ms per report (this process and the
    database backend's), as the worker would spend it."""
    from scheduler_app.services.report_ingest import agent_reports_apply_run

    return backlog_row(agent_reports_apply_run, pending, base, "report")


def backlog_row(apply_run: Callable[[], int], pending: int, base: float, item: str) -> list:
    """One run of a worker's backlog applier (`apply_run` answers how many items it applied) over
    `pending` items: CPU ms per item, this process's and the database backend's."""
    backend_cpu_s = backend_cpu_clock()
    db_before = backend_cpu_s()
    start = time.process_time()
    applied = apply_run()
    cpu_ms = (time.process_time() - start) * 1000 / max(1, applied)
    db_ms = (backend_cpu_s() - db_before) * 1000 / max(1, applied)
    if applied != pending:
        raise RuntimeError(f"the applier applied {applied} of {pending} pending {item}s")
    label = f"applier, per {item} ({applied})"
    return [label, f"{cpu_ms:.3f}", "", f"{db_ms:.3f}", "", f"{cpu_ms / base:.2f}x"]


class Profile:
    """cProfile around the measured calls of one kind (`--profile KIND`), printed at the end: where a
    call's CPU goes, by function."""

    def __init__(self, kind: str | None) -> None:
        import cProfile

        self.kind = kind
        # On the process's CPU clock: a call's wait on PostgreSQL is not the web tier's CPU, and on the
        # wall clock it hid where the CPU goes (half of a sync's wall time is the wait).
        self.profiler = cProfile.Profile(time.process_time) if kind else None

    def around(self, kind: str, call):
        if self.profiler is None or kind != self.kind:
            return call

        def profiled():
            self.profiler.enable()
            try:
                return call()
            finally:
                self.profiler.disable()

        return profiled

    def print(self, lines: int = 40) -> None:
        if self.profiler is None:
            return
        import pstats

        stats = pstats.Stats(self.profiler).strip_dirs()
        print(f"\nprofile of `{self.kind}` calls, by own time:")
        stats.sort_stats("tottime").print_stats(lines)
        print(f"profile of `{self.kind}` calls, by cumulative time:")
        stats.sort_stats("cumulative").print_stats(lines)
