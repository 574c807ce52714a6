"""Real processes for end-to-end tests: a Celery worker (with beat) and node agents."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from io import StringIO
from pathlib import Path

import psutil
from django.conf import settings
from django.core.management import call_command
from django.db import connection

REPO_ROOT = Path(__file__).resolve().parents[2]


def wait_until(
    predicate: Callable[[], bool], *, timeout_s: float, what: str, interval_s: float = 0.5
) -> None:
    """Poll `predicate` until it holds; fail with `what` after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(interval_s)
    raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what}")


def test_database_url() -> str:
    """The URL of the test database this process uses, for the worker to share it."""
    db = connection.settings_dict
    host, port = db.get("HOST") or "127.0.0.1", db.get("PORT") or 5432
    password = f":{db['PASSWORD']}" if db.get("PASSWORD") else ""
    return f"postgres://{db['USER']}{password}@{host}:{port}/{db['NAME']}"


def service_env(**overrides: str) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        {
            "DJANGO_SETTINGS_MODULE": "config.settings",
            "DATABASE_URL": test_database_url(),
            "REDIS_URL": settings.REDIS_URL,
            "CELERY_BROKER_URL": settings.CELERY_BROKER_URL,
            "CELERY_RESULT_BACKEND": settings.CELERY_RESULT_BACKEND,
            "ATTUNE_INLINE_ROUNDS": "0",
            "PYTHONUNBUFFERED": "1",
        }
    )
    env.update(overrides)
    return env


def celery_worker_argv(schedule: Path, node_name: str) -> list[str]:
    """A Celery worker with embedded beat, one task at a time, as the end-to-end and fault tests run it."""
    return [
        sys.executable, "-m", "celery", "-A", "config", "worker", "-B", "--pool", "solo",
        "--loglevel", "INFO", "--without-gossip", "--without-mingle", "-s", str(schedule), "-n", node_name,
    ]  # fmt: skip


class CeleryWorker:
    """`celery -A config worker -B` as a real process, logging to a file."""

    def __init__(self, tmp: Path, **env_overrides: str) -> None:
        self.log_path = tmp / "worker.log"
        self._log = self.log_path.open("w")
        self.proc = subprocess.Popen(
            celery_worker_argv(tmp / "beat-schedule", f"e2e-{os.getpid()}@%h"),
            cwd=REPO_ROOT,
            env=service_env(**env_overrides),
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        wait_until(
            lambda: "ready." in self.log_path.read_text() or self.proc.poll() is not None,
            timeout_s=60,
            what="the Celery worker to be ready",
        )
        assert self.proc.poll() is None, self.log_path.read_text()[-3000:]

    def stop(self) -> None:
        stop_tree(self.proc, signal.SIGTERM, wait_s=15)
        self._log.close()


class Agent:
    """`python -m agent` with fake GPUs as a real process; `kill()` is a node dying (agent and jobs)."""

    def __init__(
        self,
        tmp: Path,
        server_url: str,
        name: str,
        *,
        gpus: int,
        cpus: int,
        mem_gb: float,
        time_scale: float,
        extra_args: tuple[str, ...] = (),
        work_root: Path | None = None,
    ) -> None:
        out = StringIO()
        call_command(
            "node_token",
            name,
            "--gpus",
            str(gpus),
            "--cpus",
            str(cpus),
            "--mem-gb",
            str(mem_gb),
            stdout=out,
            stderr=StringIO(),
        )
        self.name, self.token = name, out.getvalue().strip()
        self.dir = tmp / name
        self.dir.mkdir(parents=True, exist_ok=True)
        self.spool_db = self.dir / "spool"
        self.args = [
            sys.executable,
            "-m",
            "agent",
            "--server",
            server_url,
            "--name",
            name,
            "--fake-gpus",
            str(gpus),
            "--fake-cpus",
            str(cpus),
            "--fake-mem-gb",
            str(mem_gb),
            "--time-scale",
            str(time_scale),
            "--spool-dir",
            str(self.spool_db),
            "--work-dir",
            # Jobs run as another account must reach their lease files: pytest's tmp_path is root's alone.
            str((work_root or self.dir) / name / "work"),
            "--isolation",
            "affinity+rlimit",
            *extra_args,
        ]
        self.proc: subprocess.Popen | None = None
        self.start()

    def start(self) -> None:
        log = (self.dir / "agent.log").open("a")
        env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "DJANGO_SETTINGS_MODULE")}
        env["ATTUNE_AGENT_TOKEN"] = self.token  # as a node should: not in argv, where `ps` shows it
        self.proc = subprocess.Popen(self.args, cwd=REPO_ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
        log.close()

    def kill(self) -> None:
        """SIGKILL the agent and every process under it at once, as when a machine loses power."""
        assert self.proc is not None
        stop_tree(self.proc, signal.SIGKILL, wait_s=10)

    def kill_agent_only(self) -> None:
        """SIGKILL the agent process alone: its jobs' shims live on (their own sessions), as when the
        agent crashes on a node that keeps running."""
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait(timeout=10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            # Leave no job processes behind: they would outlive the test otherwise.
            stop_tree(self.proc, signal.SIGKILL, wait_s=10)

    def log_text(self) -> str:
        return (self.dir / "agent.log").read_text()


def stop_tree(proc: subprocess.Popen, sig: signal.Signals, *, wait_s: float) -> None:
    """Send `sig` to a process and all its descendants (collected first, so none escapes)."""
    try:
        root = psutil.Process(proc.pid)
        family = [*root.children(recursive=True), root]
    except psutil.NoSuchProcess:
        return
    for p in family:
        with contextlib.suppress(psutil.NoSuchProcess):
            p.send_signal(sig)
    _, alive = psutil.wait_procs(family, timeout=wait_s)
    for p in alive:
        with contextlib.suppress(psutil.NoSuchProcess):
            p.kill()
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=5)
