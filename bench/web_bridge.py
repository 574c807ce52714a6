"""The web tier's CPU per request over HTTP: config/wsgi_bridge.py against a2wsgi, in the same run.

Run: `python -m bench.web_bridge [--clients 16] [--requests 200] [--rounds 3]`. Creates a fresh
PostgreSQL database with `--clients` servers and their agent tokens, then serves it with gunicorn as
the image runs it (config/gunicorn.conf.py: uvicorn workers, Django on each worker's threads), once
with config.asgi's application (the bridge) and once with bench/a2wsgi_asgi.py's (a2wsgi, the
baseline), alternating `--rounds` times. Each round sends, from `--clients` keep-alive connections,
`--requests` each of: `GET /healthz` (no database), and an agent's sync without reports (its usage
sample with 8 GPUs, its commands: the fleet's most common call). It prints the web processes' CPU per
request (psutil, the gunicorn master and its workers) and the bridge's over a2wsgi's.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from io import StringIO
from pathlib import Path

from bench.common import print_table
from bench.cpu_shares import tree_cpu_s
from bench.lean_http import LeanClient
from bench.live_common import bench_database, django_setup, logger, logging_setup
from bench.live_service import free_port, healthz_wait, service_env

REPO_ROOT = Path(__file__).resolve().parent.parent
APPS = {"a2wsgi": "bench.a2wsgi_asgi:application", "bridge": "config.asgi:application"}
DEFAULT_REDIS = "redis://127.0.0.1:6379/14"


def seed(num_servers: int) -> list[tuple[str, list[str]]]:
    """Servers with agent tokens (`manage.py node_token`), registered; (token, GPU uuids) each."""
    from django.core.management import call_command

    from cluster_app.models import Gpu, Server
    from cluster_app.services import GpuSpec, server_create

    agents = []
    for i in range(num_servers):
        name = f"web{i:03d}"
        server_create(
            name=name, num_cpus=24, mem_gb=500.0, gpu_model="V100",
            gpus=[GpuSpec(index=g, uuid=f"GPU-web-{i:03d}-{g}", model="V100") for g in range(8)],
        )  # fmt: skip
        out = StringIO()
        call_command("node_token", name, stdout=out, stderr=StringIO())
        server = Server.objects.get(name=name)
        uuids = list(Gpu.objects.filter(server=server).order_by("index").values_list("uuid", flat=True))
        agents.append((out.getvalue().strip(), uuids))
    return agents


@contextmanager
def web_tier(env: dict[str, str], app: str) -> Iterator[tuple[str, int]]:
    """gunicorn with config/gunicorn.conf.py serving `app` on a free port; (base URL, master pid)."""
    port = free_port()
    web = subprocess.Popen(
        [sys.executable, "-m", "gunicorn", "-c", "config/gunicorn.conf.py", "--log-level", "warning", app],
        cwd=REPO_ROOT, env={**env, "ATTUNE_BIND": f"127.0.0.1:{port}"},
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    base_url = f"http://127.0.0.1:{port}"
    try:
        healthz_wait(base_url, web, failure=f"gunicorn serving {app} did not start")
        yield base_url, web.pid
    finally:
        web.terminate()
        web.wait(30)


def _sync_body(uuids: list[str]) -> dict:
    at = datetime.now(UTC).isoformat().replace("+00:00", "Z")
    gpus = [{"uuid": u, "util_pct": 95.0, "mem_used_mb": 20480} for u in uuids]
    return {
        "sample": {"sampled_at": at, "cpu_util_pct": 40.0, "mem_used_gb": 120.0, "gpus": gpus},
        "running": [],
        "reports": [],
    }


async def _load(base_url: str, agents: list[tuple[str, list[str]]], kind: str, requests: int) -> int:
    """`requests` calls of `kind` from each agent's own keep-alive connection; how many were not 200."""

    async def one(token: str, uuids: list[str]) -> int:
        client = LeanClient(base_url, headers={"authorization": f"Bearer {token}"}, timeout_s=60)
        failed = 0
        for _ in range(requests):
            if kind == "healthz":
                answer = await client.request("GET", "/healthz")
            else:
                answer = await client.request("POST", "/api/v1/agent/sync", json=_sync_body(uuids))
            failed += answer.status_code != 200
        return failed

    return sum(await asyncio.gather(*(one(token, uuids) for token, uuids in agents)))


