"""Submissions a second against a deep queue: N clients submitting single jobs through the API for a fixed
time, with the service as the image runs it, beside /healthz at the same concurrency in the same run.

Run: `python -m bench.submit_rate [--clients 4] [--queued 10000] [--servers 500] [--seconds 60]`.

A fresh PostgreSQL database; `--servers` servers of 8 GPUs registered (no agents: their leases never
start, so the queue stays as deep as it was filled; the liveness sweep is told to wait a day), the
catalog, one user with an API token; gunicorn (config/gunicorn.conf.py), a Celery worker with beat
(rounds) and `--forecasts-processes` (2, as docker-compose.yml runs them) of the `forecasts` queue (the
refresh after rounds, the admission forecasts), started as bench.agent_fleet starts them, on a Redis
database of its own (flushed first). The queue is filled
through the API with arrays of up to 1,000 tasks (each array's time to its 201 is printed: one request
per array), and the bench waits until the forecasts worker has answered their admission.

Then, in the same run: `--clients` threads GET /healthz in a closed loop for `--baseline-seconds` (the
baseline), and the same number of threads POST single catalog jobs for `--seconds`, while a probe GETs
/healthz every 50 ms and a monitor reads, every 0.25 s, which submitted jobs' admission predictions
have been filled. Printed: requests a second, p50/p99 and errors of both; every submission stored once
(201s == the jobs stored under the bench's names, no id twice); the forecast's lag (from sending the
submission to its prediction being filled: in the 201 when it came ready in time, else the monitor's
first sight), with how many got a predicted start; the CPU of each part of the stack over the window
(bench/cpu_shares.py; PostgreSQL's and Redis's are every such process on the machine); and the
forecast refresh of the live queue in one call, timed in this process after the window (CPU and wall,
median of 3; the worker's refresh in parts is bench.forecast_refresh's).
Exits 1 when a target is missed: at least `--min-rate` submissions a second, p99 under `--p99-ms`,
each stored once, each prediction filled within `--lag-s`.
"""

from __future__ import annotations

import argparse
import random
import statistics
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import httpx

from bench.common import print_table
from bench.cpu_shares import CpuShares
from bench.live_common import bench_database, django_setup, logger, logging_setup, percentile, servers_create
from bench.live_service import REPO_ROOT, processes, service_env

API_JOBS = "/api/v1/jobs/"
GPU_MIX = (1, 1, 1, 2, 4, 8)
MONITOR_S = 0.25
PROBE_S = 0.05


@dataclass
class Calls:
    """What one closed loop saw: each call's start (monotonic), latency and status."""

    started: list[float] = field(default_factory=list)
    latencies_s: list[float] = field(default_factory=list)
    statuses: Counter = field(default_factory=Counter)
    errors: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, started: float, latency_s: float, status: int | str) -> None:
        with self.lock:
            self.started.append(started)
            self.latencies_s.append(latency_s)
            self.statuses[status] += 1
            if status not in (200, 201):
                self.errors += 1


@dataclass
class Submitted:
    """The bench's submissions: job id -> when it was sent, and when its prediction was first filled."""

    sent_at: dict[int, float] = field(default_factory=dict)
    filled_at: dict[int, float] = field(default_factory=dict)
    in_answer: set[int] = field(default_factory=set)  # filled in their 201 (behind the window...)
    ids_seen: list[int] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)


def seed(num_servers: int) -> tuple[str, list[str]]:
    """Servers, the catalog, a user; returns the user's API token and the catalog's names."""
    from django.contrib.auth import get_user_model
    from rest_framework.authtoken.models import Token

    from profiles_app.models import Workload
    from profiles_app.services.workloads import workload_catalog_load

    servers_create(num_servers, uuid_tag="rate")
    workload_catalog_load()
    user = get_user_model().objects.create_user("rate", password=None)
    return Token.objects.create(user=user).key, list(
        Workload.objects.order_by("name").values_list("name", flat=True)
    )


