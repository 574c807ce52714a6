"""The CPU of one single-job submission against a deep queue, in-process: what `POST /api/v1/jobs/`
costs Django and DRF (middleware, authentication, validation, storing, the answer), load-insensitive.

Run: `python -m bench.submit_cost [--queued 10000] [--servers 500] [--requests 300] [--profile 20]`.

A fresh PostgreSQL database with `--servers` servers of 8 GPUs, the catalog, one user with an API
token and `--queued` jobs queued (arrays of up to 1,000, stored as job_submit stores them, then
ANALYZEd as autovacuum would), the settings of the service with a worker (ATTUNE_INLINE_ROUNDS=0,
on `--redis-url`, flushed first: the submissions' forecast and round requests are queued there and
nobody consumes them). The last admission forecast is recorded as taking `--forecast-s` (a deep
queue's: the answer does not wait for it, as on bench.submit_rate's 500 servers). Then `--requests`
single catalog jobs are POSTed through Django's test client (the whole middleware stack, the token's
authentication, the JSON parser and renderer; not the ASGI server): printed are each request's CPU
seconds (median, p90, mean), the PostgreSQL backend's CPU per submission (its process's user +
system time over them, read with psutil: PostgreSQL must run on this machine), and one submission's
database statements and Redis commands; with `--profile N`, cProfile's N costliest functions over them.
With `--http` the submissions go over HTTP to gunicorn instead, one or more ASGI applications
alternated (bench/submit_http.py): the web processes' and PostgreSQL's CPU per submission and per
`/healthz` as the image serves them.
"""

from __future__ import annotations

import argparse
import cProfile
import random
import statistics
import sys
import time

from bench.common import profile_print
from bench.live_common import bench_database, django_setup, logger, logging_setup, percentile
from bench.submit_rate import GPU_MIX, seed

API_JOBS = "/api/v1/jobs/"


def fill(queued: int, workloads: list[str], rng: random.Random) -> None:
    """`queued` jobs as arrays of up to 1,000 tasks, stored by job_submit (no admission: quick)."""
    from django.contrib.auth import get_user_model

    from profiles_app.models import Workload
    from scheduler_app.services.jobs import JobRequest, job_submit

    owner = get_user_model().objects.get(username="rate")
    n = 0
    while n < queued:
        tasks = min(1000, queued - n)
        request = JobRequest(
            name=f"fill-{n}",
            workload=Workload.objects.get(name=rng.choice(workloads)),
            num_gpus=rng.choice(GPU_MIX),
            total_iters=rng.randint(20_000, 2_000_000),
            array=f"0-{tasks - 1}",
        )
        job_submit(owner=owner, request=request, admission=False)
        n += tasks


def bodies(workloads: list[str], count: int, seed_: int) -> list[dict]:
    rng = random.Random(seed_)
    return [
        {
            "name": f"cost-{n}",
            "workload": rng.choice(workloads),
            "num_gpus": rng.choice(GPU_MIX),
            "total_iters": rng.randint(20_000, 2_000_000),
        }
        for n in range(count)
    ]


def submit_all(client, token: str, batch: list[dict]) -> list[float]:
    """POST each body; each request's CPU seconds. Raises on anything but a 201."""
    cpu_s = []
    for body in batch:
        start = time.process_time()
        response = client.post(
            API_JOBS, body, content_type="application/json", HTTP_AUTHORIZATION=f"Token {token}"
        )
        cpu_s.append(time.process_time() - start)
        if response.status_code != 201:
            raise RuntimeError(f"a submission was refused: {response.status_code} {response.content[:300]!r}")
    return cpu_s


def queries_of(client, token: str, body: dict) -> tuple[list[str], list[str]]:
    """One submission's SQL statements and the names of its Redis commands."""
    from unittest import mock

    import redis
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    commands: list[str] = []
    execute = redis.Redis.execute_command

    def counted(self, *args, **options):
        commands.append(str(args[0]))
        return execute(self, *args, **options)

    with (
        CaptureQueriesContext(connection) as captured,
        mock.patch.object(redis.Redis, "execute_command", counted),
    ):
        response = client.post(
            API_JOBS, body, content_type="application/json", HTTP_AUTHORIZATION=f"Token {token}"
        )
    if response.status_code != 201:
        raise RuntimeError(f"a submission was refused: {response.status_code}")
    return [q["sql"] for q in captured.captured_queries], commands


