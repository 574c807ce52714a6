"""A thread that watches /proc for the fault tests' synthetic job processes: which lease ran in which pids."""

from __future__ import annotations

import contextlib
import threading
import time
from collections import defaultdict

import psutil


class JobProcessWatcher:
    """Samples /proc on a thread for our synthetic job processes: lease id (from each one's
    environment) -> the pids that ran it. A lease whose job was launched twice shows two pids; a job
    lives for seconds and is sampled every `interval_s`."""

    def __init__(self, marker: str, interval_s: float = 0.1) -> None:
        self.marker = marker
        self.interval_s = interval_s
        self.pids: dict[str, set[int]] = defaultdict(set)
        # pid -> [its start (the kernel's, as a time.time()), the start of the last sample that saw it]
        self.lifetimes: dict[int, list[float]] = {}
        self.samples: list[tuple[float, float]] = []  # (start, end) of each sample, time.time()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="job-process-watcher", daemon=True)

    def __enter__(self) -> JobProcessWatcher:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.sample()

    def alive(self) -> dict[str, int]:
        """Lease -> pid of the job processes running now."""
        now: dict[str, int] = {}
        for lease, pids in list(self.pids.items()):
            for pid in pids:
                if psutil.pid_exists(pid):
                    now[lease] = pid
        return now

    def gone_by(self, pid: int) -> float | None:
        """A time by which `pid` had surely ended: the end of the first sample after the last that saw
        it alive (None while no such sample was taken)."""
        last_seen = self.lifetimes[pid][1]
        return next((end for start, end in list(self.samples) if start > last_seen), None)

    def sample(self) -> None:
        started = time.time()
        self._sample(started)
        self.samples.append((started, time.time()))

    def _sample(self, started: float) -> None:
        for p in psutil.process_iter(["pid", "cmdline"]):
            try:
                cmd = p.info["cmdline"] or []
                if "agent.workload" not in cmd:
                    continue
                env = p.environ()
            except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                continue
            if self.marker in env.get("ATTUNE_PROGRESS_PATH", "") and env.get("ATTUNE_LEASE_ID"):
                self.pids[env["ATTUNE_LEASE_ID"]].add(p.pid)
                with contextlib.suppress(psutil.Error):
                    self.lifetimes.setdefault(p.pid, [p.create_time(), 0.0])[1] = started

    def launched_twice(self) -> dict[str, set[int]]:
        return {lease: pids for lease, pids in self.pids.items() if len(pids) > 1}
