"""The whole service as real processes on private PostgreSQL and Redis instances, for fault tests.

`PrivateServices` (one per session) runs a PostgreSQL cluster (initdb in a temp dir, as the
`postgres` account) and a Redis server on free ports, and migrates a template database once: the
catalog, two servers with agent tokens and a staff user with an API token. `Stack` (one per test)
clones a fresh database from it and runs gunicorn (the web tier), a Celery worker with beat (rounds),
one of the `forecasts` queue and node agents with fake GPUs as subprocesses, each of which a test can
stop, kill or restart. The test reads the outcome straight from the private database with psycopg2;
nothing here touches the shared PostgreSQL or Redis of the machine.
"""

from __future__ import annotations

import contextlib
import glob
import json
import os
import re
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import httpx
import psutil
import psycopg2
import redis

from tests.e2e.processes import celery_worker_argv, forecasts_worker_argv

REPO_ROOT = Path(__file__).resolve().parents[2]
PYTHON = sys.executable

# Short periods, as in tests/e2e/conftest.py, so that a test sees rounds and sweeps within seconds.
SERVICE_ENV = {
    "ATTUNE_ROUND_S": "3",
    "ATTUNE_EARLY_ROUND_DELAY_S": "0.5",
    "ATTUNE_LIVENESS_SWEEP_S": "1",
    "ATTUNE_AGENT_SYNC_INTERVAL_S": "1",
    # (before the agents' one sync call: heartbeat and poll)
    "ATTUNE_HEARTBEAT_INTERVAL_S": "1",
    "ATTUNE_POLL_INTERVAL_S": "1",
    # No test here wants a node declared dead: an agent down for a few seconds is only NOT_RESPONDING.
    "ATTUNE_NODE_NOT_RESPONDING_AFTER_S": "10",
    "ATTUNE_NODE_DOWN_AFTER_S": "120",
    "ATTUNE_PREEMPT_GRACE_S": "3",
    # A 2-core machine runs the whole cluster: keep the forecasts' background CPU small.
    "ATTUNE_FORECAST_TIME_BUDGET_S": "0.5",
    "ATTUNE_FORECAST_REFRESH_BUDGET_S": "1",
}
ROUND_S = float(SERVICE_ENV["ATTUNE_ROUND_S"])
# What the rounds' single-flight advisory lock looks like in pg_locks (scheduler_app/services/round_lock.py).
ROUND_LOCK_KEY = int.from_bytes(b"Attune01", "big") & 0x7FFF_FFFF_FFFF_FFFF
NODES = ("node1", "node2")
GPUS_PER_NODE, CPUS_PER_NODE, MEM_GB_PER_NODE = 4, 12, 250.0
TIME_SCALE = 0.02
TEMPLATE_DB = "attune_faults_template"
ACCESS_LINE = re.compile(r'"(?P<request>[A-Z]+ [^"]*)" (?P<status>\d{3})\b')
# Variables of the test process that must not leak into the service's processes.
SCRUBBED_ENV = ("DATABASE_URL", "REDIS_URL", "CACHE_URL", "CELERY_BROKER_URL", "CELERY_RESULT_BACKEND")


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


# ---------------------------------------------------------------------------------------------------
# Private PostgreSQL and Redis
# ---------------------------------------------------------------------------------------------------


