"""The live scheduling round on PostgreSQL (scheduling_round_run) against the pure core on the same inputs.

Run: `python -m bench.live_round [--servers 64] [--jobs 1000] [--scenarios 5]`. Creates a fresh
PostgreSQL database, 64 IDLE servers x 8 GPUs (24 cores, 500 GB), loads the workload catalog and
submits 1,000 PENDING jobs (catalog models, 1/2/4/8 GPUs) through the services. Then, `--scenarios`
times on a fresh copy of that database (CREATE DATABASE ... TEMPLATE), times three live rounds with
their query count: 1. everything new; 2. nothing changed (median of `--repeats`); 3. after about 10%
of the jobs finished (job_finish on running jobs). Baseline in the same run, before each round: the
pure core, engine.schedule_round, on the inputs the round's own selector builds (round_inputs over
the same rows); `x core` is the round's median duration over the core's, i.e. what the
database adds. `--no-forecast`: each round alone, as the rounds' worker runs it, without the inline
refresh of every live job's forecast that the embedded mode runs after it (seconds of CPU a round at
1,000 jobs): for measuring the round beside another bench, which that refresh would slow. The
databases are dropped at the end, also on error."""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from typing import Any
from unittest import mock

from bench.common import print_table, time_call
from bench.live_common import (
    bench_database,
    database_copy,
    django_setup,
    logger,
    logging_setup,
    servers_create,
)

GPU_MIX = ((1, 0.4), (2, 0.25), (4, 0.2), (8, 0.15))  # GPUs per job and its share of the jobs


def populate(num_servers: int, num_jobs: int, seed: int) -> None:
    """Servers, the catalog and PENDING jobs, all through the services."""
    from django.contrib.auth import get_user_model

    from profiles_app.models import Workload
    from profiles_app.services.workloads import workload_catalog_load
    from scheduler_app.services.jobs import JobRequest, job_submit

    start = time.perf_counter()
    servers_create(num_servers, uuid_tag="bench")
    workload_catalog_load()
    workloads = list(Workload.objects.order_by("name"))
    owner = get_user_model().objects.create_user("bench", password=None)
    rng = random.Random(seed)
    sizes, weights = zip(*GPU_MIX, strict=True)
    for n in range(num_jobs):
        # Admission off: the bench fills the queue, then times the rounds it runs itself.
        job_submit(
            admission=False,
            owner=owner,
            request=JobRequest(
                name=f"bench-{n}",
                num_gpus=rng.choices(sizes, weights)[0],
                total_iters=rng.randint(2_000, 200_000),
                workload=rng.choice(workloads),
            ),
        )
    logger.info(
        "%d servers (%d GPUs), %d catalog workloads, %d jobs submitted in %.1f s",
        num_servers,
        8 * num_servers,
        len(workloads),
        num_jobs,
        time.perf_counter() - start,
    )


def core_baseline(repeats: int) -> tuple[float, float, int]:
    """The round's inputs built by its selector (seconds), then the core alone on them (median seconds)."""
    from django.db import transaction

    from cluster_app.models import Server
    from scheduler_app.conf import scheduler_conf
    from scheduler_app.core.engine import schedule_round
    from scheduler_app.selectors import round_inputs, round_jobs_read

    conf = scheduler_conf()
    start = time.perf_counter()
    with transaction.atomic():  # the rows the round reads, read as it reads them (jobs as locked rows)
        servers = list(Server.objects.order_by("id"))
        inputs = round_inputs(servers=servers, jobs=round_jobs_read())
    inputs_s = time.perf_counter() - start
    now_s = time.time()
    core_s, _ = time_call(
        lambda: schedule_round(
            inputs.snapshot, inputs.views, policy=conf.policy_obj(), allocator=conf.allocator, now_s=now_s
        ),
        repeats=repeats,
    )
    return inputs_s, core_s, len(inputs.views)


def live_round(*, forecast: bool) -> tuple[Any, float, int]:
    """One scheduling_round_run: the SchedulingRound, its wall time and its number of queries;
    `forecast`: with the embedded mode's inline forecast refresh after it."""
    from contextlib import nullcontext

    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from scheduler_app.services.rounds import scheduling_round_run

    no_refresh = mock.patch("scheduler_app.services.rounds.job_forecasts_refresh_request_on_commit")
    with CaptureQueriesContext(connection) as queries, nullcontext() if forecast else no_refresh:
        start = time.perf_counter()
        sround = scheduling_round_run(trigger="bench")
        wall_s = time.perf_counter() - start
    if sround is None:
        raise RuntimeError("the round was skipped: another round holds the lock on this database")
    return sround, wall_s, len(queries)


def finish_jobs(count: int, seed: int) -> int:
    """Complete `count` running jobs (all their work done) through job_finish; returns how many.

    The early round each end asks for is recorded, not run: only the bench's own rounds are timed.
    """
    from django.db import transaction

    from scheduler_app.models import Job, JobState
    from scheduler_app.services.job_control import job_finish

    running = list(Job.objects.filter(state=JobState.RUNNING).order_by("id").values_list("id", flat=True))
    chosen = sorted(random.Random(seed).sample(running, min(count, len(running))))
    with (
        mock.patch("scheduler_app.services.round_requests.scheduling_round_request") as requested,
        transaction.atomic(),
    ):
        for job in Job.objects.select_for_update(of=("self",)).filter(pk__in=chosen).order_by("id"):
            job.done_iters = job.total_iters
            job_finish(job=job, state=JobState.COMPLETED, exit_code=0, reason="bench")
    logger.info(
        "%d running jobs completed (%d early rounds asked for, not run)", len(chosen), requested.call_count
    )
    return len(chosen)


