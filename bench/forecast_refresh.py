"""The forecast refresh of a deep live queue, in-process: its CPU per round interval, each part's, its result.

Run: `python -m bench.forecast_refresh [--servers 500] [--queued 10000] [--cycles 2] [--redis-url URL]`.
Creates a fresh PostgreSQL database (`attune_bench_forecast_refresh`, dropped at the end, also on
error), `--servers` servers of 8 GPUs (24 cores, 500 GB), the workload catalog, and queues `--queued`
jobs through the services as arrays of 1,000 tasks (each array one catalog model, 1 to 8 GPUs, as
bench.submit_rate fills its queue; admission off). Then one live round (`--rounds`; FIFO + tune, the
service's defaults, its inline refresh left out) starts what fits. The process's objects are frozen
out of the collector's way first, as the worker's are (config/gc_freeze.py).

Timed in this process at one fixed forecast clock, CPU (process time) and wall:
- **the refresh as the forecasts worker runs it, over a sequence of rounds**: `--cycles` cycles one
  after the other (a round asks for the next while one plays), each played in refresh tasks (parts,
  services/forecast_cycle.py) with the service's budgets: each part's (`forecast_refresh_cpu_s`,
  `--part-cpu-s`) and the parts' together per round interval (`forecast_refresh_cpu_per_round_s`,
  `--cpu-per-round-s`; services/forecast_refresh.py's refresh_part_budget and refresh_cpu_charge, on
  a simulated clock that starts mid-interval and moves on by each part's wall time, its pace
  (`forecast_refresh_pacing` x that) and the waits for the next interval; `round_s` from the settings).
  The cycle is kept in this process's memory as on the worker (`--other-process`: each part reads it
  back from Redis, as a part on the other forecasts process does). Printed: the CPU of each round
  interval (max and mean, the target's figures), how many intervals a cycle spans, each part's CPU,
  the rounds the core decided.
- **the whole forecast in one call** (live_forecast without a time budget) on the same rows and clock:
  its CPU (the baseline), and whether each cycle gave every job the same start, finish and detail.
- `--wall-budget-s S`: also the refresh of one task cut at S s of wall time (the refresh before the
  parts: 5 s), how many of its estimates differ from the whole forecast's and how many jobs it left
  without a finish that the whole forecast gives one.
- `--baseline`: also the whole forecast with the forecast's shortcuts off (simulator/forecast.py
  `shortcuts=False`), and whether it gives the same estimates.

Exits 1 when a round interval's CPU is at or above `--cpu-s` (1 s), a part's is, or any comparison
differs. `--profile FILE` writes one whole forecast's cProfile stats.
"""

from __future__ import annotations

import argparse
import functools
import math
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
    from profiles_app.services.workloads import workload_catalog_load
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


