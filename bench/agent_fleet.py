"""The control plane under a fleet: N emulated node agents at the production intervals, open loop, on
the web tier as the image runs it, with leases running and rounds happening.

Run: `python -m bench.agent_fleet --agents 500` or `python -m bench.agent_fleet --find-max`.

Per fleet size: a fresh PostgreSQL database; N servers (8 GPUs, 24 cores, 500 GB) with agent tokens;
jobs submitted to fill the GPUs and keep a queue (catalog workloads, 0.5 to 42 minutes of work at the
emulated speed: ten times the reference trace's churn; --stress: 1 to 5 minutes, a hundred times it;
or --job-minutes); gunicorn started with config/gunicorn.conf.py (uvicorn workers,
config.asgi), a Celery worker with beat (rounds every ATTUNE_ROUND_S, early rounds when jobs end)
and one of the `forecasts` queue (the forecast refresh after rounds), on a Redis database of its own.
First the baseline: GET /healthz at the fleet's request rate, open loop. Then the fleet, one asyncio process:
each agent registers, then syncs every --interval seconds (jittered +-10 %, each on its own schedule:
a slow answer does not delay its next sync), long-polls between syncs and syncs at once when woken or
when a lease started or exited. Each sync carries the usage
sample (8 GPUs), a progress report per running lease and every report not yet acknowledged; start,
preempt and cancel commands are obeyed (a started lease is reported, a finished one exits 0).

Printed: p50/p99 per call kind (a sync's time to answer; the wait's deliberate hold is not a
latency), errors, reports stored == reports sent (each exactly once), the delay from a round's
commit to its start commands reaching the agents (p50/p99), the rounds' duration under that load, the
ratio to /healthz, and the CPU of each part of the stack over the window (bench/cpu_shares.py), with
the web tier's and PostgreSQL's per sync; with `--timeline`, each second's syncs, their p50/p99 and the
rounds that started in it. `--find-max` raises N by --step until the p99 of a sync passes --p99-ms,
the start commands' p99 passes --delivery-p99-s, a report is not stored exactly once or an error
appears, and prints the largest N that held. Each line also prints the churn the window really had:
job ends a second, and that per 100 servers as a multiple of the reference trace's.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import sys
from dataclasses import dataclass
from datetime import UTC, datetime
from io import StringIO

from bench.common import print_table
from bench.cpu_shares import CpuShares
from bench.fleet_agents import ITERS_PER_S, FleetStats, healthz_baseline, run_fleet
from bench.live_common import bench_database, django_setup, logger, logging_setup, percentile
from bench.live_service import processes, service_env

JOB_GPUS = (1, 1, 2, 4, 1, 2)  # per server: the first four fill its 8 GPUs, the rest wait in the queue
# Their length at that speed. Four jobs run per server, so uniform lengths in (a, b) minutes end
# 4 / (b - a) jobs per server-minute from the first a minutes on. The default, (0.5, 42), ends 0.16 a
# second per 100 servers of 8 GPUs: ten times the Synergy reference's Philly-derived trace (36 jobs an
# hour on 512 GPUs, 0.016 a second per 100 servers; tests/data/synergy/README.md), which is the
# order of a large production datacenter's average (SenseTime's Helios: 1.58 million GPU jobs in six
# months on four clusters of about 6,400 GPUs, some 30 an hour per 512 GPUs). So the default is a busy
# hour of a busy cluster, with margin. STRESS_JOB_MINUTES, (1, 5), ends 1.7 a second per 100 servers,
# a hundred times the reference: a stress for finding where the control plane breaks, not a workload.
DEFAULT_JOB_MINUTES = (0.5, 42.0)
STRESS_JOB_MINUTES = (1.0, 5.0)
REFERENCE_JOB_ENDS_PER_S_PER_100 = 36 / 3600 * 800 / 512  # 36 an hour on 512 GPUs, per 100 servers of 8
DEFAULT_REDIS = "redis://127.0.0.1:6379/14"


def seed(num_servers: int, job_minutes: tuple[float, float] = DEFAULT_JOB_MINUTES) -> list[str]:
    """N servers with tokens (`manage.py node_token`), and jobs to fill and queue, each `job_minutes`
    long (uniform between the two); returns the tokens."""
    from django.contrib.auth import get_user_model
    from django.core.management import call_command

    from profiles_app.models import Workload
    from profiles_app.services.workloads import workload_catalog_load
    from scheduler_app.services.jobs import JobRequest, job_submit

    tokens = []
    for i in range(num_servers):
        out = StringIO()
        call_command("node_token", f"fleet{i:04d}", stdout=out, stderr=StringIO())
        tokens.append(out.getvalue().strip())
    workload_catalog_load()
    workloads = list(Workload.objects.order_by("name"))
    owner = get_user_model().objects.create_user("fleet", password=None)
    rng = random.Random(1)
    n = 0
    for _ in range(num_servers):
        for gpus in JOB_GPUS:
            # Admission off: the fleet's queue is filled before the stack's rounds start.
            job_submit(
                admission=False,
                owner=owner,
                request=JobRequest(
                    name=f"fleet-{n}",
                    num_gpus=gpus,
                    total_iters=int(ITERS_PER_S * 60 * rng.uniform(*job_minutes)),
                    workload=workloads[n % len(workloads)],
                ),
            )
            n += 1
    logger.info("%d servers with tokens, %d jobs submitted", num_servers, n)
    return tokens


# ---------------------------------------------------------------------------------------------------
# What the database says
# ---------------------------------------------------------------------------------------------------


def delivery_delays(stats: FleetStats) -> tuple[list[float], list[float]]:
    """Seconds from the commit of the round that created a lease to its start command at the agent,
    for the rounds that committed in the measured window (before it the agents were still starting
    up, each waiting a random part of an interval before its first sync, on purpose): the leases that
    are their job's first, and those of jobs placed again (moved or preempted before), whose start
    waits for the old process's exit."""
    from datetime import timedelta

    from django.db.models import Exists, OuterRef

    from scheduler_app.models import Allocation

    earlier = Allocation.objects.filter(job_id=OuterRef("job_id"), started_at__lt=OuterRef("started_at"))
    rows = (
        Allocation.objects.filter(lease_id__in=list(stats.starts_received), round__isnull=False)
        .annotate(again=Exists(earlier))
        .values_list("lease_id", "round__started_at", "round__duration_ms", "again")
    )
    since, until = stats.measured
    first, again = [], []
    for lease_id, started_at, duration_ms, placed_again in rows:
        committed = (started_at + timedelta(milliseconds=duration_ms)).timestamp()
        if since <= committed <= until:
            delay = max(0.0, stats.starts_received[str(lease_id)] - committed)
            (again if placed_again else first).append(delay)
    return first, again


