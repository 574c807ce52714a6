"""A fault test's stack: its processes (gunicorn, Celery workers, agents) and its database and API clients."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import httpx
import psutil
import psycopg2

from tests.e2e.processes import celery_worker_argv, forecasts_worker_argv
from tests.faults.agents import Agent, iters_for
from tests.faults.private_services import NODES, PrivateServices, service_env
from tests.faults.processes import (
    PYTHON,
    REPO_ROOT,
    free_port,
    kill_group,
    kill_processes_mentioning,
    wait_until,
)


class StackProcesses:
    """gunicorn + Celery workers (rounds with beat; forecasts) + agents on a fresh private database;
    start/stop/kill each part (`worker` is the rounds' one)."""

    def __init__(
        self,
        services: PrivateServices,
        root: Path,
        agent_args: Iterable[str] = (),
        env: dict[str, str] | None = None,
    ) -> None:
        self.services = services
        self.pg, self.redis = services.pg, services.redis
        self.dir = root
        self.dbname = services.new_database()
        self.redis.flushall()
        self.env = service_env(self.pg, self.redis, self.dbname, **(env or {}))
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.agent_args = list(agent_args)
        self.web: subprocess.Popen | None = None
        self.worker: subprocess.Popen | None = None
        self.worker_starts = 0
        self.forecasts_worker: subprocess.Popen | None = None
        self.agents = [Agent(self, name, services.tokens[name]) for name in NODES]
        self.api = httpx.Client(
            base_url=self.url, headers={"Authorization": f"Token {services.tokens['api']}"}, timeout=30
        )
        self._db = None
        self._pg_log_from = self.pg.log.stat().st_size if self.pg.log.exists() else 0

    def pg_log_count(self, text: str) -> int:
        """How many lines of PostgreSQL's log since this stack started contain `text`."""
        with self.pg.log.open("rb") as f:
            f.seek(self._pg_log_from)
            return sum(text.encode() in line for line in f)

    # -- lifecycle -----------------------------------------------------------------------------

    def start_all(self) -> None:
        # The web tier and the workers boot side by side (each imports Django: seconds on 2 cores).
        self.start_web(wait=False)
        self.start_worker(wait=False)
        self.start_forecasts_worker()
        self.wait_web()
        self.wait_worker()
        self.wait_forecasts_worker()
        for agent in self.agents:
            agent.start()
        self.wait_registered()

    def stop_all(self) -> None:
        for agent in self.agents:
            agent.stop()
        # Shims and jobs live in sessions of their own (and survive an agent's death): find them.
        kill_processes_mentioning(str(self.dir))
        kill_group(self.worker, signal.SIGKILL)
        kill_group(self.forecasts_worker, signal.SIGKILL)
        kill_group(self.web, signal.SIGKILL)
        self.api.close()
        if self._db is not None:
            with contextlib.suppress(psycopg2.Error):
                self._db.close()

    def start_web(self, *, wait: bool = True) -> None:
        """gunicorn as the image runs it (config/gunicorn.conf.py: uvicorn workers on config.asgi), on
        our port, with two workers (one per core here) and an access log."""
        assert self.web is None or self.web.poll() is not None, "the web tier is running"
        with (self.dir / "web.log").open("a") as log:
            self.web = subprocess.Popen(
                [
                    PYTHON,
                    "-m",
                    "gunicorn",
                    "-c",
                    "config/gunicorn.conf.py",
                    "--access-logfile",
                    str(self.dir / "access.log"),
                ],
                cwd=REPO_ROOT,
                env={**self.env, "ATTUNE_BIND": f"127.0.0.1:{self.port}", "WEB_CONCURRENCY": "2"},
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        if wait:
            self.wait_web()

    def wait_web(self) -> None:
        wait_until(self._web_up, timeout_s=60, what="gunicorn to answer", interval_s=0.1)

    def _web_up(self) -> bool:
        assert self.web is not None and self.web.poll() is None, self.tail("web.log")
        try:
            return self.api.get("/api/v1/jobs/", params={"limit": 1}, timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    def stop_web(self, sig: int = signal.SIGTERM) -> float:
        """SIGTERM: gunicorn's graceful stop (the master waits for its workers). SIGKILL: the master
        and its workers die at once (the whole process group), mid-request. Returns how long the
        stop took."""
        t0 = time.monotonic()
        if sig == signal.SIGKILL:
            kill_group(self.web, signal.SIGKILL)
        else:
            assert self.web is not None
            self.web.send_signal(sig)
            self.web.wait(timeout=30)
        return time.monotonic() - t0

    def start_worker(self, *, wait: bool = True) -> None:
        assert self.worker is None or self.worker.poll() is not None, "the worker is running"
        self.worker_starts += 1
        log_path = self.dir / f"worker-{self.worker_starts}.log"
        with log_path.open("w") as log:
            self.worker = subprocess.Popen(
                celery_worker_argv(
                    self.dir / "beat-schedule", f"faults-{os.getpid()}-{self.worker_starts}@%h"
                ),
                cwd=REPO_ROOT,
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        if wait:
            self.wait_worker()

    def wait_worker(self) -> None:
        assert self.worker is not None
        log_path = self.dir / f"worker-{self.worker_starts}.log"
        wait_until(
            lambda: "ready." in log_path.read_text() or self.worker.poll() is not None,
            timeout_s=60,
            what="the Celery worker to be ready",
        )
        assert self.worker.poll() is None, log_path.read_text()[-3000:]

    def start_forecasts_worker(self) -> None:
        """The worker of the `forecasts` queue (forecast refreshes after rounds, admission forecasts),
        as docker-compose runs one beside the rounds' worker; no test kills it."""
        with (self.dir / "forecasts-worker.log").open("a") as log:
            self.forecasts_worker = subprocess.Popen(
                forecasts_worker_argv(f"faults-forecasts-{os.getpid()}@%h"),
                cwd=REPO_ROOT,
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def wait_forecasts_worker(self) -> None:
        assert self.forecasts_worker is not None
        log_path = self.dir / "forecasts-worker.log"
        wait_until(
            lambda: "ready." in log_path.read_text() or self.forecasts_worker.poll() is not None,
            timeout_s=60,
            what="the forecasts' Celery worker to be ready",
        )
        assert self.forecasts_worker.poll() is None, log_path.read_text()[-3000:]

    def service_pids(self) -> dict[str, int]:
        """The pid of every service process now: gunicorn's master and each of its workers, the rounds'
        worker, the forecasts' worker and each agent. A test compares two of these maps to show that
        nothing was restarted (gunicorn respawns a worker that died, under a new pid)."""
        pids = {}
        for name, proc in (("web", self.web), ("worker", self.worker), ("forecasts", self.forecasts_worker)):
            if proc is not None and proc.poll() is None:
                pids[name] = proc.pid
        with contextlib.suppress(psutil.Error):
            if self.web is not None:
                children = sorted(c.pid for c in psutil.Process(self.web.pid).children())
                for i, pid in enumerate(children):
                    pids[f"web worker {i + 1}"] = pid
        for agent in self.agents:
            if agent.alive():
                pids[agent.name] = agent.proc.pid
        return pids

    def check_workers_alive(self) -> None:
        """Both Celery workers are running: the forecasts' one too, which no test restarts (a worker that
        exits after a Redis outage stops every forecast refresh for good)."""
        for name, proc, log in (
            ("rounds' worker", self.worker, f"worker-{self.worker_starts}.log"),
            ("forecasts' worker", self.forecasts_worker, "forecasts-worker.log"),
        ):
            assert proc is not None and proc.poll() is None, (
                f"the {name} exited (status {proc and proc.poll()}):\n{self.tail(log, 3000)}"
            )

    def kill_worker(self) -> None:
        """SIGKILL the worker and its embedded beat (its process group), as the OOM killer would."""
        kill_group(self.worker, signal.SIGKILL)

    def worker_log(self) -> str:
        return "\n".join(
            (self.dir / f"worker-{i}.log").read_text(errors="replace")
            for i in range(1, self.worker_starts + 1)
        )

    def tail(self, name: str, chars: int = 3000) -> str:
        path = self.dir / name
        return path.read_text(errors="replace")[-chars:] if path.exists() else ""

    def wait_registered(self, timeout_s: float = 60) -> None:
        """Every agent registered its fake GPUs (the placeholder UUIDs are gone) and its node is up."""

        def registered() -> bool:
            rows = self.sql(
                "SELECT s.name FROM cluster_app_server s WHERE s.state NOT IN ('NOT_RESPONDING', 'DOWN') "
                "AND NOT EXISTS (SELECT 1 FROM cluster_app_gpu g WHERE g.server_id = s.id "
                "AND g.uuid LIKE 'unregistered-%%')"
            )
            return {r[0] for r in rows} >= set(NODES)

        wait_until(registered, timeout_s=timeout_s, what="both agents to register", interval_s=0.3)

    # -- the private database ------------------------------------------------------------------

    def sql(self, query: str, params: Any = None) -> list[tuple]:
        """Run a query on the stack's database (reconnecting after a restart of PostgreSQL)."""
        for attempt in (1, 2):
            try:
                if self._db is None or self._db.closed:
                    self._db = self.pg.connect(self.dbname)
                with self._db.cursor() as cur:
                    cur.execute(query, params)
                    return cur.fetchall() if cur.description else []
            except (psycopg2.OperationalError, psycopg2.InterfaceError):
                with contextlib.suppress(psycopg2.Error):
                    self._db.close()
                self._db = None
                if attempt == 2:
                    raise
        raise AssertionError("unreachable")

    def scalar(self, query: str, params: Any = None) -> Any:
        return self.sql(query, params)[0][0]

    # -- the REST API --------------------------------------------------------------------------

    def submit(
        self, *, name: str, model: str = "res18", seconds: float = 4.0, **extra: Any
    ) -> httpx.Response:
        """POST /api/v1/jobs/ as the staff user: a 1-GPU catalog job of about `seconds` of wall time."""
        body = {"name": name, "workload": model, "num_gpus": 1, "total_iters": iters_for(model, seconds)}
        body.update(extra)
        return self.api.post("/api/v1/jobs/", json=body)

    def submit_ok(self, **kwargs: Any) -> list[int]:
        """Submit and insist on 201; returns the created job ids (an array gives several)."""
        response = self.submit(**kwargs)
        assert response.status_code == 201, f"submission answered {response.status_code}: {response.text}"
        body = response.json()
        return list(body.get("array_job_ids") or [body["id"]])
