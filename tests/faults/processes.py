"""Process helpers of the fault tests: where PostgreSQL's binaries are, free ports, waiting, killing."""

from __future__ import annotations

import contextlib
import glob
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import psutil
import psycopg2
import redis

REPO_ROOT = Path(__file__).resolve().parents[2]
PYTHON = sys.executable


def postgres_bin_dir() -> Path | None:
    """The newest PostgreSQL server binaries of the machine (Debian layout), or None."""
    found = sorted(
        (Path(p).parent for p in glob.glob("/usr/lib/postgresql/*/bin/initdb")),
        key=lambda p: int(p.parent.name) if p.parent.name.isdigit() else 0,
    )
    return found[-1] if found else None


def why_cannot_run() -> str | None:
    """Why the fault tests cannot run here, or None when they can."""
    if os.geteuid() != 0:
        return "fault tests run as root (they start PostgreSQL as the postgres account and jobs as another)"
    if postgres_bin_dir() is None:
        return "no PostgreSQL server binaries (/usr/lib/postgresql/*/bin/initdb)"
    if shutil.which("redis-server") is None:
        return "no redis-server on PATH"
    if shutil.which("runuser") is None:
        return "no runuser (needed to run PostgreSQL as the postgres account)"
    try:
        import pwd

        pwd.getpwnam("postgres")
    except KeyError:
        return "no postgres Unix account"
    return None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_until(
    predicate: Callable[[], Any],
    *,
    timeout_s: float,
    what: str,
    interval_s: float = 0.25,
    diagnose: Callable[[], str] | None = None,
) -> Any:
    """Poll `predicate` until it returns something true (returned); fail naming `what` after `timeout_s`,
    with what `diagnose()` says. A predicate that raises (a database being restarted) counts as not yet.
    """
    deadline = time.monotonic() + timeout_s
    last_error: BaseException | None = None
    while True:
        try:
            value = predicate()
            if value:
                return value
        except (psycopg2.Error, httpx.HTTPError, redis.RedisError, OSError) as exc:
            last_error = exc
        if time.monotonic() >= deadline:
            extra = f" (last error: {last_error!r})" if last_error else ""
            if diagnose is not None:
                try:
                    extra += "\n" + diagnose()
                except Exception as exc:  # a diagnosis must not hide the timeout
                    extra += f"\n(diagnosis failed: {exc!r})"
            raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what}{extra}")
        time.sleep(interval_s)


def kill_group(proc: subprocess.Popen | None, sig: int, *, wait_s: float = 10.0) -> None:
    """Send `sig` to a process started in its own session (its whole process group), then reap it."""
    if proc is None or proc.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, sig)
    try:
        proc.wait(timeout=wait_s)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)


def kill_processes_mentioning(marker: str) -> int:
    """SIGKILL every process whose command line or environment mentions `marker` (a temp path of
    ours): shims adopted by a restarted agent are no longer its children, and their jobs are not
    the shim's either once the shim is gone. Returns how many were killed."""
    victims = []
    for p in psutil.process_iter(["pid", "cmdline"]):
        if p.pid == os.getpid():
            continue
        try:
            text = " ".join(p.info["cmdline"] or [])
            if marker not in text:
                text = "\0".join(f"{k}={v}" for k, v in p.environ().items())
            if marker in text:
                victims.append(p)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    for p in victims:
        with contextlib.suppress(psutil.NoSuchProcess):
            p.kill()
    psutil.wait_procs(victims, timeout=10)
    return len(victims)
