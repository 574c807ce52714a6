"""The fault tests' private PostgreSQL and Redis, and the template database every stack is cloned from."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import psutil
import psycopg2
import redis

from tests.faults.processes import PYTHON, REPO_ROOT, free_port, kill_group, postgres_bin_dir, wait_until

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
NODES = ("node1", "node2")
GPUS_PER_NODE, CPUS_PER_NODE, MEM_GB_PER_NODE = 4, 12, 250.0
TEMPLATE_DB = "attune_faults_template"
# Variables of the test process that must not leak into the service's processes.
SCRUBBED_ENV = ("DATABASE_URL", "REDIS_URL", "CACHE_URL", "CELERY_BROKER_URL", "CELERY_RESULT_BACKEND")


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
