"""Real processes for end-to-end tests: Celery workers (rounds with beat; forecasts) and node agents."""

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
    """A Celery worker with embedded beat on the default queue (rounds, sweeps, profiling dispatch), one
    task at a time, as the end-to-end and fault tests run it."""
    return [
        sys.executable, "-m", "celery", "-A", "config", "worker", "-B", "--pool", "solo",
        "--loglevel", "INFO", "--without-gossip", "--without-mingle", "-s", str(schedule), "-n", node_name,
    ]  # fmt: skip


def forecasts_worker_argv(node_name: str) -> list[str]:
    """The worker of the `forecasts` queue (forecast refreshes, admission forecasts, what-ifs; see
    settings.CELERY_TASK_ROUTES), no beat, one task at a time: without it no forecast is refreshed."""
    return [
        sys.executable, "-m", "celery", "-A", "config", "worker", "-Q", "forecasts", "--pool", "solo",
        "--loglevel", "INFO", "--without-gossip", "--without-mingle", "-n", node_name,
    ]  # fmt: skip


class CeleryWorker:
    """The service's two Celery workers as real processes, each logging to a file: `proc`, the default
    queue with beat (`celery -A config worker -B`), and `forecasts_proc`, the `forecasts` queue."""

    def __init__(self, tmp: Path, **env_overrides: str) -> None:
        self.log_path = tmp / "worker.log"
        self.forecasts_log_path = tmp / "forecasts-worker.log"
        self._logs = [self.log_path.open("w"), self.forecasts_log_path.open("w")]
        env = service_env(**env_overrides)

        def start(argv: list[str], log) -> subprocess.Popen:
            return subprocess.Popen(
                argv, cwd=REPO_ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )

        # Both boot side by side (each imports Django: seconds on 2 cores).
        self.proc = start(celery_worker_argv(tmp / "beat-schedule", f"e2e-{os.getpid()}@%h"), self._logs[0])
        self.forecasts_proc = start(forecasts_worker_argv(f"e2e-forecasts-{os.getpid()}@%h"), self._logs[1])
        try:
            for proc, path in ((self.proc, self.log_path), (self.forecasts_proc, self.forecasts_log_path)):
                wait_until(
                    lambda proc=proc, path=path: "ready." in path.read_text() or proc.poll() is not None,
                    timeout_s=60,
                    what=f"the Celery worker logging to {path.name} to be ready",
                )
                assert proc.poll() is None, path.read_text()[-3000:]
        except BaseException:
            self.stop()  # the other one must not outlive the test
            raise

    def log_text(self, chars: int = 3000) -> str:
        """The last `chars` of each worker's log, for an assertion message."""
        return "\n".join(
            f"{path.name}:\n{path.read_text(errors='replace')[-chars:]}"
            for path in (self.log_path, self.forecasts_log_path)
        )

    def stop(self) -> None:
        for proc in (self.proc, self.forecasts_proc):
            stop_tree(proc, signal.SIGTERM, wait_s=15)
        for log in self._logs:
            log.close()


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
