"""SWAF's aging (policies/aging.py) on both papers' benchmarks: swaf + genie with and without it.

Run: `python -m bench.aging` (`--quick`: a small grid; `--costs 0,120`: restart costs, in seconds per
restart, bench/restart_axis.py; `--workers N`). Synergy: the multi-GPU load sweep's 4.5 jobs/h row of
bench.default_pair (128 GPUs, split (20,70,10), seed 1, mean JCT of ids [4000, 5000), round-end
convention), where shortest first leaves the longest waits; GENIE: genie_trace at 4 jobs/h, 300 jobs,
seeds 1-3 (every job there has a QoS target, so aging, which only ages jobs without one, changes
nothing: the rows check it). Besides each benchmark's own figure, the longest and the 99th-percentile
wait until the first start of the measured jobs, and how many jobs started later than the default
aging bound (the tail that aging bounds).
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench import restart_axis
from bench.common import add_workers_argument, parallel_map
from bench.reproduce_genie import CLUSTER as GENIE_CLUSTER
from bench.synergy_runs import BIG_CLUSTER, SPLITS, Workload, trace_for, window_jct
from bench.synergy_tables import md_table
from profiles_app.catalog import load_catalog
from scheduler_app.core.policies.aging import DEFAULT_AGING
from scheduler_app.core.policies.swaf import SwafPolicy
from scheduler_app.core.restarts import RestartPolicy
from scheduler_app.simulator import SimulationResult, TraceJob, genie_trace, simulate


@dataclass(frozen=True)
class Grid:
    synergy_jobs: int
    window: tuple[int, int]
    genie_jobs: int
    genie_seeds: tuple[int, ...]


FULL = Grid(7000, (4000, 5000), 300, (1, 2, 3))
QUICK = Grid(1500, (1000, 1500), 100, (1,))
SYNERGY_LOAD, GENIE_LOAD = 4.5, 4.0


@dataclass(frozen=True)
class Run:
    """One simulation, as plain data for a worker process."""

    bench: str  # "synergy" or "genie"
    aging: bool
    cost_s: float
    seed: int
    grid: Grid


def waits_h(result: SimulationResult, trace: list[TraceJob], ids: tuple[int, int] | None) -> dict[str, float]:
    """The longest and the 99th-percentile wait until the first start (hours) of the started jobs in
    `ids`, and how many of all the jobs started later than the default aging bound: their threshold
    (DEFAULT_AGING on the whole job) plus one round."""
    catalog = load_catalog()
    length_s = {t.job_id: t.total_iters * catalog[t.model].iter_time_s for t in trace}
    aging = DEFAULT_AGING
    started = [r for r in result.records if r.start_s is not None]
    waits = sorted(
        (r.start_s - r.arrival_s) / 3600.0 for r in started if ids is None or ids[0] <= r.job_id < ids[1]
    )
    bound_s = {
        r.job_id: max(aging.factor * length_s[r.job_id], aging.floor_s) + result.round_s for r in started
    }
    late = sum(1 for r in started if r.start_s - r.arrival_s > bound_s[r.job_id])  # type: ignore[operator]
    return {"max_wait_h": waits[-1], "p99_wait_h": waits[int(0.99 * (len(waits) - 1))], "over_bound": late}


def run_one(run: Run) -> dict[str, Any]:
    policy = SwafPolicy() if run.aging else SwafPolicy(aging=None)
    restarts = restart_axis.simulate_kwargs(run.cost_s, RestartPolicy())
    started = time.process_time()
    if run.bench == "synergy":
        workload = Workload(run.grid.synergy_jobs, SYNERGY_LOAD, SPLITS["20,70,10"], True, run.seed)
        trace = trace_for(workload)
        result = simulate(
            trace,
            BIG_CLUSTER,
            policy=policy,
            allocator="genie",
            finish_at_round_end=True,
            measured_job_ids=run.grid.window,
            stop_when_measured=True,
            **restarts,
        )
        figures = {"jct_h": window_jct(result, [run.grid.window])[run.grid.window]}
        figures.update(waits_h(result, trace, run.grid.window))
    else:
        trace = genie_trace(run.grid.genie_jobs, jobs_per_hour=GENIE_LOAD, seed=run.seed)
        result = simulate(trace, GENIE_CLUSTER, policy=policy, allocator="genie", **restarts)
        figures = {"qos_pct": result.qos.met_pct, "makespan_h": result.makespan_h, "jct_h": result.avg_jct_h}
        figures.update(waits_h(result, trace, None))
    cpu_s = time.process_time() - started
    sys.stderr.write(
        f"  {run.bench} aging={run.aging} cost={run.cost_s:g} seed={run.seed}: {cpu_s:.0f} s CPU\n"
    )
    return {"bench": run.bench, "aging": run.aging, "cost_s": run.cost_s, "seed": run.seed, **figures}


def table(rows: list[dict[str, Any]], bench: str, keys: tuple[str, ...]) -> str:
    out = []
    for cost_s in sorted({r["cost_s"] for r in rows}):
        for aging in (True, False):
            mine = [r for r in rows if r["bench"] == bench and r["cost_s"] == cost_s and r["aging"] == aging]
            if mine:
                means = [f"{statistics.fmean(r[k] for r in mine):.2f}" for k in keys]
                out.append([restart_axis.cost_label(cost_s), "on" if aging else "off", *means])
    return md_table(["restart cost", "aging", *keys], out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a small grid (a few minutes)")
    parser.add_argument("--costs", default="0,120", help="seconds per restart, a comma list (0: free)")
    parser.add_argument("--json", type=Path, help="also write every run's figures here")
    add_workers_argument(parser)
    args = parser.parse_args()
    logging.getLogger("scheduler_app").setLevel(logging.WARNING)
    grid = QUICK if args.quick else FULL
    costs = restart_axis.costs_of(args.costs)
    runs = [Run("synergy", aging, c, 1, grid) for c in costs for aging in (True, False)]
    runs += [
        Run("genie", aging, c, s, grid) for c in costs for s in grid.genie_seeds for aging in (True, False)
    ]
    started = time.perf_counter()
    rows = parallel_map(run_one, runs, workers=args.workers)
    command = "python -m bench.aging" + (" --quick" if args.quick else "") + f" --costs {args.costs}"
    print(f"### Aging: swaf + genie with and without it\n\nCommand: `{command}`\n")
    print(
        f"Synergy, multi-GPU, {SYNERGY_LOAD:g} jobs/h, {grid.synergy_jobs:,} jobs, seed 1, ids "
        f"[{grid.window[0]}, {grid.window[1]}):\n"
    )
    print(table(rows, "synergy", ("jct_h", "max_wait_h", "p99_wait_h", "over_bound")))
    seeds = ",".join(str(s) for s in grid.genie_seeds)
    print(f"\nGENIE, {GENIE_LOAD:g} jobs/h, {grid.genie_jobs} jobs, seeds {seeds} (means):\n")
    print(table(rows, "genie", ("qos_pct", "makespan_h", "jct_h", "max_wait_h")))
    print(
        "\nover_bound: jobs (of all, not only the measured ones) whose first start came later than "
        f"max({DEFAULT_AGING.factor:g} x their length, {DEFAULT_AGING.floor_s / 3600:g} h) + one round."
    )
    print(f"\n(wall time {time.perf_counter() - started:.0f} s)")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