def fill_queue(http: httpx.Client, queued: int, workloads: list[str], rng: random.Random) -> list[float]:
    """Queue `queued` jobs as arrays of up to 1,000 tasks through the API; each array's seconds to its 201."""
    seconds = []
    n = 0
    while n < queued:
        tasks = min(1000, queued - n)
        body = {
            "name": f"fill-{n}",
            "workload": rng.choice(workloads),
            "num_gpus": rng.choice(GPU_MIX),
            "total_iters": rng.randint(20_000, 2_000_000),
            "array": f"0-{tasks - 1}",
        }
        start = time.perf_counter()
        response = http.post(API_JOBS, json=body, timeout=120)
        seconds.append(time.perf_counter() - start)
        if response.status_code != 201:
            raise RuntimeError(f"an array was refused: {response.status_code} {response.text[:300]}")
        n += tasks
    return seconds


@contextmanager
def more_forecasts_workers(env: dict[str, str], count: int) -> Iterator[dict[str, int]]:
    """`count` more processes of the `forecasts` queue beside bench.agent_fleet's one, niced as it is:
    docker-compose.yml runs that worker with two (`--concurrency 2`), so that an admission forecast
    need not wait for a refresh of the whole queue in progress. Yields their pids by part."""
    procs = []
    for i in range(count):
        command = ["nice", "-n", "10", sys.executable, "-m", "celery", "-A", "config", "worker", "-Q",
                   "forecasts", "--pool", "solo", "--loglevel", "WARNING", "--without-gossip",
                   "--without-mingle", "-n", f"forecasts{i + 2}@%h"]  # fmt: skip
        out = subprocess.DEVNULL
        procs.append(subprocess.Popen(command, cwd=REPO_ROOT, env=env, stdout=out, stderr=out))
    try:
        yield {f"forecasts {i + 2}": proc.pid for i, proc in enumerate(procs)}
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()


def pending_predictions() -> int:
    from scheduler_app.models import AdmissionPrediction
    from scheduler_app.services.admission_worker import FORECAST_PENDING

    return AdmissionPrediction.objects.filter(detail=FORECAST_PENDING).count()


def settle(timeout_s: float) -> float:
    """Wait until no admission prediction is pending (the forecasts worker has answered the fill's);
    returns the seconds waited."""
    start = time.monotonic()
    while pending_predictions() and time.monotonic() - start < timeout_s:
        time.sleep(1)
    return time.monotonic() - start


