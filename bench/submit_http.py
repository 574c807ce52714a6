"""bench.submit_cost's submissions over HTTP: the web tier's and PostgreSQL's CPU per submission and per
`/healthz` under gunicorn as the image runs it, one or more ASGI applications alternated in one run.

`python -m bench.submit_cost --http [--apps config.asgi:application,...] [--clients 4]`: on the queue
bench.submit_cost builds, each application in turn is served by gunicorn with config/gunicorn.conf.py
(bench.web_bridge.web_tier), `--clients` keep-alive connections POST single catalog jobs back to back
(bench/lean_http.py: the clients' own CPU stays small and out of the figures), then GET `/healthz`.
Printed per application and round: the gunicorn master's and workers' CPU per request (psutil) and
PostgreSQL's per submission (this database's sessions and the server's background processes: WAL
writer, checkpointer; bench/cpu_shares.py). No Celery worker runs: the early rounds and forecasts the
submissions ask for stay queued on Redis, so what is measured is the request alone.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import statistics
from collections.abc import Callable

from bench.common import print_table
from bench.cpu_shares import postgres_cpu_s, tree_cpu_s
from bench.lean_http import LeanClient
from bench.live_common import logger
from bench.live_service import service_env
from bench.web_bridge import web_tier

API_JOBS = "/api/v1/jobs/"


async def _closed_loop(clients: list[LeanClient], calls: int, call: Callable) -> int:
    """`calls` calls spread over the clients, each client back to back; how many failed."""
    counter = itertools.count()

    async def one(client: LeanClient) -> int:
        failed = 0
        while (n := next(counter)) < calls:
            failed += not await call(client, n)
        return failed

    return sum(await asyncio.gather(*(one(client) for client in clients)))


def _submit(bodies: list[dict]) -> Callable:
    async def call(client: LeanClient, n: int) -> bool:
        answer = await client.request("POST", API_JOBS, json=bodies[n % len(bodies)])
        if answer.status_code != 201:
            logger.warning("a submission answered %s: %s", answer.status_code, answer.text[:200])
        return answer.status_code == 201

    return call


async def _healthz(client: LeanClient, n: int) -> bool:
    answer = await client.request("GET", "/healthz")
    if answer.status_code != 200:
        logger.warning("/healthz answered %s: %s", answer.status_code, answer.text[:200])
    return answer.status_code == 200


def _measure(
    base_url: str, pid: int, database: str, token: str, call: Callable, calls: int, clients: int
) -> tuple[float, float]:
    """(web CPU ms, PostgreSQL CPU ms) per call over `calls` calls from `clients` connections."""

    async def run() -> int:
        headers = {"authorization": f"Token {token}"}
        connections = [LeanClient(base_url, headers=headers, timeout_s=60) for _ in range(clients)]
        try:
            return await _closed_loop(connections, calls, call)
        finally:
            for client in connections:
                await client.aclose()

    web0, pg0 = tree_cpu_s(pid), postgres_cpu_s(database)
    failed = asyncio.run(run())
    web1, pg1 = tree_cpu_s(pid), postgres_cpu_s(database)
    if failed:
        raise RuntimeError(f"{failed} of {calls} calls failed")
    return 1000 * (web1 - web0) / calls, 1000 * (pg1 - pg0) / calls


def http_costs(
    *, url: str, database: str, redis_url: str, token: str, bodies: list[dict], apps: list[str],
    clients: int, requests: int, rounds: int, warmup: int,
) -> None:  # fmt: skip
    """Serve the database with each of `apps` in turn, `rounds` times; print their costs."""
    env = {
        **service_env(url, redis_url, 10.0),
        "ATTUNE_NODE_NOT_RESPONDING_AFTER_S": "86400",
        "ATTUNE_NODE_DOWN_AFTER_S": "864000",
        "ATTUNE_LEASE_FENCE_S": "86400",
    }
    env.pop("WEB_CONCURRENCY", None)
    results: dict[tuple[str, str], list[tuple[float, float]]] = {}
    offset = 0
    for i in range(rounds):
        for app in apps:
            with web_tier(env, app) as (base_url, pid):
                batch = bodies[offset : offset + warmup + requests]
                offset += warmup + requests
                measure = functools.partial(_measure, base_url, pid, database, token, clients=clients)
                measure(_submit(batch[:warmup]), warmup)
                measure(_healthz, warmup)
                submit = measure(_submit(batch[warmup:]), requests)
                health = measure(_healthz, requests)
            results.setdefault((app, "submit"), []).append(submit)
            results.setdefault((app, "healthz"), []).append(health)
            logger.info("round %d %s: submit web %.2f pg %.2f ms, healthz web %.2f ms",
                        i + 1, app, *submit, health[0])  # fmt: skip
    rows = []
    for app in apps:
        sub, health = results[app, "submit"], results[app, "healthz"]
        rows.append([
            app,
            statistics.median(w for w, _ in sub),
            statistics.median(p for _, p in sub),
            statistics.median(w + p for w, p in sub),
            statistics.median(w for w, _ in health),
            " / ".join(f"{w:.2f}+{p:.2f}" for w, p in sub),
        ])  # fmt: skip
    print(
        f"\nover HTTP, gunicorn with config/gunicorn.conf.py, {clients} keep-alive clients, {requests} "
        f"submissions then {requests} /healthz per run, median of {rounds} alternated runs"
        " (CPU ms per request)"
    )
    print_table(["application", "web / sub", "pg / sub", "sum", "web / healthz", "runs web+pg"], rows)
