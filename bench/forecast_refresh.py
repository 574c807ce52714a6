"""The forecast refresh of a deep live queue, in-process: each refresh task's CPU, and its result.

Run: `python -m bench.forecast_refresh [--servers 500] [--queued 10000] [--cpu-s 1] [--redis-url URL]`.
Creates a fresh PostgreSQL database (`attune_bench_forecast_refresh`, dropped at the end, also on
error), `--servers` servers of 8 GPUs (24 cores, 500 GB), the workload catalog, and queues `--queued`
jobs through the services as arrays of 1,000 tasks (each array one catalog model, 1 to 8 GPUs, as
bench.submit_rate fills its queue; admission off). Then one live round (`--rounds`; FIFO + tune, the
service's defaults, its inline refresh left out) starts what fits. The process's objects are frozen
out of the collector's way first, as the worker's are (config/gc_freeze.py).

Timed in this process at one fixed clock, CPU (process time) and wall:
- **the refresh as the forecasts worker runs it** (services/forecast_cycle.py): refresh tasks (parts)
  one after the other until the cycle is done, each with the service's CPU budget
  (`forecast_refresh_cpu_s`, `--part-cpu-s` to change it), each reading the cycle back from Redis
  (`--redis-url`; only the refresh's own keys are touched) as a part on the other forecasts process
  does (`--same-process`: the cycle this process kept, no unpickling). Printed: each part's CPU, the
  largest (the figure the target reads), the cycle's total, the rounds the core decided.
- **the whole forecast in one call** (live_forecast without a time budget) on the same rows and clock:
  its CPU, and whether the parts gave every job the same start, finish and detail (they must).
- `--wall-budget-s S`: also the refresh of one task cut at S s of wall time (the refresh before the
  parts: 5 s), how many of its estimates differ from the whole forecast's and how many jobs it left
  without a finish that the whole forecast gives one.
- `--baseline`: also the whole forecast with the forecast's shortcuts off (simulator/forecast.py
  `shortcuts=False`), and whether it gives the same estimates.

Exits 1 when the largest part's CPU is at or above `--cpu-s` (1 s) or any comparison differs.
`--profile FILE` writes one whole forecast's cProfile stats.
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


def whole_cost(*, shortcuts: bool, now: datetime, budget_s: float = 1e9) -> dict[str, Any]:
    """One refresh in one call (job_forecasts_refresh_estimates) at the clock `now` with a wall budget
    of `budget_s` (default: none to speak of, the whole forecast): CPU and wall seconds, simulated
    rounds, the estimates."""
    from django.conf import settings

    import scheduler_app.services.forecasts as forecasts_module
    from scheduler_app.services.forecasts import job_forecasts_refresh_estimates
    from scheduler_app.simulator.forecast import forecast

    play = forecast if shortcuts else functools.partial(forecast, shortcuts=False)
    counts = {"decided": 0}
    conf = {**settings.ATTUNE_SCHEDULER, "forecast_refresh_budget_s": budget_s}
    # One clock for every refresh (the forecast starts at the next round after it, and reads leases'
    # ages from it): refreshes timed a minute apart would otherwise forecast from different times,
    # and their estimates could not be compared.
    with (
        mock.patch.object(settings, "ATTUNE_SCHEDULER", conf),
        mock.patch("django.utils.timezone.now", return_value=now),
        mock.patch.object(forecasts_module, "forecast", play),
        counted_rounds(counts),
    ):
        start, start_cpu = time.perf_counter(), time.process_time()
        estimates = job_forecasts_refresh_estimates()
        cpu = time.process_time() - start_cpu
        wall = time.perf_counter() - start
    return {"cpu": cpu, "wall": wall, "decided": counts["decided"], "estimates": estimates}


def parts_cost(redis_url: str, *, now: datetime, cpu_s: float | None, same_process: bool) -> dict[str, Any]:
    """The refresh as the forecasts worker plays it: parts one after the other until the cycle is done
    (each reading the cycle back from Redis unless `same_process`); each part's CPU and wall seconds,
    the rounds decided, the cycle's estimates."""
    import redis

    from scheduler_app.conf import scheduler_conf
    from scheduler_app.services import forecast_cycle

    client = redis.Redis.from_url(redis_url)
    forecast_cycle.refresh_cycle_drop(client)
    client.delete(forecast_cycle.LOCK_KEY, forecast_cycle.ASKED_KEY)
    budget_s = scheduler_conf().forecast_refresh_cpu_s if cpu_s is None else cpu_s
    cpu: list[float] = []
    wall: list[float] = []
    blob_bytes = 0
    counts = {"decided": 0}
    part = None
    with mock.patch("django.utils.timezone.now", return_value=now), counted_rounds(counts):
        while part is None or not part.done:
            if not same_process:
                forecast_cycle.refresh_cycle_forget()  # as on the other process: read back from Redis
            start, start_cpu = time.perf_counter(), time.process_time()
            part = forecast_cycle.refresh_part(client, cpu_s=budget_s, now=now)
            cpu.append(time.process_time() - start_cpu)
            wall.append(time.perf_counter() - start)
            if part is None:
                raise RuntimeError(f"another refresh holds {forecast_cycle.LOCK_KEY} on {redis_url}")
            blob_bytes = max(blob_bytes, len(client.get(forecast_cycle.STATE_KEY) or b""))
    return {
        "cpu_all": cpu,
        "wall_all": wall,
        "budget_s": budget_s,
        "decided": counts["decided"],
        "estimates": part.estimates or {},
        "blob_bytes": blob_bytes,
        "pacing": scheduler_conf().forecast_refresh_pacing,
    }


