"""Reproduce GENIE's comparison (PAPERS.md §2.3, §6 rows 10-11) with Attune's simulator, as Markdown tables.

GENIE = the SWAF policy with QoS-aware placement (allocator `genie`); baselines FIFO, EDF and SJF with
a GPU-proportional placement (and with tune's CPU/memory, our stronger baseline); the combined mode
neither paper has = SWAF ordering with tune's allocation. Workload: simulator.genie_trace (every job
has a QoS latency, CNN-heavy, urgent bursts) on the Synergy testbed shape, 4 x (8 GPUs, 24 cores,
500 GB), several arrival rates and seeds. Run: `python -m bench.reproduce_genie` (`--quick`, `--json`).
`--predictor` puts GENIE's predictor in the loop: each job gets a per-GPU batch (0.5, 1 or 2 x its
model's) and is timed by that model's synthetic fit (simulator/genie_fits.py) in every decision and in
the simulation itself, so a spread placement costs what the fit says (t_cross), for every scheduler.
`--gpu-ranges` also lets each multi-GPU job run on any power of two up to its count: genie picks the
fewest GPUs that meet the deadline (GENIE's rule), the other allocators use the count asked for.
`--restart-costs 0,30,120,300` runs the headline (GENIE against the best baseline at the highest load)
at each restart cost instead (bench/restart_axis.py).
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import sys
import time
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from bench import restart_axis
from bench.common import add_workers_argument, parallel_map
from scheduler_app.core.policies import POLICIES, Policy
from scheduler_app.simulator import ClusterSpec, genie_trace, simulate
from scheduler_app.simulator.genie_fits import BATCH_FACTORS
from scheduler_app.simulator.workloads import genie_fitted_catalog

CLUSTER = ClusterSpec(servers=4, gpus_per_server=8, cpus_per_server=24, mem_gb_per_server=500.0)


@dataclass(frozen=True)
class Scheduler:
    label: str
    policy: str
    allocator: str
    mode: str = "rounds"
    # Keyword arguments of the policy (policies/swaf.py's plannable_share=None: SWAF without guarantees).
    policy_kwargs: tuple[tuple[str, object], ...] = ()

    def policy_obj(self) -> Policy:
        return POLICIES.get(self.policy)(**dict(self.policy_kwargs))


BASELINES = (
    Scheduler("FIFO", "fifo", "proportional"),
    Scheduler("EDF", "edf", "proportional"),
    Scheduler("SJF", "sjf", "proportional"),
    Scheduler("FIFO+tune", "fifo", "tune"),
    Scheduler("EDF+tune", "edf", "tune"),
    Scheduler("SJF+tune", "sjf", "tune"),
)
SWAF_FAMILY = (
    Scheduler("SWAF", "swaf", "proportional"),
    Scheduler("combined SWAF+tune", "swaf", "tune"),
    Scheduler("GENIE (SWAF+genie)", "swaf", "genie"),
    Scheduler("GENIE, event-driven", "swaf", "genie", "events"),
)
# Ablation: GENIE's placement under the baselines' orders (not in GENIE's comparison).
ABLATION = (
    Scheduler("FIFO+genie", "fifo", "genie"),
    Scheduler("EDF+genie", "edf", "genie"),
    Scheduler("SJF+genie", "sjf", "genie"),
    Scheduler("SWAF+genie without guarantees", "swaf", "genie", policy_kwargs=(("plannable_share", None),)),
)


def log(msg: str) -> None:
    sys.stderr.write(msg + "\n")
    sys.stderr.flush()


def run_all(
    jobs: int,
    loads: list[float],
    seeds: list[int],
    schedulers: tuple[Scheduler, ...],
    batch_factors: tuple[float, ...] = (),
    gpu_ranges: bool = False,
    restarts: dict[str, Any] | None = None,
    workers: int = 1,
) -> list[dict]:
    """Every scheduler on genie_trace at every load and seed (`batch_factors`: the predictor in the loop;
    `gpu_ranges`: GPU-count choices for genie; `restarts`: simulate()'s restart arguments), in
    `workers` processes; rows in (load, seed, scheduler) order whatever the number of workers."""
    runs = [
        _Run(jobs, load, seed, s, tuple(batch_factors), gpu_ranges, restarts)
        for load in loads
        for seed in seeds
        for s in schedulers
    ]
    # Longest first (the workers take runs in this order): a long run started last would leave the
    # other workers idle at the end. The rows go back to the runs' order.
    longest_first = sorted(range(len(runs)), key=lambda i: _cost_rank(runs[i]), reverse=True)
    done = parallel_map(_run_one, [runs[i] for i in longest_first], workers=workers)
    rows: list[dict] = [{}] * len(runs)
    for i, row in zip(longest_first, done, strict=True):
        rows[i] = row
    for load in loads:
        for seed in seeds:
            log(f"  load {load:g} seed {seed}: {len(schedulers)} schedulers done")
    return rows


@dataclass(frozen=True)
class _Run:
    """One simulation of run_all, as plain data for a worker process."""

    jobs: int
    load: float
    seed: int
    scheduler: Scheduler
    batch_factors: tuple[float, ...]
    gpu_ranges: bool
    restarts: dict[str, Any] | None


def _cost_rank(run: _Run) -> tuple[bool, bool, bool, bool, float]:
    """How long a run takes, as a sort key (CPU measured 2026-11-29 at 4 jobs/h: genie's runs 3.3 to
    5.3 s, SWAF + tune 2.5, SWAF and the tune baselines 0.8 to 1.8, the proportional ones 0.4 to
    0.9; a higher load takes longer, the event mode longer than rounds)."""
    s = run.scheduler
    return (s.allocator == "genie", s.policy == "swaf", s.allocator == "tune", s.mode == "events", run.load)


@lru_cache(maxsize=8)
def _trace(jobs: int, load: float, seed: int, batch_factors: tuple[float, ...], gpu_ranges: bool) -> list:
    return genie_trace(
        jobs, jobs_per_hour=load, seed=seed, batch_factors=batch_factors, gpu_ranges=gpu_ranges
    )


@lru_cache(maxsize=4)
def _catalog(batch_factors: tuple[float, ...]) -> dict | None:
    return genie_fitted_catalog(batch_factors) if batch_factors else None


def _run_one(run: _Run) -> dict:
    s = run.scheduler
    r = simulate(
        _trace(run.jobs, run.load, run.seed, run.batch_factors, run.gpu_ranges),
        CLUSTER,
        policy=s.policy_obj(),
        allocator=s.allocator,
        mode=s.mode,
        catalog=_catalog(run.batch_factors),
        **(run.restarts or {}),
    )
    return {
        "scheduler": s.label,
        "load": run.load,
        "seed": run.seed,
        "qos_pct": r.qos.met_pct,
        "makespan_h": r.makespan_h,
        "avg_jct_h": r.avg_jct_h,
        "tardiness_h": r.qos.tardiness_h,
        "wall_s": r.wall_s,
        **restart_axis.restart_figures(r),
    }


def mean_of(rows: list[dict], label: str, load: float, key: str) -> float:
    return statistics.fmean(r[key] for r in rows if r["scheduler"] == label and r["load"] == load)


def table(rows: list[dict], loads: list[float], labels: list[str]) -> str:
    out = [
        "| jobs/h | scheduler | QoS met % | makespan h | avg JCT h | tardiness h |",
        "|---|---|---|---|---|---|",
    ]
    for load in loads:
        best_qos = max(mean_of(rows, lab, load, "qos_pct") for lab in labels)
        for lab in labels:
            qos = mean_of(rows, lab, load, "qos_pct")
            mark = " **(best)**" if qos == best_qos else ""
            makespan_h, jct_h, tardy_h = (
                mean_of(rows, lab, load, key) for key in ("makespan_h", "avg_jct_h", "tardiness_h")
            )
            out.append(
                f"| {load:g} | {lab} | {qos:.1f}{mark} | {makespan_h:.1f} | {jct_h:.1f} | {tardy_h:.1f} |"
            )
    return "\n".join(out)


def gains_table(rows: list[dict], loads: list[float], ours: str, baselines: list[str]) -> str:
    out = [
        f"| jobs/h | {ours} vs | QoS met, points | QoS met, relative | makespan change |",
        "|---|---|---|---|---|",
    ]
    for load in loads:
        q0, m0 = mean_of(rows, ours, load, "qos_pct"), mean_of(rows, ours, load, "makespan_h")
        for b in baselines:
            qb, mb = mean_of(rows, b, load, "qos_pct"), mean_of(rows, b, load, "makespan_h")
            rel = f"{100 * (q0 - qb) / qb:+.1f} %" if qb > 0 else "-"
            out.append(f"| {load:g} | {b} | {q0 - qb:+.1f} | {rel} | {100 * (m0 - mb) / mb:+.1f} % |")
    return "\n".join(out)


def headline(rows: list[dict], load: float, baselines: list[str]) -> str:
    """GENIE's QoS gain over the best baseline at `load` (issue 15's +50 % bar) and its makespan change."""
    genie = "GENIE (SWAF+genie)"
    best = max(baselines, key=lambda b: mean_of(rows, b, load, "qos_pct"))
    q0, qb = mean_of(rows, genie, load, "qos_pct"), mean_of(rows, best, load, "qos_pct")
    m0 = mean_of(rows, genie, load, "makespan_h")
    makespans = ", ".join(
        f"{b} {100 * (m0 / mean_of(rows, b, load, 'makespan_h') - 1):+.1f} %" for b in baselines
    )
    gain = f"{100 * (q0 - qb) / qb:+.1f} %" if qb > 0 else "-"
    return (
        f"**At {load:g} jobs/h** GENIE meets {q0:.1f} % of deadlines, the best baseline ({best}) {qb:.1f} %: "
        f"{gain} relative (GENIE's paper: up to +67.4 %). GENIE's makespan against each baseline: "
        f"{makespans} (GENIE's paper: up to -28.2 %)."
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="fewer jobs, loads and seeds (a minute)")
    parser.add_argument("--json", type=Path, help="also write every run's figures here")
    parser.add_argument(
        "--predictor", action="store_true", help="per-job batch sizes, timed by GENIE's fitted predictor"
    )
    parser.add_argument(
        "--gpu-ranges", action="store_true", help="multi-GPU jobs accept fewer GPUs (genie picks the count)"
    )
    restart_axis.add_arguments(parser)
    add_workers_argument(parser)
    args = parser.parse_args()
    logging.getLogger("scheduler_app").setLevel(logging.WARNING)
    jobs, loads, seeds = (100, [1.0, 3.0], [1]) if args.quick else (300, [1.0, 2.0, 3.0, 4.0], [1, 2, 3])
    if args.restart_costs:
        restarts_main(args, jobs, loads[-1], seeds)
        return
    started = time.perf_counter()
    schedulers = BASELINES + SWAF_FAMILY + ABLATION
    rows = run_all(
        jobs,
        loads,
        seeds,
        schedulers,
        BATCH_FACTORS if args.predictor else (),
        args.gpu_ranges,
        workers=args.workers,
    )
    command = "python -m bench.reproduce_genie" + (" --quick" if args.quick else "")
    command += " --predictor" if args.predictor else ""
    command += " --gpu-ranges" if args.gpu_ranges else ""
    print(
        f"### GENIE workload, {jobs} jobs, {CLUSTER.servers} x {CLUSTER.gpus_per_server} GPUs, "
        f"seeds {','.join(map(str, seeds))} (means)\n\nCommand: `{command}`\n"
    )
    main_labels = [s.label for s in BASELINES + SWAF_FAMILY]
    print(table(rows, loads, main_labels))
    print("\n**GENIE against each baseline** (positive QoS and negative makespan are improvements)\n")
    print(gains_table(rows, loads, "GENIE (SWAF+genie)", [s.label for s in BASELINES[:3]]))
    print("\n**Combined SWAF+tune against each baseline and against GENIE**\n")
    print(
        gains_table(rows, loads, "combined SWAF+tune", [s.label for s in BASELINES] + ["GENIE (SWAF+genie)"])
    )
    print("\n" + headline(rows, loads[-1], [s.label for s in BASELINES]))
    print("\n**Ablation: GENIE's placement under the baselines' orders**\n")
    print(table(rows, loads, [s.label for s in ABLATION] + ["GENIE (SWAF+genie)"]))
    print(f"\n(total wall time {time.perf_counter() - started:.0f} s)")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))


GENIE = "GENIE (SWAF+genie)"


def restarts_main(args: argparse.Namespace, jobs: int, load: float, seeds: list[int]) -> None:
    """GENIE's QoS-guarantee gain over the best baseline at `load`, at each restart cost; every
    scheduler pays the same costs (bench/restart_axis.py)."""
    costs = restart_axis.costs_of(args.restart_costs)
    costs = costs if 0.0 in costs else (0.0, *costs)
    policy = restart_axis.policy_of(args)
    started = time.perf_counter()
    schedulers = (*BASELINES, SWAF_FAMILY[2])
    labels = [s.label for s in schedulers]
    command = "python -m bench.reproduce_genie" + (" --quick" if args.quick else "")
    command += restart_axis.command_options(args)
    print(
        f"### GENIE with restart costs, {jobs} jobs, {load:g} jobs/h, {CLUSTER.servers} x "
        f"{CLUSTER.gpus_per_server} GPUs, seeds {','.join(map(str, seeds))} (means)\n\nCommand: `{command}`\n"
    )
    print(
        f"Per restart: the cost's start-up ({restart_axis.startup_note(args)}) and the work since the "
        f"last checkpoint (every {restart_axis.CHECKPOINT_EVERY_S:g} s of run) done again; "
        f"{restart_axis.policy_note(policy)}. "
        "Cost 0: free restarts, no guard (the paper's setting).\n"
    )
    headline_rows, detail_rows, gain0 = [], [], None
    all_rows: list[dict] = []
    for cost_s in costs:
        rows = run_all(
            jobs,
            [load],
            seeds,
            schedulers,
            restarts=restart_axis.simulate_kwargs(
                cost_s, policy, first_start_waits=not args.free_first_start
            ),
            workers=args.workers,
        )
        for r in rows:
            r["restart_cost_s"] = cost_s
        all_rows += rows
        best = max(labels[:-1], key=lambda b: mean_of(rows, b, load, "qos_pct"))
        q0, qb = mean_of(rows, GENIE, load, "qos_pct"), mean_of(rows, best, load, "qos_pct")
        gain = (q0 - qb) / qb if qb > 0 else float("nan")
        gain0 = gain if gain0 is None else gain0
        headline_rows.append(
            f"| {restart_axis.cost_label(cost_s)} | {q0:.1f} | {best}: {qb:.1f} | {100 * gain:+.1f} % | "
            f"{restart_axis.kept_pct(gain0, gain):.0f} % | "
            + " | ".join(
                f"{mean_of(rows, lab, load, key):.{digits}f}"
                for lab in (GENIE, best)
                for key, digits in (("preemptions_per_job", 2), ("lost_gpu_h", 1))
            )
            + " |"
        )
        for lab in labels:
            figures = " | ".join(
                f"{mean_of(rows, lab, load, key):.{digits}f}"
                for key, digits in (
                    ("qos_pct", 1),
                    ("avg_jct_h", 1),
                    ("makespan_h", 1),
                    ("preemptions_per_job", 2),
                    ("moves_per_job", 2),
                    ("lost_gpu_h", 1),
                )
            )
            detail_rows.append(f"| {restart_axis.cost_label(cost_s)} | {lab} | {figures} |")
        log(f"  restart cost {cost_s:g} s done ({time.perf_counter() - started:.0f} s): {headline_rows[-1]}")
    print(
        "| restart cost | GENIE QoS met % | best baseline, QoS met % | GENIE's gain (relative) | "
        "share of the zero-cost gain kept | GENIE: preemptions per job | GENIE: GPU-h lost | "
        "best baseline: preemptions per job | best baseline: GPU-h lost |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    print("\n".join(restart_axis.by_cost(headline_rows)))
    print("\n**Every scheduler** (means over seeds; GPU-h lost to restarts per run)\n")
    print(
        "| restart cost | scheduler | QoS met % | avg JCT h | makespan h | preemptions per job | "
        "moves per job | GPU-h lost |"
    )
    print("|---|---|---|---|---|---|---|---|")
    print("\n".join(restart_axis.by_cost(detail_rows)))
    print(f"\n(total wall time {time.perf_counter() - started:.0f} s)")
    if args.json:
        args.json.write_text(json.dumps(all_rows, indent=1))


if __name__ == "__main__":
    main()
