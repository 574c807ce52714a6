"""The forecast refresh of a deep live queue, in-process on PostgreSQL: CPU and wall, and simulated rounds.

Run: `python -m bench.forecast_refresh [--servers 500] [--queued 10000] [--repeats 3]`. Creates a fresh
PostgreSQL database (`attune_bench_forecast_refresh`, dropped at the end, also on error), `--servers`
servers of 8 GPUs (24 cores, 500 GB), the workload catalog, and queues `--queued` jobs through the
services as arrays of 1,000 tasks (each array one catalog model, 1 to 8 GPUs, as bench.submit_rate
fills its queue; admission off). Then one live round (`--rounds`; FIFO + tune, the service's defaults,
its inline refresh left out) starts what fits, and the refresh the forecasts worker runs after a round
(`job_forecasts_refresh`) is timed in this process: CPU and wall seconds, median of `--repeats`, and
the number of simulated rounds the core decided (schedule_round calls). The process's objects are
frozen out of the collector's way first, as the worker's are (config/gc_freeze.py).

Baseline in the same run: the same refresh with the forecast's shortcuts off (simulator/forecast.py
`shortcuts=False`: a plan that leaves every job as it was is decided again the next round to be found
the same), on the same rows. The two refreshes' estimates are compared: `same estimates` says whether
every job's start, finish and detail agree (both stop at the refresh's wall budget, which `--budget-s`
raises: give it 60 to compare whole forecasts). Exits 1 when they differ or the refresh's median CPU
is at or above `--cpu-s` (1 s). `--profile FILE` writes one more refresh's cProfile stats.
"""

from __future__ import annotations

import argparse
import functools
import random
import statistics
import sys
import time
from contextlib import contextmanager
from datetime import datetime
from typing import Any
from unittest import mock

from bench.common import print_table
from bench.live_common import bench_database, django_setup, logger, logging_setup, servers_create

GPU_MIX = (1, 1, 1, 2, 4, 8)  # as bench.submit_rate's arrays
ARRAY_TASKS = 1000


def populate(num_servers: int, queued: int, seed: int) -> None:
    """Servers, the catalog and `queued` PENDING jobs as arrays of up to 1,000 tasks, through the services."""
    from django.contrib.auth import get_user_model

    from profiles_app.models import Workload
    from profiles_app.services import workload_catalog_load
    from scheduler_app.services.jobs import JobRequest, job_submit

    start = time.perf_counter()
    servers_create(num_servers, uuid_tag="refresh")
    workload_catalog_load()
    workloads = list(Workload.objects.order_by("name"))
    owner = get_user_model().objects.create_user("refresh", password=None)
    rng = random.Random(seed)
    n = 0
    while n < queued:
        tasks = min(ARRAY_TASKS, queued - n)
        job_submit(
            admission=False,
            owner=owner,
            request=JobRequest(
                name=f"fill-{n}",
                workload=rng.choice(workloads),  # drawn in bench.submit_rate's order: the same queue
                num_gpus=rng.choice(GPU_MIX),
                total_iters=rng.randint(20_000, 2_000_000),
                array=f"0-{tasks - 1}",
            ),
        )
        n += tasks
    logger.info(
        "%d servers (%d GPUs), %d jobs queued in %.1f s",
        num_servers,
        8 * num_servers,
        queued,
        time.perf_counter() - start,
    )


def one_round() -> Any:
    """One live round, as the rounds' worker runs it (its refresh request left out)."""
    from scheduler_app.services.rounds import scheduling_round_run

    with mock.patch("scheduler_app.services.rounds.job_forecasts_refresh_request_on_commit"):
        sround = scheduling_round_run(trigger="bench")
    if sround is None:
        raise RuntimeError("the round was skipped: another round holds the lock on this database")
    logger.info("round: %d placed, %d pending", sround.num_placed, sround.num_pending)
    return sround


@contextmanager
def counted_rounds(counts: dict[str, int]):
    """Count the forecast's calls of the core (schedule_round) while the block runs."""
    import scheduler_app.simulator.forecast as forecast_module

    real = forecast_module.schedule_round

    def counting(*args: Any, **kwargs: Any) -> Any:
        counts["decided"] += 1
        return real(*args, **kwargs)

    with mock.patch.object(forecast_module, "schedule_round", counting):
        yield