def rounds_cost(
    redis_url: str,
    *,
    now: datetime,
    cycles: int,
    other_process: bool,
    conf_overrides: dict[str, float],
) -> dict[str, Any]:
    """`cycles` refresh cycles as the forecasts worker plays them, one after the other, on a simulated
    clock (see the module's docstring): each part's CPU and wall seconds, each round interval's CPU,
    each cycle's span, the rounds decided, the last cycle's estimates."""
    import redis
    from django.conf import settings

    from scheduler_app.conf import scheduler_conf
    from scheduler_app.services import forecast_cycle, forecast_refresh

    client = redis.Redis.from_url(redis_url)
    conf_patch = mock.patch.object(
        settings, "ATTUNE_SCHEDULER", {**settings.ATTUNE_SCHEDULER, **conf_overrides}
    )
    counts = {"decided": 0}
    parts: list[dict[str, float]] = []
    spans: list[dict[str, Any]] = []
    estimates: list[dict] = []
    with conf_patch, mock.patch("django.utils.timezone.now", return_value=now), counted_rounds(counts):
        conf = scheduler_conf()
        round_s, pacing = conf.round_s, conf.forecast_refresh_pacing
        forecast_cycle.refresh_cycle_drop(client)
        client.delete(
            forecast_cycle.LOCK_KEY,
            forecast_cycle.ASKED_KEY,
            forecast_refresh.CPU_WINDOW_KEY,
            forecast_refresh.START_CPU_KEY,
        )
        # Mid-interval: a round's request comes at no particular point of the clock's intervals.
        t = first_round = (math.floor(time.time() / round_s) + 0.5) * round_s
        last_cycle_start = -math.inf
        for _ in range(cycles):
            # A round every round_s from the first asks for a refresh: the next cycle starts at the first
            # round after the last cycle's start (at once if that came while it played), and no sooner
            # than the minimum interval after it.
            if last_cycle_start > -math.inf:
                rounds_since = math.floor((last_cycle_start - first_round) / round_s) + 1
                t = max(
                    t,
                    first_round + rounds_since * round_s,
                    last_cycle_start + conf.forecast_refresh_min_interval_s,
                )
            part = None
            cycle_start = t
            while part is None or not part.done:
                budget = forecast_refresh.refresh_part_budget(client, now_s=t)
                if budget.wait_s > 0:
                    t += budget.wait_s
                    continue
                if other_process:
                    forecast_cycle.refresh_cycle_forget()  # as on the other process: read back from Redis
                start, start_cpu = time.perf_counter(), time.process_time()
                part = forecast_cycle.refresh_part(
                    client, cpu_s=budget.cpu_s, now=now, must_play=budget.must_play, limit_s=budget.limit_s
                )
                cpu, wall = time.process_time() - start_cpu, time.perf_counter() - start
                if part is None:
                    raise RuntimeError(f"another refresh holds {forecast_cycle.LOCK_KEY} on {redis_url}")
                if part.started:
                    cycle_start = last_cycle_start = t
                parts.append(
                    {"at": t, "cpu": cpu, "wall": wall, "budget": budget.cpu_s, "rounds": part.rounds}
                )
                forecast_refresh.refresh_cpu_charge(
                    client,
                    started_s=t,
                    cpu_s=part.cpu_s,
                    now_s=t + wall,
                    rest_of_interval=not (part.done or part.started or part.rounds),
                    cycle_start=part.started,
                )
                t += wall * (1 + pacing)  # the part, then its pace
            spans.append(
                {"start": cycle_start, "end": t, "parts": sum(1 for p in parts if p["at"] >= cycle_start)}
            )
            estimates.append(part.estimates or {})
        client.delete(forecast_refresh.CPU_WINDOW_KEY, forecast_refresh.START_CPU_KEY)
    intervals = cpu_per_interval([(p["at"], p["cpu"]) for p in parts], round_s)
    return {
        "parts": parts,
        "intervals": intervals,
        "spans": spans,
        "round_s": round_s,
        "cap_s": conf.forecast_refresh_cpu_per_round_s,
        "budget_s": conf.forecast_refresh_cpu_s,
        "pacing": pacing,
        "decided": counts["decided"],
        "estimates": estimates,
    }


def cpu_per_interval(parts: list[tuple[float, float]], round_s: float) -> list[float]:
    """The CPU of each round interval (k x round_s on the clock) from the first part's to the last's,
    each part's (start, CPU seconds) counted in the interval it started in, as the service counts it."""
    per_interval: dict[int, float] = {}
    for at_s, cpu_s in parts:
        index = math.floor(at_s / round_s)
        per_interval[index] = per_interval.get(index, 0.0) + cpu_s
    return [per_interval.get(i, 0.0) for i in range(min(per_interval), max(per_interval) + 1)]