def job_ends_in(since: float, until: float) -> int:
    """Jobs that ended (any terminal state) in the window: the churn the fleet really had."""
    from scheduler_app.models import Job

    start, end = datetime.fromtimestamp(since, tz=UTC), datetime.fromtimestamp(until, tz=UTC)
    return Job.objects.filter(finished_at__gte=start, finished_at__lt=end).count()


def round_durations_ms(since: float, until: float) -> list[float]:
    from scheduler_app.models import SchedulingRound

    start, end = datetime.fromtimestamp(since, tz=UTC), datetime.fromtimestamp(until, tz=UTC)
    rounds = SchedulingRound.objects.filter(started_at__gte=start, started_at__lt=end)
    return list(rounds.values_list("duration_ms", flat=True))


def timeline_print(stats: FleetStats, since: float, until: float) -> None:
    """Per second of the window: syncs sent, their p50/p99, and the rounds that started then (trigger,
    duration, placed, preempted): where a p99 comes from."""
    from scheduler_app.models import SchedulingRound

    start, end = datetime.fromtimestamp(since, tz=UTC), datetime.fromtimestamp(until, tz=UTC)
    rounds: dict[int, list[str]] = {}
    for r in SchedulingRound.objects.filter(started_at__gte=start, started_at__lt=end).order_by("started_at"):
        second = int(r.started_at.timestamp() - since)
        rounds.setdefault(second, []).append(
            f"{r.trigger} {r.duration_ms:.0f} ms, {r.num_placed} placed, {r.num_preempted} preempted"
        )
    per_second: dict[int, list[float]] = {}
    for sent_at, seconds in stats.sync_times:
        per_second.setdefault(int(sent_at - since), []).append(seconds)
    rows = [
        [
            second,
            len(per_second.get(second, [])),
            f"{percentile(per_second.get(second, [0.0]), 50) * 1000:.0f}",
            f"{percentile(per_second.get(second, [0.0]), 99) * 1000:.0f}",
            "; ".join(rounds.get(second, [])),
        ]
        for second in range(int(until - since) + 1)
    ]
    print_table(["s", "syncs", "p50 ms", "p99 ms", "rounds started"], rows)


def stored_reports() -> set[tuple[str, int]]:
    from scheduler_app.models import AgentReport

    return {(str(lease_id), seq) for lease_id, seq in AgentReport.objects.values_list("lease_id", "seq")}


