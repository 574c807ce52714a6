"""Page speed of the web UI and the dashboards' JSON on a week of history, against /healthz in the same run.

Run: `python -m bench.web_pages [--servers 16] [--jobs 1000] [--days 7] [--repeats 7]
[--raw-interval-s 60] [--raw-days 2] [--usage-days N] [--only TEXT]`. Creates a fresh PostgreSQL
database (`attune_bench_web`, dropped at the end, also on error), 16 servers x 8 GPUs, the workload
catalog, 1,000 jobs in mixed states submitted over the week (with their events, allocations on
recorded rounds, QoS targets and teams), a round every 5 minutes and one usage sample per server and
per GPU per minute (16 x 7 x 1,440 = 161,280 server rows and 1,290,240 GPU rows, written by INSERT ...
SELECT generate_series on the server side); with `--raw-interval-s 5`, one every 5 s over the last
`--raw-days` (what production holds before the roll-up: 12x the rows there). The per-minute cluster
sums the dashboards read are then built by the rebuild service, and the per-sample aggregation they
replaced is timed once for comparison (logged). Then, through the Django test client logged in as
staff (persistent connection, no HTTP), times every page and dashboard endpoint: the first request
after the cache is cleared ("cold": the dashboards cache closed usage buckets, see
docs/dashboards.md), then the median of `--repeats` requests after it, and the query count.
Baseline in the same run: `GET /healthz` (one `SELECT 1`); `x healthz` = page median / healthz
median. User pages of the web app (queue, job, cluster, submit) are included when their URL names
resolve, the accounting page and `GET /api/v1/accounting/` over 30 and 365 days among them. Exits 1 if
any median is at or above the budget (500 ms) or any request fails; a cold request over it is shown,
not failed.

Accounting at scale (sacct over a year): `--jobs 100000 --days 365 --usage-days 7 --only accounting`
submits 100,000 jobs over the year (their allocations, about 80,000, on 16 x 8 GPUs) and times only
the requests whose label has "accounting" in it; `--usage-days` keeps the usage samples to the last
week (a year of them, one a minute per GPU, is 67 million rows, which no accounting request reads).
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from datetime import datetime, timedelta
from typing import Any

from bench.common import print_table
from bench.live_common import bench_database, django_setup, logger, logging_setup, servers_create

BUDGET_MS = 500.0
STATE_MIX = (  # share of the jobs in each state
    ("COMPLETED", 0.62),
    ("RUNNING", 0.06),
    ("PENDING", 0.22),
    ("FAILED", 0.05),
    ("CANCELLED", 0.05),
)
GPU_MIX = ((1, 0.55), (2, 0.25), (4, 0.15), (8, 0.05))


def seed_usage(days: int, raw_days: float, raw_interval_s: int) -> tuple[int, int]:
    """Usage samples generated inside PostgreSQL: one per server and per GPU every `raw_interval_s`
    over the last `raw_days` days (raw samples, not rolled up yet), one a minute before that (rolled up).
    """
    from django.db import connection

    raw_s = int(raw_days * 86400)
    # (start offset s, end offset s, step s) before the current minute: rolled-up history, then raw.
    spans = [(days * 86400, raw_s, 60), (raw_s, 0, raw_interval_s)] if raw_s else [(days * 86400, 0, 60)]
    counts = []
    for table, columns, values, source in (
        (
            "cluster_app_usagesample",
            "server_id, sampled_at, cpu_util_pct, mem_used_gb",
            "s.id, ts, 20 + 70 * random(), s.mem_gb * (0.2 + 0.6 * random())",
            "cluster_app_server s",
        ),
        (
            "cluster_app_gpuusagesample",
            "gpu_id, sampled_at, util_pct, mem_used_mb",
            "g.id, ts, 100 * random(), 16000 * random()",
            "cluster_app_gpu g",
        ),
    ):
        rows = 0
        with connection.cursor() as cursor:
            for first_s, last_s, step_s in spans:
                # The raw span ends at the current minute inclusive; the rolled-up one just before it.
                cursor.execute(
                    f"""
                    INSERT INTO {table} ({columns})
                    SELECT {values}
                    FROM {source},
                         generate_series(date_trunc('minute', now()) - %s * interval '1 second',
                                         date_trunc('minute', now()) - %s * interval '1 second',
                                         %s * interval '1 second') ts
                    WHERE ts < date_trunc('minute', now()) - %s * interval '1 second' OR %s = 0
                    """,
                    [first_s, last_s, step_s, last_s, last_s],
                )
                rows += cursor.rowcount
        counts.append(rows)
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE")
    return counts[0], counts[1]


def seed_usage_minutes() -> int:
    """The per-minute cluster sums the dashboards read, built from the samples by the rebuild service."""
    from django.db import connection

    from cluster_app.services import cluster_usage_minutes_rebuild

    rows = cluster_usage_minutes_rebuild()
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE cluster_app_clusterusageminute")
    return rows


def time_raw_measured(days: int) -> float:
    """ms of the per-sample aggregation the utilisation endpoint ran before the per-minute sums (once,
    GPU and server queries together), for comparison."""
    from django.db import connection
    from django.utils import timezone

    from scheduler_app.dashboards.buckets import window_for

    window = window_for(days=days, now=timezone.now())
    width = window.bucket_s
    start = time.perf_counter()
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT FLOOR(date_part('epoch', sampled_at) / {width})::bigint b, AVG(util_pct) "
            "FROM cluster_app_gpuusagesample WHERE sampled_at >= %s AND sampled_at < %s GROUP BY b",
            [window.start, window.end],
        )
        cursor.fetchall()
        cursor.execute(
            f"SELECT FLOOR(date_part('epoch', u.sampled_at) / {width})::bigint b, "
            "SUM(u.cpu_util_pct * s.num_cpus), SUM(s.num_cpus), SUM(u.mem_used_gb), SUM(s.mem_gb) "
            "FROM cluster_app_usagesample u JOIN cluster_app_server s ON s.id = u.server_id "
            "WHERE u.sampled_at >= %s AND u.sampled_at < %s GROUP BY b",
            [window.start, window.end],
        )
        cursor.fetchall()
    return 1000 * (time.perf_counter() - start)


def seed_work(num_servers: int, num_jobs: int, days: int, seed: int) -> None:
    """Servers, catalog, teams, rounds and jobs with their events and allocations (bulk inserts)."""
    from django.contrib.auth import get_user_model
    from django.utils import timezone

    from cluster_app.models import Gpu
    from profiles_app.models import Workload
    from profiles_app.services.workloads import workload_catalog_load
    from scheduler_app.models import (
        AdmissionPrediction,
        Allocation,
        AllocationGpu,
        Job,
        JobState,
        SchedulingRound,
        SimulationRun,
        SimulationStatus,
        Team,
    )
    from scheduler_app.services.forecasts import job_forecasts_refresh
    from scheduler_app.services.job_lifecycle import jobs_history_insert

    rng = random.Random(seed)
    now = timezone.now()
    servers = servers_create(num_servers, uuid_tag="web")
    gpus_by_server = {s.pk: list(Gpu.objects.filter(server=s).order_by("index")) for s in servers}
    workload_catalog_load()
    workloads = list(Workload.objects.order_by("name"))
    owners = [get_user_model().objects.create_user(f"user{i}", password=None) for i in range(20)]
    teams = [Team.objects.create(name=f"team{i}") for i in range(4)]
    rounds = SchedulingRound.objects.bulk_create(
        SchedulingRound(
            started_at=now - timedelta(minutes=5 * k),
            policy="las" if k % 3 == 0 else "fifo",
            allocator="tune",
            num_runnable=200,
            num_placed=rng.randint(40, 90),
            num_pending=rng.randint(0, 150),
            num_infeasible=rng.randint(0, 3),
        )
        for k in range(days * 24 * 12)
    )
    states, weights = zip(*STATE_MIX, strict=True)
    sizes, size_weights = zip(*GPU_MIX, strict=True)
    histories: list[tuple[Job, list[tuple[str, datetime]]]] = []  # each job with its way through the states
    for n in range(num_jobs):
        state = rng.choices(states, weights)[0]
        submitted = now - timedelta(seconds=rng.uniform(0, days * 86400))
        started = finished = None
        if state != "PENDING":
            started = min(now, submitted + timedelta(seconds=rng.expovariate(1 / 1800)))
        if state in ("COMPLETED", "FAILED", "CANCELLED"):
            finished = min(now, started + timedelta(seconds=rng.expovariate(1 / 20000)))
        qos = rng.random()
        steps = [(JobState.PENDING, submitted)]
        if started is not None:
            steps.append((JobState.RUNNING, started))
        if finished is not None:
            steps.append((state, finished))
        histories.append(
            (
                Job(
                    owner=rng.choice(owners),
                    team=rng.choice(teams),
                    name=f"web-{n}",
                    workload=rng.choice(workloads),
                    num_gpus=rng.choices(sizes, size_weights)[0] if state != "RUNNING" else 1,
                    total_iters=rng.randint(2_000, 200_000),
                    pending_reason="Priority" if state == "PENDING" else "None",
                    submitted_at=submitted,
                    started_at=started,
                    finished_at=finished,
                    qos_deadline_at=submitted + timedelta(hours=rng.uniform(2, 30)) if qos < 0.15 else None,
                    qos_max_latency_s=rng.uniform(3600, 80000) if 0.15 <= qos < 0.3 else None,
                ),
                steps,
            )
        )
    # Through the lifecycle: each job's way is checked against its table and written as its events.
    jobs = jobs_history_insert(histories)
    # Every job was forecast at submission; finished ones have the outcome next to it.
    AdmissionPrediction.objects.bulk_create(
        AdmissionPrediction(
            job=job,
            created_at=job.submitted_at,
            policy="fifo",
            allocator="tune",
            predicted_start_at=job.submitted_at,
            predicted_finish_at=job.submitted_at + timedelta(seconds=rng.expovariate(1 / 20000)),
            attainable=rng.random() < 0.8 if job.qos_deadline_at or job.qos_max_latency_s else None,
            actual_start_at=job.started_at,
            actual_finish_at=job.finished_at,
            met_deadline=(rng.random() < 0.7)
            if job.finished_at and (job.qos_deadline_at or job.qos_max_latency_s)
            else None,
        )
        for job in jobs
    )
    # Allocations: one per started job, on a round near its start; running jobs hold a free GPU each.
    free = [(s.pk, g) for s in servers for g in gpus_by_server[s.pk]]
    rng.shuffle(free)
    allocations, holds = [], []
    for job in jobs:
        if job.started_at is None:
            continue
        running = job.finished_at is None
        if running and not free:
            continue
        if running:
            server_id, gpu = free.pop()
            chosen = [gpu]
        else:
            server_id = rng.choice(servers).pk
            chosen = rng.sample(gpus_by_server[server_id], min(job.num_gpus, 8))
        k = min(len(rounds) - 1, int((now - job.started_at).total_seconds() // 300))
        allocation = Allocation(
            job=job,
            round=rounds[k],
            server_id=server_id,
            num_gpus=len(chosen),
            num_cpus=3 * len(chosen),
            mem_gb=62.5 * len(chosen),
            started_at=job.started_at,
            ended_at=job.finished_at,
            end_reason="" if running else "finished",
        )
        allocations.append(allocation)
        holds.append((allocation, chosen, job.finished_at))
    Allocation.objects.bulk_create(allocations)
    AllocationGpu.objects.bulk_create(
        AllocationGpu(allocation=a, gpu=g, released_at=released)
        for a, chosen, released in holds
        for g in chosen
    )
    # A finished what-if run, for its page and JSON.
    SimulationRun.objects.create(
        status=SimulationStatus.SUCCEEDED,
        progress=1.0,
        parameters={
            "policies": ["fifo"],
            "allocators": ["proportional", "tune"],
            "num_jobs": 200,
            "servers": 16,
        },
        results={
            "runs": [{"policy": "fifo", "allocator": a, "avg_jct_h": 2.0} for a in ("proportional", "tune")]
        },
    )
    # What the last round stored: every live job's forecast and the pending jobs' queue positions.
    refresh_start, refresh_cpu = time.perf_counter(), time.process_time()
    forecasts = job_forecasts_refresh()
    logger.info(
        "forecasts of %d live jobs stored in %.1f s (%.2f s of CPU)",
        forecasts,
        time.perf_counter() - refresh_start,
        time.process_time() - refresh_cpu,
    )
    logger.info(
        "%d servers, %d jobs, %d events, %d allocations, %d rounds",
        len(servers),
        len(jobs),
        sum(len(steps) for _, steps in histories),
        len(allocations),
        len(rounds),
    )


def targets() -> list[tuple[str, str]]:
    """(label, path) of every page to time; user pages only where their URL names resolve."""
    from django.urls import NoReverseMatch, reverse

    from scheduler_app.models import Job, SimulationRun

    job_id = Job.objects.filter(state="RUNNING").values_list("pk", flat=True).first()
    run_id = SimulationRun.objects.values_list("pk", flat=True).first()
    out: list[tuple[str, str]] = []
    for label, name, kwargs in (
        ("user: home", "home", {}),
        ("user: queue", "web:queue", {}),
        ("user: job page", "web:job_detail", {"pk": job_id}),
        ("user: job page", "web:job", {"pk": job_id}),
        ("user: cluster", "web:cluster", {}),
        ("user: submit form", "web:submit", {}),
        ("user: accounting page (30d by user)", "web:accounting", {}),
    ):
        try:
            path = reverse(name, kwargs=kwargs)
        except NoReverseMatch:
            continue
        if all(p != path for _, p in out):
            out.append((label, path))
    try:
        accounting = reverse("accounting")
    except NoReverseMatch:
        accounting = None
    if accounting is not None:
        page = reverse("web:accounting")
        out.append(("user: accounting page (365d by team)", f"{page}?window=365d&by=team"))
        for query in ("window=30d", "window=365d", "window=365d&by=team", "window=365d&format=csv"):
            out.append((f"api accounting {query}", f"{accounting}?{query}"))
    for name in ("index", "utilisation", "jobs", "qos", "queue", "whatif"):
        out.append((f"dashboard page: {name}", reverse(f"dashboards:{name}")))
    out.append(("what-if run page", reverse("dashboards:whatif_run", args=[run_id])))
    out.append(("what-if run json", reverse("dashboards:api_whatif_run", args=[run_id])))
    for name in ("utilisation", "jct", "qos", "admission", "queue"):
        for span in ("1h", "24h", "7d", "30d"):  # windows the dashboards offer (docs/dashboards.md)
            out.append((f"json {name} window={span}", reverse(f"dashboards:api_{name}") + f"?window={span}"))
    return out


def time_get(client: Any, path: str, repeats: int) -> tuple[float, float, float, int, int]:
    """Cold ms (after a warm-up request, with an empty cache), then median and best ms of GET `path`
    over `repeats` after it; status and query count."""
    from django.core.cache import cache
    from django.db import connection

    client.get(path)  # imports, template compilation: once per process, not what is measured
    cache.clear()  # the dashboards keep closed usage buckets in the cache: time a read without them
    start = time.perf_counter()
    response = client.get(path)
    cold_ms = 1000 * (time.perf_counter() - start)
    queries: list[str] = []
    # Counted with an execute wrapper: Django clears its own query log when a request starts.
    with connection.execute_wrapper(lambda execute, sql, *rest: queries.append(sql) or execute(sql, *rest)):
        client.get(path)
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        response = client.get(path)
        samples.append(1000 * (time.perf_counter() - start))
    return cold_ms, statistics.median(samples), min(samples), response.status_code, len(queries)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--servers", type=int, default=16)
    parser.add_argument("--jobs", type=int, default=1000)
    parser.add_argument("--days", type=int, default=7)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--raw-interval-s",
        type=int,
        default=60,
        help="seconds between samples over the last --raw-days (production agents: 5); older: one a minute",
    )
    parser.add_argument("--raw-days", type=float, default=2.0, help="days of raw samples (retention: 2)")
    parser.add_argument(
        "--usage-days",
        type=int,
        default=None,
        help="days of usage samples (default: --days); fewer keep a long --days run small",
    )
    parser.add_argument("--only", default=None, help="time only the requests whose label contains this")
    parser.add_argument("--keep", action="store_true", help="keep the database afterwards")
    args = parser.parse_args()
    logging_setup()
    with bench_database("attune_bench_web", keep=args.keep) as url:
        django_setup(url, DEBUG="0")
        from django.contrib.auth import get_user_model
        from django.test import Client

        start = time.perf_counter()
        seed_work(args.servers, args.jobs, args.days, args.seed)
        raw_days = min(args.raw_days, args.days) if args.raw_interval_s != 60 else 0
        usage_days = min(args.usage_days or args.days, args.days)
        server_rows, gpu_rows = seed_usage(usage_days, min(raw_days, usage_days), args.raw_interval_s)
        seeded_s = time.perf_counter() - start
        minute_rows = seed_usage_minutes()
        logger.info(
            "seeded in %.1f s: %d server and %d GPU usage samples; %d per-minute rows rebuilt in %.1f s",
            seeded_s,
            server_rows,
            gpu_rows,
            minute_rows,
            time.perf_counter() - start - seeded_s,
        )
        for days in (1, 7):
            if args.only is None or args.only in "per-sample aggregation":
                logger.info(
                    "per-sample aggregation (before), days=%d: %.0f ms", days, time_raw_measured(days)
                )
        staff = get_user_model().objects.create_user("staff", password=None, is_staff=True, is_superuser=True)
        client = Client()
        client.force_login(staff)
        base_cold, base_ms, base_best, _, base_queries = time_get(client, "/healthz", args.repeats)
        rows: list[list[Any]] = [
            ["GET /healthz (baseline)", 200, base_queries, base_cold, base_ms, base_best, 1.0, "ok"]
        ]
        slow = []
        for label, path in targets():
            if args.only is not None and args.only not in label:
                continue
            cold_ms, median_ms, best_ms, status, queries = time_get(client, path, args.repeats)
            ok = status == 200 and median_ms < BUDGET_MS
            if not ok:
                slow.append(label)
            verdict = "ok" if ok else "SLOW"
            if ok and cold_ms >= BUDGET_MS:
                verdict = "ok (cold over)"
            rows.append([label, status, queries, cold_ms, median_ms, best_ms, median_ms / base_ms, verdict])
        headers = ["request", "status", "queries", "cold ms", "median ms", "best ms", "x healthz", "verdict"]
        print_table(headers, rows)
    if slow:
        print(f"over budget or failed: {', '.join(slow)}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