def measure(*, repeats: int, core_repeats: int, forecast: bool) -> dict[str, Any]:
    """Core baseline on the current state, then the live round (`repeats` times: median)."""
    inputs_s, core_s, runnable = core_baseline(core_repeats)
    walls, rounds, sround, queries = [], [], None, 0
    for _ in range(repeats):
        sround, wall_s, queries = live_round(forecast=forecast)
        walls.append(wall_s)
        rounds.append(sround.duration_ms / 1e3)
    return {
        "runnable": runnable,
        "placed": sround.num_placed,
        "preempted": sround.num_preempted,
        "waiting": sround.num_pending + sround.num_infeasible,
        "queries": queries,
        "live": statistics.median(walls),
        "round": statistics.median(rounds),
        "inputs": inputs_s,
        "core": core_s,
    }


def scenario(args: argparse.Namespace) -> dict[str, dict[str, Any]]:
    """Rounds 1 (all new), 2 (unchanged) and 3 (after some jobs finished) from the populated state."""
    kwargs = {"core_repeats": args.core_repeats, "forecast": not args.no_forecast}
    results = {"1 all new": measure(repeats=1, **kwargs)}
    results[f"2 unchanged (x{args.repeats})"] = measure(repeats=args.repeats, **kwargs)
    finished = finish_jobs(round(args.finish * args.jobs), args.seed)
    results[f"3 after {finished} done"] = measure(repeats=1, **kwargs)
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--servers", type=int, default=64)
    parser.add_argument("--jobs", type=int, default=1000)
    parser.add_argument("--finish", type=float, default=0.1, help="share of the jobs finished before round 3")
    parser.add_argument("--scenarios", type=int, default=5, help="runs of rounds 1-3, each on a fresh copy")
    parser.add_argument("--repeats", type=int, default=3, help="live repeats of the unchanged round 2")
    parser.add_argument("--core-repeats", type=int, default=5, help="repeats of the core baseline")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument(
        "--no-forecast", action="store_true", help="leave out the embedded mode's inline forecast refresh"
    )
    parser.add_argument("--db", default="attune_bench_round", help="database to create and drop")
    parser.add_argument("--keep-db", action="store_true", help="do not drop the database at the end")
    args = parser.parse_args()
    logging_setup()
    if not 1 <= args.servers <= 2000 or not 1 <= args.jobs <= 20_000 or not 1 <= args.scenarios <= 20:
        parser.error("--servers must be 1..2000, --jobs 1..20000 and --scenarios 1..20")

    runs: list[dict[str, dict[str, Any]]] = []
    with bench_database(args.db, keep=args.keep_db) as url:
        django_setup(url)
        from scheduler_app.conf import scheduler_conf

        conf = scheduler_conf()
        populate(args.servers, args.jobs, args.seed)
        for i in range(args.scenarios):
            with database_copy(args.db, f"{args.db}_run"):
                runs.append(scenario(args))
            logger.info("scenario %d/%d done", i + 1, args.scenarios)

    rows = []
    for label, first in runs[0].items():
        per_run = [run[label] for run in runs]
        live = statistics.median(r["live"] for r in per_run)
        round_s = statistics.median(r["round"] for r in per_run)
        core = statistics.median(r["core"] for r in per_run)
        rows.append(
            [
                label,
                first["runnable"],
                first["placed"],
                first["preempted"],
                first["waiting"],
                first["queries"],
                round_s * 1e3,
                live * 1e3,
                min(r["live"] for r in per_run) * 1e3,
                statistics.median(r["inputs"] for r in per_run) * 1e3,
                core * 1e3,
                round_s / core,
            ]
        )
    print(
        f"\nlive round on PostgreSQL: {args.servers} servers x 8 GPUs, {args.jobs} jobs, {conf.policy}/"
        f"{conf.allocator}; median of {args.scenarios} runs, each on a fresh copy of the same data;"
        " core = engine.schedule_round alone on the inputs round_inputs builds; round ms = the round's"
        " transaction (SchedulingRound.duration_ms: decided and committed, agents woken), which is all a"
        " round costs the service's rounds worker (the forecast refresh after it is a task on the"
        + (
            " `forecasts` queue); embedded = the whole scheduling_round_run, the inline forecast refresh"
            " left out (--no-forecast)"
            if args.no_forecast
            else " `forecasts` queue); embedded + forecast = the whole scheduling_round_run in the embedded"
            " mode, where that refresh of every live job runs inline after the commit"
        )
    )
    print_table(
        ["round", "runnable", "placed", "preempted", "waiting", "queries", "round ms",
         "embedded ms" if args.no_forecast else "embedded + forecast ms",
         "best ms", "inputs ms", "core ms", "x core"],
        rows,
    )  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