def refresh_cost(repeats: int, *, shortcuts: bool, now: datetime) -> dict[str, Any]:
    """The refresh `repeats` times at the clock `now`: median CPU and wall seconds, simulated rounds,
    the last estimates."""
    from scheduler_app.services.forecasts import job_forecasts_refresh_estimates

    cpu, wall, decided = [], [], []
    estimates: dict = {}
    import scheduler_app.services.forecasts as forecasts_module
    from scheduler_app.simulator.forecast import forecast

    play = forecast if shortcuts else functools.partial(forecast, shortcuts=False)
    for _ in range(repeats):
        counts = {"decided": 0}
        # One clock for every refresh (the forecast starts at the next round after it, and reads
        # leases' ages from it): refreshes timed a minute apart would otherwise forecast from
        # different times, and their estimates could not be compared.
        with (
            mock.patch("django.utils.timezone.now", return_value=now),
            mock.patch.object(forecasts_module, "forecast", play),
            counted_rounds(counts),
        ):
            start, start_cpu = time.perf_counter(), time.process_time()
            estimates = job_forecasts_refresh_estimates()
            cpu.append(time.process_time() - start_cpu)
            wall.append(time.perf_counter() - start)
        decided.append(counts["decided"])
    return {
        "cpu": statistics.median(cpu),
        "cpu_all": cpu,
        "wall": statistics.median(wall),
        "decided": statistics.median(decided),
        "estimates": estimates,
    }


def differences(a: dict, b: dict) -> int:
    """How many jobs' estimates differ (start, finish, detail) between two refreshes."""
    keys = a.keys() | b.keys()
    return sum(
        1
        for k in keys
        if k not in a
        or k not in b
        or (a[k].start_at, a[k].finish_at, a[k].detail) != (b[k].start_at, b[k].finish_at, b[k].detail)
    )


def arguments(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--servers", type=int, default=500, help="servers of 8 GPUs")
    parser.add_argument("--queued", type=int, default=10_000, help="jobs queued before the round")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=1, help="live rounds before the refresh")
    parser.add_argument(
        "--cpu-s", type=float, default=1.0, help="target: the refresh's median CPU below this"
    )
    parser.add_argument("--no-baseline", action="store_true", help="skip the refresh without shortcuts")
    parser.add_argument(
        "--budget-s", type=float, default=None, help="the refresh's wall budget (default: conf)"
    )
    parser.add_argument("--db", default="attune_bench_forecast_refresh", help="database to create and drop")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--profile", default=None, help="write one refresh's cProfile stats to this file")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = arguments(argv)
    logging_setup()
    env = {} if args.budget_s is None else {"ATTUNE_FORECAST_REFRESH_BUDGET_S": str(args.budget_s)}
    with bench_database(args.db) as url:
        django_setup(url, **env)
        from django.db import connections
        from django.utils import timezone

        from config.gc_freeze import startup_objects_freeze
        from scheduler_app.models import Job, JobState

        populate(args.servers, args.queued, args.seed)
        for _ in range(args.rounds):
            one_round()
        startup_objects_freeze()  # as the forecasts worker's process does at its start (config/celery.py)
        now = timezone.now()
        live = Job.objects.filter(state__in=[JobState.PENDING, JobState.RUNNING]).count()
        running = Job.objects.filter(state=JobState.RUNNING).count()
        if args.profile:
            import cProfile

            from scheduler_app.services.forecasts import job_forecasts_refresh_estimates

            profiler = cProfile.Profile()
            profiler.runcall(job_forecasts_refresh_estimates, now=now)
            profiler.dump_stats(args.profile)
        after = refresh_cost(args.repeats, shortcuts=True, now=now)
        before = None if args.no_baseline else refresh_cost(args.repeats, shortcuts=False, now=now)
        connections.close_all()
    rows = [
        [
            label,
            f"{r['cpu']:.2f}",
            " ".join(f"{c:.2f}" for c in r["cpu_all"]),
            f"{r['wall']:.2f}",
            f"{r['decided']:.0f}",
        ]
        for label, r in (("refresh", after), ("refresh without shortcuts", before))
        if r is not None
    ]
    print(
        f"\nforecast refresh: {args.servers} servers x 8 GPUs, {live} live jobs ({running} running), "
        f"after {args.rounds} round(s), median of {args.repeats}"
    )
    print_table(["", "CPU s", "each", "wall s", "rounds decided"], rows)
    ok = after["cpu"] < args.cpu_s
    if before is not None:
        differ = differences(after["estimates"], before["estimates"])
        print(f"same estimates as without shortcuts: {'yes' if not differ else f'no, {differ} jobs differ'}")
        ok = ok and not differ
    print(f"refresh under {args.cpu_s:g} s of CPU: {'yes' if after['cpu'] < args.cpu_s else 'NO'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