@dataclass
class FleetResult:
    agents: int
    sync_p50_ms: float
    sync_p99_ms: float
    syncs_per_s: float
    errors: int
    healthz_p50_ms: float
    healthz_p99_ms: float
    delivery_p50_s: float
    delivery_p99_s: float
    deliveries: int
    round_p50_ms: float
    round_p99_ms: float
    rounds: int
    reports_sent: int
    reports_stored: int
    stored_once: bool
    cores: dict[str, float]  # part of the stack -> average cores over the window (bench/cpu_shares.py)
    job_ends_per_s: float  # jobs ended per second in the window, all servers

    def churn_x_reference(self) -> float:
        """The window's job ends per 100 servers, as a multiple of the reference trace's rate."""
        per_100 = self.job_ends_per_s * 100 / max(1, self.agents)
        return per_100 / REFERENCE_JOB_ENDS_PER_S_PER_100

    def cpu_ms_per_sync(self, part: str) -> float:
        """That part's CPU per sync in the window: what a change to the service's code moves."""
        return self.cores.get(part, float("nan")) * 1000 / max(1e-9, self.syncs_per_s)

    def holds(self, p99_ms: float, delivery_p99_s: float) -> bool:
        """The issue's bar: no error, a sync's p99 under `p99_ms`, every report stored once, and start
        commands at the agents within `delivery_p99_s` of their round's commit (p99; a window in which
        no round placed anything has no delivery to miss)."""
        delivered = self.deliveries == 0 or self.delivery_p99_s < delivery_p99_s
        return self.errors == 0 and self.sync_p99_ms < p99_ms and self.stored_once and delivered


def measure(num_agents: int, args: argparse.Namespace) -> FleetResult:
    import redis

    redis.Redis.from_url(args.redis_url).flushdb()
    with bench_database(args.db, keep=args.keep) as url:
        django_setup(url)
        tokens = seed(num_agents, tuple(args.job_minutes))
        env = service_env(url, args.redis_url, args.interval)
        with processes(env, workers=args.workers) as (base_url, pids):
            rate = num_agents / args.interval
            base, base_errors = asyncio.run(healthz_baseline(base_url, rate, args.baseline_seconds))
            shares = CpuShares(pids, database=args.db)  # other databases' sessions left out
            try:
                stats = asyncio.run(run_fleet(tokens, base_url, args))
            finally:
                shares.stop()
        since, until = stats.measured
        cores = shares.cores(since, until)
        syncs = stats.latencies["sync"]
        first_starts, restarts = delivery_delays(stats)
        delays = first_starts + restarts
        if delays:
            logger.info(
                "start delivery: %d first leases p50 %.2f / p99 %.2f s; "
                "%d of jobs placed again p50 %.2f / p99 %.2f s",
                len(first_starts), percentile(first_starts, 50), percentile(first_starts, 99),
                len(restarts), percentile(restarts, 50), percentile(restarts, 99),
            )  # fmt: skip
        rounds = round_durations_ms(since, until)
        if args.timeline:
            timeline_print(stats, since, until)
        stored = stored_reports()
        acked = stats.acked
        result = FleetResult(
            agents=num_agents,
            sync_p50_ms=percentile(syncs, 50) * 1000,
            sync_p99_ms=percentile(syncs, 99) * 1000,
            syncs_per_s=len(syncs) / max(1e-9, until - since),
            errors=sum(stats.errors.values()) + base_errors,
            healthz_p50_ms=percentile(base, 50) * 1000,
            healthz_p99_ms=percentile(base, 99) * 1000,
            delivery_p50_s=percentile(delays, 50),
            delivery_p99_s=percentile(delays, 99),
            deliveries=len(delays),
            round_p50_ms=percentile(rounds, 50),
            round_p99_ms=percentile(rounds, 99),
            rounds=len(rounds),
            reports_sent=len(stats.sent),
            reports_stored=len(stored),
            # Every report sent was acknowledged and stored, and nothing else was stored (the unique
            # (lease_id, seq) constraint makes each row one report).
            stored_once=stored == stats.sent and acked == stats.sent and stats.unsent == 0,
            cores=cores,
            job_ends_per_s=job_ends_in(since, until) / max(1e-9, until - since),
        )
        if stats.errors:
            logger.warning("errors: %s", dict(stats.errors))
        if not result.stored_once:
            logger.warning(
                "reports: %d sent, %d acknowledged, %d stored, %d still unsent at the end; "
                "sent but not stored: %d, stored but not sent: %d",
                len(stats.sent), len(acked), len(stored), stats.unsent,
                len(stats.sent - stored), len(stored - stats.sent),
            )  # fmt: skip
        from django.db import connections

        connections.close_all()  # the database is dropped next
        return result