def without_finish(cut: dict, whole: dict) -> int:
    """How many jobs the whole forecast gives a finish that `cut` does not."""
    return sum(
        1 for k, e in whole.items() if e.finish_at is not None and (k not in cut or cut[k].finish_at is None)
    )


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
    parser.add_argument("--rounds", type=int, default=1, help="live rounds before the refresh")
    parser.add_argument("--cpu-s", type=float, default=1.0, help="target: each refresh task's CPU below this")
    parser.add_argument("--part-cpu-s", type=float, default=None, help="a part's budget (default: conf)")
    parser.add_argument("--same-process", action="store_true", help="parts keep the cycle in memory")
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/3", help="the refresh's keys only")
    parser.add_argument("--wall-budget-s", type=float, default=None, help="also one refresh cut at S s")
    parser.add_argument("--baseline", action="store_true", help="also the whole forecast without shortcuts")
    parser.add_argument("--db", default="attune_bench_forecast_refresh", help="database to create and drop")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument(
        "--profile", default=None, help="write the whole forecast's cProfile stats to this file"
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = arguments(argv)
    logging_setup()
    with bench_database(args.db) as url:
        django_setup(url)
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
        parts = parts_cost(args.redis_url, now=now, cpu_s=args.part_cpu_s, same_process=args.same_process)
        if args.profile:
            import cProfile

            profiler = cProfile.Profile()
            profiler.runcall(whole_cost, shortcuts=True, now=now)
            profiler.dump_stats(args.profile)
        whole = whole_cost(shortcuts=True, now=now)
        cut = (
            None
            if args.wall_budget_s is None
            else whole_cost(shortcuts=True, now=now, budget_s=args.wall_budget_s)
        )
        baseline = whole_cost(shortcuts=False, now=now) if args.baseline else None
        connections.close_all()
    print(
        f"\nforecast refresh: {args.servers} servers x 8 GPUs, {live} live jobs ({running} running), "
        f"after {args.rounds} round(s)"
    )
    each = parts["cpu_all"]
    print(
        f"\nthe worker's refresh: {len(each)} parts of at most {parts['budget_s']:g} s of CPU each"
        f"{' (the cycle kept in memory)' if args.same_process else ' (each reading it back from Redis)'}, "
        f"the cycle kept in Redis in {parts['blob_bytes'] / 1e6:.1f} MB"
    )
    print("CPU s of each part:", " ".join(f"{c:.2f}" for c in each))
    print(
        f"the cycle's wall time with the worker's pacing ({parts['pacing']:g} x each part's wall time "
        f"between parts): {sum(parts['wall_all']) * (1 + parts['pacing']):.0f} s"
    )
    rows = [
        [
            "refresh tasks (parts)",
            f"{max(each):.2f}",
            f"{statistics.median(each):.2f}",
            f"{sum(each):.2f}",
            f"{sum(parts['wall_all']):.2f}",
            str(parts["decided"]),
        ],
        [
            "whole forecast, one call",
            f"{whole['cpu']:.2f}",
            "",
            f"{whole['cpu']:.2f}",
            f"{whole['wall']:.2f}",
            str(whole["decided"]),
        ],
    ]
    if cut is not None:
        rows.append(
            [
                f"one call cut at {args.wall_budget_s:g} s wall",
                f"{cut['cpu']:.2f}",
                "",
                f"{cut['cpu']:.2f}",
                f"{cut['wall']:.2f}",
                str(cut["decided"]),
            ]
        )
    if baseline is not None:
        rows.append(
            [
                "whole, without shortcuts",
                f"{baseline['cpu']:.2f}",
                "",
                f"{baseline['cpu']:.2f}",
                f"{baseline['wall']:.2f}",
                str(baseline["decided"]),
            ]
        )
    print_table(["", "CPU s, most", "median", "total", "wall s", "rounds decided"], rows)
    differ = differences(parts["estimates"], whole["estimates"])
    print(f"the parts' estimates as the whole forecast's: {'yes' if not differ else f'no, {differ} differ'}")
    ok = max(each) < args.cpu_s and not differ
    if cut is not None:
        cut_differ = differences(cut["estimates"], whole["estimates"])
        print(
            f"one call cut at {args.wall_budget_s:g} s: {cut_differ} of {len(whole['estimates'])} estimates "
            "differ "
            f"from the whole forecast's; {without_finish(cut['estimates'], whole['estimates'])} jobs without "
            f"the finish it gives ({sum(1 for e in whole['estimates'].values() if e.finish_at)} have one)"
        )
    if baseline is not None:
        base_differ = differences(baseline["estimates"], whole["estimates"])
        print(
            f"same estimates without shortcuts: {'yes' if not base_differ else f'no, {base_differ} differ'}"
        )
        ok = ok and not base_differ
    print(f"each refresh task under {args.cpu_s:g} s of CPU: {'yes' if max(each) < args.cpu_s else 'NO'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