async def _register(base_url: str, agents: list[tuple[str, list[str]]]) -> None:
    """Each agent registers its server, as a real one does before its first sync."""
    for i, (token, uuids) in enumerate(agents):
        client = LeanClient(base_url, headers={"authorization": f"Bearer {token}"}, timeout_s=60)
        gpus = [{"index": g, "uuid": u, "model": "V100", "memory_mb": 32768} for g, u in enumerate(uuids)]
        body = {"agent_version": "web-bench", "hostname": f"web{i:03d}", "num_cpus": 24, "mem_gb": 500.0}
        answer = await client.request("POST", "/api/v1/agent/register", json={**body, "gpus": gpus})
        if answer.status_code != 200:
            raise RuntimeError(f"registration answered {answer.status_code}: {answer.text[:200]}")


def measure(base_url: str, pid: int, agents: list[tuple[str, list[str]]], kind: str, requests: int) -> float:
    """The web tier's CPU milliseconds per request of `kind` over one burst."""
    asyncio.run(_load(base_url, agents, kind, max(1, requests // 10)))  # warm: connections, caches
    before = tree_cpu_s(pid)
    failed = asyncio.run(_load(base_url, agents, kind, requests))
    if failed:
        raise RuntimeError(f"{failed} {kind} requests were not answered 200")
    return (tree_cpu_s(pid) - before) * 1e3 / (requests * len(agents))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=16, help="keep-alive connections, one agent each")
    parser.add_argument("--requests", type=int, default=200, help="requests per client per measurement")
    parser.add_argument("--rounds", type=int, default=3, help="alternations of the two applications")
    parser.add_argument("--redis", default=DEFAULT_REDIS)
    args = parser.parse_args()
    logging_setup()
    if not 1 <= args.clients <= 200 or args.requests < 1 or not 1 <= args.rounds <= 20:
        parser.error("--clients must be 1..200, --requests >= 1 and --rounds 1..20")
    results: dict[tuple[str, str], list[float]] = {}
    with bench_database("attune_bench_web") as url:
        django_setup(url)
        agents = seed(args.clients)
        env = {**service_env(url, args.redis, 10.0), "LOG_LEVEL": "ERROR"}
        os.environ.pop("WEB_CONCURRENCY", None)
        for i in range(args.rounds):
            for name, app in APPS.items():
                with web_tier(env, app) as (base_url, pid):
                    asyncio.run(_register(base_url, agents))
                    for kind in ("healthz", "sync"):
                        results.setdefault((kind, name), []).append(
                            measure(base_url, pid, agents, kind, args.requests)
                        )
            logger.info("round %d/%d done", i + 1, args.rounds)
    rows = []
    for kind, label in (("healthz", "GET /healthz"), ("sync", "agent sync, no reports")):
        a2wsgi, bridge = (statistics.median(results[kind, name]) for name in APPS)
        runs = " / ".join(f"{x:.2f}" for x in results[kind, "bridge"])
        base_runs = " / ".join(f"{x:.2f}" for x in results[kind, "a2wsgi"])
        rows.append([label, a2wsgi, bridge, bridge / a2wsgi, base_runs, runs])
    print(
        f"\nweb tier CPU ms per request, gunicorn as the image runs it, {args.clients} keep-alive clients x"
        f" {args.requests} requests, median of {args.rounds} alternated runs; a2wsgi = the baseline,"
        " bridge = config/wsgi_bridge.py (what the image serves)"
    )
    print_table(["request", "a2wsgi ms", "bridge ms", "x a2wsgi", "a2wsgi runs", "bridge runs"], rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