def print_results(results: list[FleetResult], p99_ms: float, delivery_p99_s: float) -> None:
    print_table(
        [
            "agents", "syncs/s", "sync p50 ms", "sync p99 ms", "healthz p50 ms", "healthz p99 ms",
            "p50 / healthz", "errors", "reports sent", "stored", "once", "start delivery p50 s",
            "p99 s", "n", "round p50 ms", "round p99 ms", "rounds", "web cpu ms/sync", "db cpu ms/sync",
            "cores web/db/rounds/forecasts/redis/bench", "job ends/s", "x reference", "verdict",
        ],
        [
            [
                r.agents, f"{r.syncs_per_s:.1f}", f"{r.sync_p50_ms:.1f}", f"{r.sync_p99_ms:.1f}",
                f"{r.healthz_p50_ms:.1f}", f"{r.healthz_p99_ms:.1f}",
                f"{r.sync_p50_ms / r.healthz_p50_ms:.1f}x", r.errors, r.reports_sent, r.reports_stored,
                "yes" if r.stored_once else "NO", f"{r.delivery_p50_s:.2f}", f"{r.delivery_p99_s:.2f}",
                r.deliveries, f"{r.round_p50_ms:.0f}", f"{r.round_p99_ms:.0f}", r.rounds,
                f"{r.cpu_ms_per_sync('web'):.1f}", f"{r.cpu_ms_per_sync('postgres'):.1f}",
                "/".join(f"{r.cores.get(part, float('nan')):.2f}"
                         for part in ("web", "postgres", "rounds", "forecasts", "redis", "bench")),
                f"{r.job_ends_per_s:.2f}", f"{r.churn_x_reference():.1f}",
                "ok" if r.holds(p99_ms, delivery_p99_s) else "over",
            ]
            for r in results
        ],
    )  # fmt: skip


def arguments(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line, with --stress and the default warm-up (from the churn) applied."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--agents", type=int, default=500)
    parser.add_argument("--interval", type=float, default=10.0, help="seconds between an agent's syncs")
    parser.add_argument("--seconds", type=float, default=60.0, help="measured time")
    parser.add_argument(
        "--warmup",
        type=float,
        default=None,
        help="unmeasured seconds after the agents registered (default: until the first jobs can have"
        " ended, plus an interval, so that the window has the churn asked for; at least 20)",
    )
    parser.add_argument("--baseline-seconds", type=float, default=10.0)
    parser.add_argument("--workers", type=int, default=None, help="web processes (default: the image's)")
    parser.add_argument("--redis-url", default=DEFAULT_REDIS, help="a Redis database the bench may flush")
    parser.add_argument("--find-max", action="store_true", help="raise --agents by --step while it holds")
    parser.add_argument("--step", type=int, default=250)
    parser.add_argument("--max-agents", type=int, default=3000)
    parser.add_argument("--p99-ms", type=float, default=250.0, help="a sync's p99 that holds")
    parser.add_argument(
        "--delivery-p99-s",
        type=float,
        default=2.0,
        help="start commands' p99 from their round's commit that holds",
    )
    parser.add_argument("--keep", action="store_true", help="keep the database afterwards")
    parser.add_argument("--db", default="attune_bench_fleet", help="the bench's database (created afresh)")
    parser.add_argument(
        "--timeline", action="store_true", help="print each second's syncs, p50/p99 and rounds started"
    )
    parser.add_argument(
        "--job-minutes",
        type=float,
        nargs=2,
        default=list(DEFAULT_JOB_MINUTES),
        metavar=("MIN", "MAX"),
        help="length of the fleet's jobs (default 0.5 42: 0.16 job ends a second per 100 servers, ten"
        " times the Philly-derived reference trace's rate; 1 5: a hundred times it, a stress; 30 240:"
        " no job ends in a short run)",
    )
    parser.add_argument(
        "--stress",
        action="store_true",
        help="--job-minutes {:g} {:g}: a hundred times the reference's churn".format(*STRESS_JOB_MINUTES),
    )
    args = parser.parse_args(argv)
    if args.stress:
        args.job_minutes = list(STRESS_JOB_MINUTES)
    if args.warmup is None:
        args.warmup = max(20.0, args.job_minutes[0] * 60 + args.interval)
    return args


def main(argv: list[str] | None = None) -> int:
    args = arguments(argv)
    logging_setup()
    results = []
    n = args.agents
    while True:
        logger.info("fleet of %d agents", n)
        results.append(measure(n, args))
        print_results(results, args.p99_ms, args.delivery_p99_s)
        held_now = results[-1].holds(args.p99_ms, args.delivery_p99_s)
        if not args.find_max or not held_now or n + args.step > args.max_agents:
            break
        n += args.step
    held = [r.agents for r in results if r.holds(args.p99_ms, args.delivery_p99_s)]
    if args.find_max:
        largest = max(held) if held else 0
        print(
            f"largest fleet with sync p99 under {args.p99_ms:g} ms, start delivery p99 under"
            f" {args.delivery_p99_s:g} s, every report stored once and no errors: {largest}"
        )
        return 0 if held else 1
    return 0 if results[-1].holds(args.p99_ms, args.delivery_p99_s) else 1


if __name__ == "__main__":
    sys.exit(main())