def backend_cpu_s() -> float:
    """This connection's PostgreSQL backend's CPU seconds so far (user + system)."""
    import psutil
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        times = psutil.Process(cursor.fetchone()[0]).cpu_times()
    return times.user + times.system


def arguments(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--queued", type=int, default=10_000)
    parser.add_argument("--servers", type=int, default=500)
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--warmup", type=int, default=30)
    parser.add_argument("--forecast-s", type=float, default=5.0, help="the last admission forecast's length")
    parser.add_argument("--profile", type=int, default=0, help="print cProfile's N costliest functions")
    parser.add_argument("--profile-out", default="", help="also write cProfile's stats to this file")
    parser.add_argument("--show-queries", action="store_true", help="print one submission's SQL")
    parser.add_argument("--db", default="attune_bench_submit_cost", help="database to create and drop")
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/13", help="flushed first")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument(
        "--http", action="store_true", help="over HTTP under gunicorn instead (bench/submit_http.py)"
    )
    parser.add_argument(
        "--apps", default="config.asgi:application", help="with --http: ASGI applications to alternate"
    )
    parser.add_argument("--clients", type=int, default=4, help="with --http: keep-alive connections")
    parser.add_argument("--rounds", type=int, default=3, help="with --http: alternations of --apps")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    import redis

    args = arguments(argv)
    logging_setup()
    redis.Redis.from_url(args.redis_url).flushdb()
    with bench_database(args.db) as url:
        env = {
            "ATTUNE_INLINE_ROUNDS": "0",
            "REDIS_URL": args.redis_url,
            "CELERY_BROKER_URL": args.redis_url,
            "CELERY_RESULT_BACKEND": args.redis_url,
            "CACHE_URL": args.redis_url,
        }
        django_setup(url, **env)
        from django.db import connections
        from django.test import Client

        from scheduler_app.services.admission_worker import SECONDS_KEY

        token, workloads = seed(args.servers)
        start = time.perf_counter()
        fill(args.queued, workloads, random.Random(args.seed))
        logger.info("%d jobs queued in %.1f s", args.queued, time.perf_counter() - start)
        # The planner's statistics of the queue, as autovacuum gathers them within a minute of such a
        # fill in the service (bench.submit_rate's run): without them the check of a job behind the
        # forecast's window costs PostgreSQL several times what it costs in the service.
        with connections["default"].cursor() as cursor:
            cursor.execute("ANALYZE")
        redis.Redis.from_url(args.redis_url).set(SECONDS_KEY, f"{args.forecast_s:.3f}")
        if args.http:
            from bench.submit_http import http_costs

            apps = args.apps.split(",")
            runs = args.rounds * len(apps)
            http_costs(
                url=url, database=args.db, redis_url=args.redis_url, token=token, apps=apps,
                bodies=bodies(workloads, runs * (args.warmup + args.requests), args.seed),
                clients=args.clients, requests=args.requests, rounds=args.rounds, warmup=args.warmup,
            )  # fmt: skip
            connections.close_all()
            return 0
        client = Client()
        batch = bodies(workloads, args.warmup + args.requests + 1, args.seed)
        submit_all(client, token, batch[: args.warmup])
        queries, commands = queries_of(client, token, batch[args.warmup])
        measured = batch[args.warmup + 1 :]
        profiler = cProfile.Profile(time.process_time) if args.profile else None
        backend_before_s = backend_cpu_s()
        if profiler:
            profiler.enable()
        cpu_s = submit_all(client, token, measured)
        if profiler:
            profiler.disable()
        backend_s = backend_cpu_s() - backend_before_s
        connections.close_all()
    print(
        f"\n{args.queued} queued on {args.servers} x 8 GPUs; {len(cpu_s)} single-job submissions in-process"
    )
    print(
        f"CPU per submission: median {1000 * statistics.median(cpu_s):.2f} ms, "
        f"p90 {1000 * percentile(cpu_s, 90):.2f} ms, mean {1000 * statistics.mean(cpu_s):.2f} ms"
        + (" (under cProfile)" if profiler else "")
    )
    print(f"PostgreSQL backend's CPU per submission: {1000 * backend_s / len(cpu_s):.2f} ms")
    print(f"queries per submission: {len(queries)}; Redis commands: {len(commands)} ({' '.join(commands)})")
    if args.show_queries:
        for sql in queries:
            print("  ", sql[:300])
    if profiler:
        if args.profile_out:
            profiler.dump_stats(args.profile_out)
        profile_print(profiler, args.profile)
    return 0


if __name__ == "__main__":
    sys.exit(main())