def intervals_spanned(start_s: float, end_s: float, round_s: float) -> int:
    """How many round intervals a cycle from `start_s` to `end_s` touches."""
    return math.floor(end_s / round_s) - math.floor(start_s / round_s) + 1


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
    parser.add_argument(
        "--cpu-s",
        type=float,
        default=1.0,
        help="target: the CPU of a round interval (and of a part) below this",
    )
    parser.add_argument("--cycles", type=int, default=2, help="refresh cycles one after the other")
    parser.add_argument("--part-cpu-s", type=float, default=None, help="a part's budget (default: conf)")
    parser.add_argument(
        "--cpu-per-round-s",
        type=float,
        default=None,
        help="the parts' budget per round interval (default: conf)",
    )
    parser.add_argument(
        "--other-process", action="store_true", help="each part reads the cycle back from Redis"
    )
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
        overrides = {
            key: value
            for key, value in (
                ("forecast_refresh_cpu_s", args.part_cpu_s),
                ("forecast_refresh_cpu_per_round_s", args.cpu_per_round_s),
            )
            if value is not None
        }
        seq = rounds_cost(
            args.redis_url,
            now=now,
            cycles=args.cycles,
            other_process=args.other_process,
            conf_overrides=overrides,
        )
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
    each = [p["cpu"] for p in seq["parts"]]
    walls = [p["wall"] for p in seq["parts"]]
    intervals = seq["intervals"]
    spans = [intervals_spanned(c["start"], c["end"], seq["round_s"]) for c in seq["spans"]]
    cap = f"{seq['cap_s']:g} s" if seq["cap_s"] > 0 else "no bound"
    print(
        f"\nthe worker's refresh: {args.cycles} cycle(s) one after the other, parts of at most "
        f"{seq['budget_s']:g} s of CPU each, {cap} per round interval of {seq['round_s']:g} s, pacing "
        f"{seq['pacing']:g}, "
        + (
            "each part reading the cycle back from Redis"
            if args.other_process
            else "the cycle kept in memory"
        )
    )
    print("CPU s of each round interval:", " ".join(f"{c:.2f}" for c in intervals))
    print("CPU s of each part:", " ".join(f"{c:.2f}" for c in each))
    for i, (c, n) in enumerate(zip(seq["spans"], spans, strict=True)):
        print(
            f"cycle {i + 1}: {c['parts']} parts, {c['end'] - c['start']:.0f} s on the clock, "
            f"{n} round interval(s)"
        )
    per_cycle_cpu = sum(each) / args.cycles
    print_table(
        [
            "",
            "CPU s per round interval, max",
            "mean",
            "intervals a cycle spans",
            "cycle CPU s",
            "part CPU s, max",
        ],
        [
            [
                "refresh tasks (parts)",
                f"{max(intervals):.2f}",
                f"{statistics.mean(intervals):.2f}",
                " / ".join(str(n) for n in spans),
                f"{per_cycle_cpu:.2f}",
                f"{max(each):.2f}",
            ],
            [
                "whole forecast, one call (baseline)",
                f"{whole['cpu']:.2f}",
                "",
                "1",
                f"{whole['cpu']:.2f}",
                "",
            ],
        ],
    )
    rows = []
    if cut is not None:
        rows.append(
            [
                f"one call cut at {args.wall_budget_s:g} s wall",
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
                f"{baseline['wall']:.2f}",
                str(baseline["decided"]),
            ]
        )
    rows.append(
        ["whole forecast, one call", f"{whole['cpu']:.2f}", f"{whole['wall']:.2f}", str(whole["decided"])]
    )
    rows.append(["the parts (all cycles)", f"{sum(each):.2f}", f"{sum(walls):.2f}", str(seq["decided"])])
    print_table(["", "CPU s", "wall s", "rounds decided"], rows)
    differ = [differences(e, whole["estimates"]) for e in seq["estimates"]]
    print(
        "each cycle's estimates as the whole forecast's: "
        + ("yes" if not any(differ) else "no, " + " / ".join(str(d) for d in differ) + " differ")
    )
    ok = max(intervals) < args.cpu_s and max(each) < args.cpu_s and not any(differ)
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
    print(
        f"each round interval under {args.cpu_s:g} s of CPU: "
        f"{'yes' if max(intervals) < args.cpu_s else 'NO'}; "
        f"each refresh task: {'yes' if max(each) < args.cpu_s else 'NO'}"
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