def closed_loop(
    base_url: str, token: str, clients: int, seconds: float, call, calls: Calls
) -> tuple[float, float]:
    """`clients` threads each calling `call(http, client, n)` back to back for `seconds`; returns the
    window (monotonic start, end)."""
    stop_at = time.monotonic() + seconds

    def loop(client: int) -> None:
        with httpx.Client(base_url=base_url, headers={"Authorization": f"Token {token}"}, timeout=60) as http:
            n = 0
            while time.monotonic() < stop_at:
                start = time.monotonic()
                try:
                    status = call(http, client, n)
                except httpx.HTTPError as exc:
                    status = type(exc).__name__
                calls.add(start, time.monotonic() - start, status)
                n += 1

    start = time.monotonic()
    threads = [threading.Thread(target=loop, args=(c,), daemon=True) for c in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return start, time.monotonic()


def submitter(workloads: list[str], submitted: Submitted):
    """The submission call: one catalog job; its id and send time recorded, and its prediction's
    filling when the 201 already has it."""
    from scheduler_app.services.admission_worker import FORECAST_PENDING

    def call(http: httpx.Client, client: int, n: int) -> int:
        rng = random.Random(client * 1_000_003 + n)
        body = {
            "name": f"rate-{client}-{n}",
            "workload": rng.choice(workloads),
            "num_gpus": rng.choice(GPU_MIX),
            "total_iters": rng.randint(20_000, 2_000_000),
        }
        sent = time.monotonic()
        response = http.post(API_JOBS, json=body)
        if response.status_code == 201:
            answer = response.json()
            done = time.monotonic()
            with submitted.lock:
                submitted.ids_seen.append(answer["id"])
                submitted.sent_at[answer["id"]] = sent
                if (answer.get("admission") or {}).get("detail") != FORECAST_PENDING:
                    submitted.filled_at[answer["id"]] = done
                    submitted.in_answer.add(answer["id"])
        return response.status_code

    return call


def monitor(submitted: Submitted, stop: threading.Event) -> None:
    """Every MONITOR_S, the submitted jobs whose prediction has been filled since."""
    from django.db import connection

    from scheduler_app.models import AdmissionPrediction
    from scheduler_app.services.admission_worker import FORECAST_PENDING

    try:
        while not stop.is_set():
            with submitted.lock:
                waiting = [j for j in submitted.sent_at if j not in submitted.filled_at]
            if waiting:
                filled = AdmissionPrediction.objects.filter(job_id__in=waiting).exclude(
                    detail=FORECAST_PENDING
                )
                seen = time.monotonic()
                ids = list(filled.values_list("job_id", flat=True))
                with submitted.lock:
                    submitted.filled_at.update(dict.fromkeys(ids, seen))
            stop.wait(MONITOR_S)
    finally:
        connection.close()


def probe(base_url: str, stop: threading.Event, calls: Calls) -> None:
    """/healthz every PROBE_S while the submissions run: the web tier's answer to everyone else."""
    with httpx.Client(base_url=base_url, timeout=30) as http:
        while not stop.is_set():
            start = time.monotonic()
            try:
                status: int | str = http.get("/healthz").status_code
            except httpx.HTTPError as exc:
                status = type(exc).__name__
            calls.add(start, time.monotonic() - start, status)
            stop.wait(PROBE_S)


def refresh_cost(repeats: int = 3) -> tuple[int, float, float]:
    """The forecast refresh of the live queue in one call (as the embedded mode runs it; the forecasts
    worker plays the same forecast in parts of bounded CPU, timed by bench.forecast_refresh): live
    jobs, median CPU seconds and median wall seconds."""
    from scheduler_app.models import Job, JobState
    from scheduler_app.services.forecasts import job_forecasts_refresh

    cpu, wall = [], []
    for _ in range(repeats):
        start, start_cpu = time.perf_counter(), time.process_time()
        job_forecasts_refresh()
        cpu.append(time.process_time() - start_cpu)
        wall.append(time.perf_counter() - start)
    live = Job.objects.filter(state__in=[JobState.PENDING, JobState.RUNNING]).count()
    return live, statistics.median(cpu), statistics.median(wall)


def stored_once(submitted: Submitted, accepted: int) -> tuple[bool, int]:
    """Whether every 201 is one stored job and nothing else was stored; the jobs stored."""
    from scheduler_app.models import Job

    stored = set(Job.objects.filter(name__startswith="rate-").values_list("pk", flat=True))
    ids = submitted.ids_seen
    return stored == set(ids) and len(ids) == len(set(ids)) == accepted, len(stored)


def rate_row(label: str, calls: Calls, since: float, until: float) -> list:
    inside = [lat for at, lat in zip(calls.started, calls.latencies_s, strict=True) if since <= at <= until]
    return [
        label,
        len(inside),
        f"{len(inside) / max(1e-9, until - since):.1f}",
        f"{1000 * percentile(inside, 50):.1f}",
        f"{1000 * percentile(inside, 99):.1f}",
        f"{1000 * max(inside, default=float('nan')):.0f}",
        calls.errors,
    ]


def arguments(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--queued", type=int, default=10_000, help="jobs queued before the window")
    parser.add_argument("--servers", type=int, default=500, help="servers of 8 GPUs (500 agents' worth)")
    parser.add_argument("--seconds", type=float, default=60.0, help="the submissions' window")
    parser.add_argument("--baseline-seconds", type=float, default=10.0)
    parser.add_argument(
        "--drain-s", type=float, default=30.0, help="how long to wait for the last predictions"
    )
    parser.add_argument("--settle-s", type=float, default=300.0, help="most to wait for the fill's forecasts")
    parser.add_argument("--min-rate", type=float, default=100.0)
    parser.add_argument("--p99-ms", type=float, default=250.0)
    parser.add_argument("--lag-s", type=float, default=10.0)
    parser.add_argument("--workers", type=int, default=None, help="gunicorn workers (default: its config's)")
    parser.add_argument(
        "--forecasts-processes", type=int, default=2,
        help="processes of the forecasts worker (docker-compose.yml's --concurrency: 2)",
    )  # fmt: skip
    parser.add_argument("--db", default="attune_bench_submit_rate", help="database to create and drop")
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/13", help="flushed first")
    parser.add_argument("--seed", type=int, default=7)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    import redis

    args = arguments(argv)
    logging_setup()
    redis.Redis.from_url(args.redis_url).flushdb()
    with bench_database(args.db) as url:
        env = {
            **service_env(url, args.redis_url, 10.0),
            # No agents: the servers must not be declared lost while the bench runs, nor their leases.
            "ATTUNE_NODE_NOT_RESPONDING_AFTER_S": "86400",
            "ATTUNE_NODE_DOWN_AFTER_S": "864000",
            "ATTUNE_LEASE_FENCE_S": "86400",
        }
        django_setup(
            url, **{k: v for k, v in env.items() if k.startswith(("ATTUNE_", "REDIS", "CELERY", "CACHE"))}
        )
        token, workloads = seed(args.servers)
        with (
            processes(env, workers=args.workers) as (base_url, pids),
            more_forecasts_workers(env, args.forecasts_processes - 1) as more,
        ):
            pids = {**pids, **more}
            headers = {"Authorization": f"Token {token}"}
            with httpx.Client(base_url=base_url, headers=headers) as http:
                arrays_s = fill_queue(http, args.queued, workloads, random.Random(args.seed))
            logger.info(
                "%d jobs queued as %d arrays: %s s each",
                args.queued, len(arrays_s), ", ".join(f"{s:.2f}" for s in arrays_s),
            )  # fmt: skip
            logger.info("fill's admission forecasts answered after %.0f s", settle(args.settle_s))
            healthz = Calls()
            base = closed_loop(
                base_url, token, args.clients, args.baseline_seconds,
                lambda http, c, n: http.get("/healthz").status_code, healthz,
            )  # fmt: skip
            submitted, submissions, probes = Submitted(), Calls(), Calls()
            stop = threading.Event()
            helpers = [
                threading.Thread(target=monitor, args=(submitted, stop), daemon=True),
                threading.Thread(target=probe, args=(base_url, stop, probes), daemon=True),
            ]
            for thread in helpers:
                thread.start()
            shares = CpuShares(pids)
            wall = time.time()
            window = closed_loop(
                base_url, token, args.clients, args.seconds, submitter(workloads, submitted), submissions
            )
            cores = shares.cores(wall, time.time())
            deadline = time.monotonic() + args.drain_s
            while time.monotonic() < deadline and len(submitted.filled_at) < len(submitted.sent_at):
                time.sleep(MONITOR_S)
            stop.set()
            for thread in helpers:
                thread.join()
            shares.stop()
            once, stored = stored_once(submitted, submissions.statuses[201])
            predicted = _predicted_starts(list(submitted.sent_at))
            by_worker = _worker_answers([j for j in submitted.sent_at if j not in submitted.in_answer])
        live, refresh_cpu_s, refresh_wall_s = refresh_cost()
        from django.db import connections

        connections.close_all()
    lags = [
        submitted.filled_at[j] - sent for j, sent in submitted.sent_at.items() if j in submitted.filled_at
    ]
    unfilled = len(submitted.sent_at) - len(lags)
    late = sum(1 for lag in lags if lag > args.lag_s) + unfilled
    print(f"\n{args.queued} queued on {args.servers} x 8 GPUs, {args.clients} clients (machine shared)\n")
    print_table(
        ["calls", "n", "per s", "p50 ms", "p99 ms", "max ms", "errors"],
        [
            rate_row("GET /healthz (baseline, closed loop)", healthz, *base),
            rate_row("POST /api/v1/jobs/ (single job)", submissions, *window),
            rate_row("GET /healthz every 50 ms meanwhile", probes, *window),
        ],
    )
    accepted = submissions.statuses[201]
    rate = accepted / max(1e-9, window[1] - window[0])
    p99_ms = 1000 * percentile(submissions.latencies_s, 99)
    print(
        f"\nsubmissions stored once: {'yes' if once else 'NO'} ({accepted} accepted, {stored} stored; "
        f"statuses {dict(submissions.statuses)})"
    )
    print(
        f"forecast lag (sent -> prediction filled): p50 {percentile(lags, 50):.2f} s, "
        f"p99 {percentile(lags, 99):.2f} s, max {max(lags, default=float('nan')):.2f} s; "
        f"{late} over {args.lag_s:g} s ({unfilled} never filled); "
        f"{predicted} of {len(submitted.sent_at)} with a predicted start"
    )
    worker = [
        submitted.filled_at[j] - sent
        for j, sent in submitted.sent_at.items()
        if j in submitted.filled_at and j not in submitted.in_answer
    ]
    print(
        f"answered in their 201: {len(submitted.in_answer)}; by the forecasts worker: {len(worker)}, "
        f"lag p50 {percentile(worker, 50):.2f} s, p99 {percentile(worker, 99):.2f} s"
    )
    print(
        "the worker's answers: " + (", ".join(f"{n} {what}" for what, n in by_worker.most_common()) or "none")
    )
    print(
        f"arrays of 1,000 accepted in: median {statistics.median(arrays_s):.2f} s, max {max(arrays_s):.2f} s"
    )
    print(
        f"forecast refresh of {live} live jobs in one call: {refresh_cpu_s:.2f} s CPU, {refresh_wall_s:.2f} s"
        " wall (median of 3; the worker's parts: bench.forecast_refresh)"
    )
    print("CPU over the window (cores): " + ", ".join(f"{part} {c:.2f}" for part, c in sorted(cores.items())))
    if accepted and "web" in cores:
        # The baseline's /healthz ran before the window; the probe's 20 a second are counted in.
        web_ms = 1000 * cores["web"] / rate
        print(f"web tier's CPU a submission: {web_ms:.1f} ms (the probe's /healthz included)")
    met = rate >= args.min_rate and p99_ms < args.p99_ms and once and late == 0
    print(f"\ntargets ({args.min_rate:g}/s, p99 < {args.p99_ms:g} ms, stored once, lag <= {args.lag_s:g} s): "
          f"{'met' if met else 'NOT met'}")  # fmt: skip
    return 0 if met else 1


def _worker_answers(job_ids: list[int]) -> Counter:
    """What the forecasts worker told these jobs: a predicted start (and finish, or not), cut short by
    its budget ("not started within 2 s of forecasting"), or another detail (its first words)."""
    from scheduler_app.models import AdmissionPrediction

    kinds: Counter = Counter()
    rows = AdmissionPrediction.objects.filter(job_id__in=job_ids)
    for start, finish, detail in rows.values_list("predicted_start_at", "predicted_finish_at", "detail"):
        if start is not None:
            kinds["with a predicted start" + ("" if finish is not None else ", no finish")] += 1
        elif "of forecasting" in detail:
            kinds["cut short by the budget"] += 1
        else:
            kinds[detail.split(" (")[0][:60] or "(no detail)"] += 1
    return kinds


def _predicted_starts(job_ids: list[int]) -> int:
    from scheduler_app.models import AdmissionPrediction

    return AdmissionPrediction.objects.filter(job_id__in=job_ids, predicted_start_at__isnull=False).count()


if __name__ == "__main__":
    sys.exit(main())