class PrivatePostgres:
    """A throwaway PostgreSQL cluster on a free port, owned by the postgres account, trust auth on
    127.0.0.1. Durability settings are off (a test's data is thrown away); `restart` is a real
    `pg_ctl restart -m fast`: every connection is cut and the server is down for a moment."""

    def __init__(self, root: Path) -> None:
        self.bin = postgres_bin_dir()
        assert self.bin is not None
        self.root = root / "pg"
        self.root.mkdir()
        shutil.chown(self.root, "postgres", "postgres")
        self.data = self.root / "data"
        self.log = self.root / "postgres.log"
        self.port = free_port()
        self._as_postgres(
            "initdb", "-D", str(self.data), "-U", "postgres", "--auth=trust", "-E", "UTF8", "--no-sync"
        )
        opts = (
            f"-p {self.port} -c listen_addresses=127.0.0.1 -c unix_socket_directories={self.root} "
            "-c fsync=off -c synchronous_commit=off -c full_page_writes=off -c max_connections=200 "
            "-c log_lock_waits=on -c log_line_prefix=%m[%p]"
        )
        (self.root / "opts").write_text(opts)
        self.start()

    def _as_postgres(self, tool: str, *args: str, timeout: float = 60) -> None:
        result = subprocess.run(
            ["runuser", "-u", "postgres", "--", str(self.bin / tool), *args],
            cwd=self.root,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        if result.returncode != 0:
            raise RuntimeError(f"{tool} failed: {result.stdout}{result.stderr}{self.log_tail()}")

    def log_tail(self, chars: int = 3000) -> str:
        return self.log.read_text(errors="replace")[-chars:] if self.log.exists() else ""

    def start(self) -> None:
        opts = (self.root / "opts").read_text()
        self._as_postgres("pg_ctl", "-D", str(self.data), "-l", str(self.log), "-o", opts, "-w", "start")

    def restart(self) -> float:
        """`pg_ctl restart -m fast`; returns how long the server was unreachable (about)."""
        t0 = time.monotonic()
        # -l again: without it the new postmaster writes to our pipe, and run() waits for it forever.
        self._as_postgres("pg_ctl", "-D", str(self.data), "-l", str(self.log), "-m", "fast", "-w", "restart")
        return time.monotonic() - t0

    def stop(self) -> None:
        with contextlib.suppress(RuntimeError, subprocess.TimeoutExpired):
            self._as_postgres("pg_ctl", "-D", str(self.data), "-m", "immediate", "-w", "stop", timeout=30)
        # Never leave a server behind: if pg_ctl could not stop it, kill the postmaster named in its pid file.
        pid_file = self.data / "postmaster.pid"
        with contextlib.suppress(OSError, ValueError, IndexError, psutil.Error):
            postmaster = psutil.Process(int(pid_file.read_text().split()[0]))
            if str(self.data) in " ".join(postmaster.cmdline()):  # ours, not a reused pid
                postmaster.kill()

    def url(self, dbname: str) -> str:
        return f"postgres://postgres@127.0.0.1:{self.port}/{dbname}"

    def connect(self, dbname: str = "postgres"):
        conn = psycopg2.connect(
            host="127.0.0.1", port=self.port, user="postgres", dbname=dbname, connect_timeout=3
        )
        conn.autocommit = True
        return conn

    def admin(self, sql: str) -> None:
        conn = self.connect()
        try:
            with conn.cursor() as cur:
                cur.execute(sql)
        finally:
            conn.close()


class PrivateRedis:
    """A throwaway Redis server on a free port, without persistence: a restart loses every key, as a
    cache-only production Redis does (queued tasks, the early-round key)."""

    def __init__(self, root: Path) -> None:
        self.dir = root / "redis"
        self.dir.mkdir()
        self.port = free_port()
        self.proc: subprocess.Popen | None = None
        self.start()

    def start(self) -> None:
        log = (self.dir / "redis.log").open("a")
        self.proc = subprocess.Popen(
            [
                "redis-server",
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                str(self.dir),
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        log.close()
        wait_until(self.ping, timeout_s=10, what=f"redis-server on port {self.port}", interval_s=0.05)

    def ping(self) -> bool:
        try:
            return bool(redis.Redis(port=self.port, socket_timeout=0.5).ping())
        except redis.RedisError:
            return False

    def stop(self) -> None:
        kill_group(self.proc, signal.SIGTERM)

    def url(self, db: int) -> str:
        return f"redis://127.0.0.1:{self.port}/{db}"

    def flushall(self) -> None:
        redis.Redis(port=self.port).flushall()


def service_env(pg: PrivatePostgres, rds: PrivateRedis, dbname: str, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in SCRUBBED_ENV}
    env.update(
        {
            "DJANGO_SETTINGS_MODULE": "config.settings",
            "DATABASE_URL": pg.url(dbname),
            "REDIS_URL": rds.url(0),
            "CELERY_BROKER_URL": rds.url(0),
            "CELERY_RESULT_BACKEND": rds.url(0),
            "CACHE_URL": rds.url(1),
            "ATTUNE_INLINE_ROUNDS": "0",
            "PYTHONUNBUFFERED": "1",
            **SERVICE_ENV,
            **extra,
        }
    )
    return env


# Run once in the template database, after migrate: what every test starts from.
TEMPLATE_SETUP = """
import json
from io import StringIO
from django.contrib.auth import get_user_model
from django.core.management import call_command
from rest_framework.authtoken.models import Token
from profiles_app.services.workloads import workload_catalog_load

workload_catalog_load()
user = get_user_model().objects.create_user("faults-staff", password=None, is_staff=True)
tokens = {"api": Token.objects.create(user=user).key}
for name in %(nodes)r:
    out = StringIO()
    call_command("node_token", name, "--gpus", "%(gpus)d", "--cpus", "%(cpus)d", "--mem-gb", "%(mem)s",
                 stdout=out, stderr=StringIO())
    tokens[name] = out.getvalue().strip()
print("TOKENS=" + json.dumps(tokens))
"""


class PrivateServices:
    """Session-wide: the private PostgreSQL and Redis, and the migrated template database."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.pg = PrivatePostgres(root)
        self.redis = PrivateRedis(root)
        self.pg.admin(f"CREATE DATABASE {TEMPLATE_DB}")
        env = service_env(self.pg, self.redis, TEMPLATE_DB)
        t0 = time.monotonic()
        migrate = subprocess.run(
            [PYTHON, "manage.py", "migrate", "--noinput"],
            cwd=REPO_ROOT,
            env=env,
            capture_output=True,
            text=True,
        )
        assert migrate.returncode == 0, migrate.stdout[-2000:] + migrate.stderr[-3000:]
        code = TEMPLATE_SETUP % {
            "nodes": NODES,
            "gpus": GPUS_PER_NODE,
            "cpus": CPUS_PER_NODE,
            "mem": MEM_GB_PER_NODE,
        }
        setup = subprocess.run(
            [PYTHON, "manage.py", "shell", "-c", code], cwd=REPO_ROOT, env=env, capture_output=True, text=True
        )
        assert setup.returncode == 0, setup.stdout[-2000:] + setup.stderr[-3000:]
        line = next(x for x in setup.stdout.splitlines() if x.startswith("TOKENS="))
        self.tokens: dict[str, str] = json.loads(line.removeprefix("TOKENS="))
        self.template_s = time.monotonic() - t0
        self._databases = 0

    def new_database(self) -> str:
        self._databases += 1
        name = f"attune_faults_{self._databases}"
        self.pg.admin(f"CREATE DATABASE {name} TEMPLATE {TEMPLATE_DB}")
        return name

    def close(self) -> None:
        self.redis.stop()
        self.pg.stop()


# ---------------------------------------------------------------------------------------------------
# The stack under test
# ---------------------------------------------------------------------------------------------------


class Agent:
    """`python -m agent` with fake GPUs, in a session of its own. Its jobs' shims start sessions of
    their own too, so `kill()` kills the agent alone (a crashed agent on a node that keeps running)."""

    def __init__(self, stack: Stack, name: str, token: str) -> None:
        self.name, self.token = name, token
        self.dir = stack.dir / name
        self.dir.mkdir()
        self.spool_dir = self.dir / "spool"
        self.work_dir = self.dir / "work"
        self.log_path = self.dir / "agent.log"
        self.args = [
            PYTHON,
            "-m",
            "agent",
            "--server",
            stack.url,
            "--name",
            name,
            "--fake-gpus",
            str(GPUS_PER_NODE),
            "--fake-cpus",
            str(CPUS_PER_NODE),
            "--fake-mem-gb",
            str(MEM_GB_PER_NODE),
            "--time-scale",
            str(TIME_SCALE),
            "--spool-dir",
            str(self.spool_dir),
            "--work-dir",
            str(self.work_dir),
            "--isolation",
            "affinity+rlimit",
            *stack.agent_args,
        ]
        self.proc: subprocess.Popen | None = None
        self.starts = 0

    def start(self) -> None:
        assert self.proc is None or self.proc.poll() is not None, f"{self.name} is running"
        env = {k: v for k, v in os.environ.items() if k not in (*SCRUBBED_ENV, "DJANGO_SETTINGS_MODULE")}
        env["ATTUNE_AGENT_TOKEN"] = self.token
        with self.log_path.open("a") as log:
            self.proc = subprocess.Popen(
                self.args,
                cwd=REPO_ROOT,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.starts += 1

    def kill(self) -> None:
        """SIGKILL the agent process alone; its shims and jobs live on."""
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait(timeout=10)

    def stop(self) -> None:
        kill_group(self.proc, signal.SIGKILL)

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def log_tail(self, chars: int = 3000) -> str:
        return self.log_path.read_text(errors="replace")[-chars:] if self.log_path.exists() else ""

    # -- the spool (agent/spool.py): what the agent sent and what is still unacknowledged ----------

    def spool(self) -> dict[str, Any]:
        """{'last_seq': {lease: n}, 'pending': {(lease, seq)}, 'live': {lease}} read from the agent's
        SQLite spool.

        A report gets the lease's next seq (`lease_seq.last_seq`) when it is written and leaves the
        `reports` table once the service acknowledged (or rejected) it: with nothing pending and no
        live lease (`leases` holds a record from launch until the `exited` report is written), the
        agent sent and had acknowledged exactly the seqs 1..last_seq of each lease, and writes no more.
        """
        path = self.spool_dir / "spool.sqlite3"
        db = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=5)
        try:
            last = dict(db.execute("SELECT lease_id, last_seq FROM lease_seq").fetchall())
            pending = set(db.execute("SELECT lease_id, seq FROM reports").fetchall())
            live = {row[0] for row in db.execute("SELECT lease_id FROM leases")}
        finally:
            db.close()
        return {"last_seq": last, "pending": pending, "live": live}


class Stack:
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

    def access_log(self) -> list[tuple[int, str]]:
        """(status, request line) of every answer of the web tier so far (gunicorn's access log)."""
        path = self.dir / "access.log"
        out = []
        for line in path.read_text(errors="replace").splitlines() if path.exists() else []:
            # gunicorn's format and uvicorn's alike: ... "METHOD /path?query HTTP/1.1" STATUS ...
            match = ACCESS_LINE.search(line)
            if match:
                out.append((int(match["status"]), match["request"].split("?")[0]))
        return out

    def access_log_statuses(self) -> dict[int, int]:
        """How many requests the web tier answered with each status."""
        counts: dict[int, int] = defaultdict(int)
        for status, _ in self.access_log():
            counts[status] += 1
        return dict(counts)

    def errors_since(self, start: int) -> dict[str, int]:
        """The 5xx answers after the first `start` access log lines: request -> count."""
        counts: dict[str, int] = defaultdict(int)
        for status, request in self.access_log()[start:]:
            if status >= 500:
                counts[f"{status} {request}"] += 1
        return dict(counts)

    # -- what the database says ----------------------------------------------------------------

    def job_states(self, ids: Iterable[int]) -> dict[int, str]:
        return dict(self.sql("SELECT id, state FROM scheduler_app_job WHERE id = ANY(%s)", [list(ids)]))

    def all_completed(self, ids: list[int]) -> bool:
        states = self.job_states(ids)
        bad = {i: s for i, s in states.items() if s in ("FAILED", "CANCELLED", "OUT_OF_MEMORY", "TIMEOUT")}
        assert not bad, f"jobs ended badly: {bad}; {self.job_table(bad)}"
        return len(states) == len(ids) and set(states.values()) == {"COMPLETED"}

    def job_table(self, ids: Iterable[int]) -> list[tuple]:
        return self.sql(
            "SELECT id, name, state, pending_reason, done_iters, total_iters, exit_code "
            "FROM scheduler_app_job WHERE id = ANY(%s) ORDER BY id",
            [list(ids)],
        )

    def last_round_id(self) -> int:
        return self.scalar("SELECT COALESCE(MAX(id), 0) FROM scheduler_app_schedulinground")

    def wait_round_since(self, db_time: Any, *, timeout_s: float, what: str) -> int:
        """Wait for a round started at `db_time` (the database's clock) or later; returns how many."""
        return wait_until(
            lambda: self.scalar(
                "SELECT COUNT(*) FROM scheduler_app_schedulinground WHERE started_at >= %s", [db_time]
            ),
            timeout_s=timeout_s,
            what=what,
            interval_s=0.1,
            diagnose=self.describe,
        )

    def round_lock_holder(self) -> int | None:
        """The backend pid holding the rounds' advisory lock (a round's transaction is open), or None."""
        rows = self.sql(
            "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND granted AND database = "
            "(SELECT oid FROM pg_database WHERE datname = current_database()) "
            "AND ((classid::bigint << 32) | objid::bigint) = %s",
            [ROUND_LOCK_KEY],
        )
        return rows[0][0] if rows else None

    def double_booked_gpus(self) -> list[tuple]:
        """GPUs in more than one unreleased AllocationGpu row (the partial unique index forbids it)."""
        return self.sql(
            "SELECT gpu_id, COUNT(*) FROM scheduler_app_allocationgpu WHERE released_at IS NULL "
            "GROUP BY gpu_id HAVING COUNT(*) > 1"
        )

    def overlapping_gpu_holds(self) -> list[tuple]:
        """Across the whole history: two holds of one GPU whose time intervals overlap."""
        return self.sql(
            "SELECT a.gpu_id, a.id, b.id FROM scheduler_app_allocationgpu a "
            "JOIN scheduler_app_allocation aa ON aa.id = a.allocation_id "
            "JOIN scheduler_app_allocationgpu b ON b.gpu_id = a.gpu_id AND b.id > a.id "
            "JOIN scheduler_app_allocation ba ON ba.id = b.allocation_id "
            "WHERE ba.started_at < COALESCE(a.released_at, 'infinity') "
            "AND aa.started_at < COALESCE(b.released_at, 'infinity')"
        )

    def jobs_with_too_many_leases(self) -> list[tuple]:
        """Jobs with more active allocations than servers they may span (their node count, else 1)."""
        return self.sql(
            "SELECT j.id, COUNT(a.id), COALESCE(j.num_nodes, 1) FROM scheduler_app_job j "
            "JOIN scheduler_app_allocation a ON a.job_id = j.id AND a.ended_at IS NULL "
            "GROUP BY j.id HAVING COUNT(a.id) > COALESCE(j.num_nodes, 1)"
        )

    def running_without_lease(self) -> list[int]:
        return [
            r[0]
            for r in self.sql(
                "SELECT j.id FROM scheduler_app_job j WHERE j.state = 'RUNNING' AND NOT EXISTS "
                "(SELECT 1 FROM scheduler_app_allocation a WHERE a.job_id = j.id AND a.ended_at IS NULL)"
            )
        ]

    def gpu_index_exists(self) -> bool:
        return bool(
            self.sql(
                "SELECT 1 FROM pg_indexes WHERE indexname = 'gpu_in_one_active_allocation' "
                "AND indexdef LIKE '%%UNIQUE%%' AND indexdef LIKE '%%released_at IS NULL%%'"
            )
        )

    def half_applied_rounds(self) -> list[tuple]:
        """Rounds whose row is not whole: a round's row, decisions and counts commit together (one
        transaction), so a round killed midway leaves nothing, never a row without its decisions."""
        return self.sql(
            "SELECT r.id, r.duration_ms, r.num_placed + r.num_pending + r.num_infeasible, COUNT(d.id) "
            "FROM scheduler_app_schedulinground r "
            "LEFT JOIN scheduler_app_rounddecision d ON d.round_id = r.id GROUP BY r.id "
            "HAVING r.duration_ms <= 0 OR COUNT(d.id) <> r.num_placed + r.num_pending + r.num_infeasible"
        )

    def check_invariants(self) -> dict[str, int]:
        """What must hold at any moment, whatever was killed: returns the figures it checked.

        No GPU in two unreleased holds (the partial unique index forbids it: checked that it exists and
        that the rows agree), no two holds of a GPU overlapping in time over the whole history, no job
        with more active leases than servers it may span, no job RUNNING without an active lease, no
        half-applied round.
        """
        assert self.gpu_index_exists(), "the unique index gpu_in_one_active_allocation is missing"
        figures = {
            "gpus": self.scalar("SELECT COUNT(*) FROM cluster_app_gpu"),
            "gpus_held": self.scalar(
                "SELECT COUNT(*) FROM scheduler_app_allocationgpu WHERE released_at IS NULL"
            ),
            "gpu_holds": self.scalar("SELECT COUNT(*) FROM scheduler_app_allocationgpu"),
            "leases": self.scalar("SELECT COUNT(*) FROM scheduler_app_allocation"),
            "active_leases": self.scalar(
                "SELECT COUNT(*) FROM scheduler_app_allocation WHERE ended_at IS NULL"
            ),
            "rounds": self.scalar("SELECT COUNT(*) FROM scheduler_app_schedulinground"),
        }
        problems = {
            "GPUs in two unreleased holds (gpu, holds)": self.double_booked_gpus(),
            "GPU holds overlapping in time (gpu, hold, hold)": self.overlapping_gpu_holds(),
            "jobs with too many active leases (job, leases, nodes)": self.jobs_with_too_many_leases(),
            "jobs RUNNING without an active lease": self.running_without_lease(),
            "half-applied rounds (round, duration, counted, decisions)": self.half_applied_rounds(),
        }
        bad = {k: v for k, v in problems.items() if v}
        assert not bad, f"invariants broken: {bad} (figures: {figures})"
        return figures

    def stored_reports(self) -> dict[str, list[int]]:
        """Per lease: the seqs of its stored AgentReport rows (duplicates kept, to be seen)."""
        out: dict[str, list[int]] = defaultdict(list)
        for lease, seq in self.sql("SELECT lease_id::text, seq FROM scheduler_app_agentreport ORDER BY 1, 2"):
            out[lease].append(seq)
        return dict(out)

    def lease_ids(self) -> dict[str, tuple[int, str]]:
        """Every allocation's lease id -> (job id, server name)."""
        return {
            lease: (job, server)
            for lease, job, server in self.sql(
                "SELECT a.lease_id::text, a.job_id, s.name FROM scheduler_app_allocation a "
                "JOIN cluster_app_server s ON s.id = a.server_id"
            )
        }

    def describe(self, ids: Iterable[int] = ()) -> str:
        """A diagnosis for an assertion message: jobs, leases, processes and the logs' last lines."""
        ids = list(ids)
        lines = [f"jobs (id, name, state, reason, done, total, exit): {self.job_table(ids)}" if ids else ""]
        with contextlib.suppress(psycopg2.Error):
            lines.append(
                "active leases (job, server, lease): "
                + repr(
                    self.sql(
                        "SELECT a.job_id, s.name, a.lease_id::text FROM scheduler_app_allocation a JOIN "
                        "cluster_app_server s ON s.id = a.server_id WHERE a.ended_at IS NULL ORDER BY 1"
                    )
                )
            )
            lines.append(f"servers: {self.sql('SELECT name, state FROM cluster_app_server ORDER BY 1')}")
        alive = {
            name: proc is not None and proc.poll() is None
            for name, proc in (
                ("web", self.web),
                ("worker", self.worker),
                ("forecasts worker", self.forecasts_worker),
            )
        }
        lines.append(", ".join(f"{name} alive: {up}" for name, up in alive.items()))
        lines.append(f"web log:\n{self.tail('web.log', 1500)}")
        lines.append(f"worker log:\n{self.worker_log()[-2500:]}")
        lines.append(f"forecasts worker log:\n{self.tail('forecasts-worker.log', 1500)}")
        for agent in self.agents:
            lines.append(f"{agent.name} (alive: {agent.alive()}) log:\n{agent.log_tail(2000)}")
        return "\n".join(lines)

    def wait_spools_drained(self, timeout_s: float = 30) -> None:
        """Every agent runs no lease and had every report it wrote acknowledged. A job can complete
        while a lease of it still stops (it finished through another lease, or the last progress came
        in the grace period): that lease's `exited` report comes after, so an empty `reports` table
        alone is not the end."""

        def drained() -> bool:
            spools = [a.spool() for a in self.agents]
            return all(not s["pending"] and not s["live"] for s in spools)

        wait_until(
            drained,
            timeout_s=timeout_s,
            what="the agents' spools to be drained (no lease running, every report acknowledged)",
            diagnose=self.describe,
        )

    def wait_running(self, ids: list[int], at_least: int, timeout_s: float = 40) -> int:
        """Wait until `at_least` of the jobs are RUNNING and have reported progress; returns how many."""

        def running() -> int:
            n = self.scalar(
                "SELECT COUNT(*) FROM scheduler_app_job WHERE id = ANY(%s) AND state = 'RUNNING' "
                "AND done_iters > 0",
                [ids],
            )
            return n if n >= at_least else 0

        return wait_until(
            running,
            timeout_s=timeout_s,
            what=f"{at_least} jobs running with progress",
            diagnose=lambda: self.describe(ids),
        )

    def recent_statuses(self, n: int) -> list[int]:
        """The statuses of the web tier's last `n` answers."""
        return [status for status, _ in self.access_log()[-n:]]

    def finish_and_check(self, ids: list[int], *, timeout_s: float = 90) -> dict[str, Any]:
        """Every job completes with exactly its iterations, every agent's spool is drained and each
        report stored once, the database invariants hold, and the web tier answers again (its last
        answers are not 5xx). Returns the figures for the test's summary."""
        wait_until(
            lambda: self.all_completed(ids),
            timeout_s=timeout_s,
            what=f"all {len(ids)} jobs to complete",
            interval_s=0.5,
            diagnose=lambda: self.describe(ids),
        )
        self.check_progress_exact(ids)
        self.wait_spools_drained()
        figures: dict[str, Any] = dict(self.check_reports_exactly_once())
        figures.update(self.check_invariants())
        # Agents sync every second: after the jobs ended, their calls must be answered again.
        time.sleep(2)
        recent = self.recent_statuses(10)
        assert recent and all(s < 500 for s in recent), f"the web tier still fails: last statuses {recent}"
        figures["jobs"] = len(ids)
        figures["web"] = self.access_log_statuses()
        figures["deadlocks"] = self.pg_log_count("deadlock detected")
        self.check_workers_alive()
        return figures

    def check_reports_exactly_once(self) -> dict[str, int]:
        """Every agent's spool is empty (all acknowledged), and per lease the stored reports are exactly
        the seqs 1..last_seq the agent's spool handed out: none lost, none stored twice.
        Returns figures to print."""
        stored = self.stored_reports()
        leases = self.lease_ids()
        sent_total = stored_total = 0
        problems: list[str] = []
        for agent in self.agents:
            spool = agent.spool()
            if spool["pending"]:
                problems.append(f"{agent.name}: {len(spool['pending'])} reports never acknowledged")
            for lease, last in spool["last_seq"].items():
                if lease not in leases:
                    continue  # a profiling run's reports (none here): not AgentReport rows
                seqs = stored.get(lease, [])
                sent_total += last
                stored_total += len(seqs)
                if seqs != list(range(1, last + 1)):
                    problems.append(
                        f"{agent.name} lease {lease} (job {leases[lease][0]}): sent seqs 1..{last}, "
                        f"stored {seqs}"
                    )
        unknown = set(stored) - {lease for a in self.agents for lease in a.spool()["last_seq"]}
        if unknown:
            problems.append(f"stored reports of leases no agent's spool knows: {sorted(unknown)}")
        assert not problems, "reports not stored exactly once:\n  " + "\n  ".join(problems)
        return {"sent": sent_total, "stored": stored_total, "leases": len(stored)}

    def check_progress_exact(self, ids: list[int]) -> None:
        rows = self.sql("SELECT id, done_iters, total_iters FROM scheduler_app_job WHERE id = ANY(%s)", [ids])
        wrong = [r for r in rows if r[1] != r[2]]
        assert not wrong, f"jobs whose progress is not exactly their total (id, done, total): {wrong}"

    def started_reports_per_lease(self) -> dict[str, int]:
        return dict(
            self.sql(
                "SELECT lease_id::text, COUNT(*) FROM scheduler_app_agentreport WHERE kind = 'started' "
                "GROUP BY 1"
            )
        )

    def leases_per_job(self, ids: list[int]) -> dict[int, int]:
        return dict(
            self.sql(
                "SELECT job_id, COUNT(*) FROM scheduler_app_allocation WHERE job_id = ANY(%s) GROUP BY 1",
                [ids],
            )
        )

    def log_tails(self, ids: list[int]) -> dict[int, str]:
        out: dict[int, str] = defaultdict(str)
        for job, tail in self.sql(
            "SELECT job_id, log_tail FROM scheduler_app_allocation WHERE job_id = ANY(%s) ORDER BY id", [ids]
        ):
            out[job] += tail + "\n"
        return dict(out)


def summary(tag: str, figures: dict[str, Any], *extra: str) -> str:
    """One line of what a test checked (printed, and put in its assertion messages)."""
    parts = [
        f"jobs: {figures['jobs']}/{figures['jobs']} COMPLETED with done == total",
        f"reports: {figures['sent']} sent = {figures['stored']} stored once over {figures['leases']} "
        "leases, spools drained",
        f"GPUs: {figures['gpus']}, 0 double-booked over {figures['gpu_holds']} holds, "
        f"{figures['active_leases']} active leases, 0 jobs RUNNING without one",
        f"rounds: {figures['rounds']}",
        f"web statuses: {figures['web']}",
        f"PostgreSQL deadlocks: {figures['deadlocks']}",
        *extra,
    ]
    return f"[{tag}] " + "; ".join(parts)


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


def iters_for(model: str, seconds: float) -> int:
    """Iterations that take about `seconds` at the GPU-proportional share on our fake nodes."""
    from profiles_app.catalog import profile_for

    return max(10, int(seconds / (profile_for(model).iter_time_s * TIME_SCALE)))
