"""One default for both papers (issue 15, point 6): candidate pairs against the best specialised scheduler.

Run: `python -m bench.default_pair` (`--quick`: a small grid in minutes; `--json PATH`: every figure).
Synergy's load sweeps (bench.reproduce_synergy: 128 GPUs, round-end convention, mean JCT of a job-id
window, stop when measured) are measured by average JCT against the specialised fifo+tune (FIFO sweep
rows) and srtf+tune (SRTF sweep rows); GENIE's workload (bench.reproduce_genie: genie_trace on 4 x 8
GPUs, means over seeds) by the QoS-guarantee rate against swaf+genie. A candidate runs once per
workload, so a FIFO row and an SRTF row of the same workload share its figure. The full grid (FULL
below, about 30 minutes on 2 shared cores): Synergy 7,000 jobs, ids [4000, 5000), seed 1, split
(20,70,10), single-GPU at 6 and 9 jobs/h and multi-GPU at 3, 4.5 jobs/h; GENIE 300 jobs, seeds 1-3,
1 to 4 jobs/h. The printed header repeats what was run.
"""

from __future__ import annotations

import argparse
import json
import logging
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from bench import restart_axis
from bench.common import add_workers_argument
from bench.reproduce_genie import CLUSTER as GENIE_CLUSTER
from bench.reproduce_genie import Scheduler, mean_of, run_all
from bench.synergy_runs import BIG_CLUSTER, SPLITS, Workload, prefetch, run_windows
from bench.synergy_tables import log, md_table
from scheduler_app.core.restarts import RestartPolicy

GAP_LIMIT = 0.05  # "within 5 % of the best specialised scheduler"


@dataclass(frozen=True)
class Pair:
    policy: str
    allocator: str

    @property
    def label(self) -> str:
        return f"{self.policy}+{self.allocator}"


SHIPPED = Pair("swaf", "genie")  # config/settings.py: ATTUNE_POLICY and ATTUNE_ALLOCATOR defaults
CANDIDATES = (
    SHIPPED,
    Pair("sjf", "genie"),
    Pair("srtf", "genie"),
    Pair("swaf", "tune"),
    Pair("fifo", "tune"),  # the default before
)
SYNERGY_SPECIALISED = {"fifo": Pair("fifo", "tune"), "srtf": Pair("srtf", "tune")}
GENIE_SPECIALISED = Pair("swaf", "genie")


@dataclass(frozen=True)
class Grid:
    jobs: int
    window: tuple[int, int]
    seed: int
    split: str
    single_loads: tuple[float, ...]
    multi_loads: tuple[float, ...]
    genie_jobs: int
    genie_loads: tuple[float, ...]
    genie_seeds: tuple[int, ...]


FULL = Grid(
    jobs=7000,
    window=(4000, 5000),
    seed=1,
    split="20,70,10",
    single_loads=(6.0, 9.0),
    multi_loads=(3.0, 4.5),
    genie_jobs=300,
    genie_loads=(1.0, 2.0, 3.0, 4.0),
    genie_seeds=(1, 2, 3),
)
QUICK = Grid(
    jobs=1500,
    window=(1000, 1500),
    seed=1,
    split="20,70,10",
    single_loads=(9.0,),
    multi_loads=(4.5,),
    genie_jobs=100,
    genie_loads=(1.0, 3.0),
    genie_seeds=(1,),
)


@dataclass(frozen=True)
class Row:
    """One benchmark row: the specialised scheduler's figure and each candidate's."""

    name: str
    metric: str  # "jct_h" (lower is better) or "qos_pct" (higher is better)
    specialised: Pair
    best: float
    candidates: dict[str, float]

    def gap(self, value: float) -> float:
        """Relative shortfall against the specialised figure (positive: worse; <= 0.05 passes)."""
        if self.metric == "jct_h":
            return value / self.best - 1.0
        return (self.best - value) / self.best if self.best > 0 else 0.0

    def cell(self, value: float) -> str:
        if self.metric == "jct_h":
            return f"{value:.2f} ({100 * self.gap(value):+.1f} %)"
        return f"{value:.1f} ({self.best - value:+.1f} pt, {100 * self.gap(value):+.1f} %)"


def synergy_rows(grid: Grid, workers: int = 1, restart_cost_s: float = 0.0) -> list[Row]:
    """FIFO and SRTF sweep rows for every (single/multi-GPU, load) workload of the grid; the runs are
    made first, `workers` at a time; every scheduler pays `restart_cost_s` per restart (0: free)."""
    rows: list[Row] = []
    workloads = [(False, load) for load in grid.single_loads] + [(True, load) for load in grid.multi_loads]
    pairs = [*CANDIDATES, *SYNERGY_SPECIALISED.values()]
    prefetch(
        [
            (
                Workload(grid.jobs, load, SPLITS[grid.split], multi, grid.seed),
                p.policy,
                p.allocator,
                (grid.window,),
                float(restart_cost_s),
            )
            for multi, load in workloads
            for p in pairs
        ],
        workers,
    )
    for multi, load in workloads:
        w = Workload(grid.jobs, load, SPLITS[grid.split], multi, grid.seed)

        def jct(pair: Pair, w: Workload = w) -> float:
            return run_windows(w, pair.policy, pair.allocator, [grid.window], restart_cost_s)[grid.window]

        figures = {p.label: jct(p) for p in CANDIDATES}
        kind = "multi-GPU" if multi else "1 GPU"
        for sweep, special in SYNERGY_SPECIALISED.items():
            rows.append(
                Row(
                    f"Synergy {sweep.upper()}, {kind}, {load:g} jobs/h",
                    "jct_h",
                    special,
                    figures.get(special.label) or jct(special),
                    figures,
                )
            )
    return rows


def genie_rows(
    grid: Grid, workers: int = 1, restart_cost_s: float = 0.0
) -> tuple[list[Row], list[dict[str, Any]]]:
    """One row per arrival rate: mean QoS-guarantee rate over the seeds (the raw runs too); every
    scheduler pays `restart_cost_s` per restart (0: free)."""
    restarts = restart_axis.simulate_kwargs(restart_cost_s, RestartPolicy()) if restart_cost_s else None
    pairs = list(CANDIDATES) + ([GENIE_SPECIALISED] if GENIE_SPECIALISED not in CANDIDATES else [])
    schedulers = tuple(Scheduler(p.label, p.policy, p.allocator) for p in pairs)
    runs = run_all(
        grid.genie_jobs,
        list(grid.genie_loads),
        list(grid.genie_seeds),
        schedulers,
        restarts=restarts,
        workers=workers,
    )
    rows = [
        Row(
            f"GENIE, {load:g} jobs/h",
            "qos_pct",
            GENIE_SPECIALISED,
            mean_of(runs, GENIE_SPECIALISED.label, load, "qos_pct"),
            {p.label: mean_of(runs, p.label, load, "qos_pct") for p in CANDIDATES},
        )
        for load in grid.genie_loads
    ]
    return rows, runs


def verdicts(rows: list[Row]) -> dict[str, tuple[float, str, bool]]:
    """Per candidate: worst gap over all rows, the row it is on, and whether every gap is within 5 %."""
    out = {}
    for p in CANDIDATES:
        gaps = [(r.gap(r.candidates[p.label]), r.name) for r in rows]
        worst, where = max(gaps)
        out[p.label] = (worst, where, worst <= GAP_LIMIT)
    return out


def print_report(
    grid: Grid, command: str, rows: list[Row], restart_cost_s: float = 0.0
) -> dict[str, tuple[float, str, bool]]:
    seeds = ",".join(str(s) for s in grid.genie_seeds)
    restarts = (
        f"every restart costs {restart_cost_s:g} s of start-up and the work since the last checkpoint "
        f"(every {restart_axis.CHECKPOINT_EVERY_S:g} s), the live move guard weighing it "
        "(bench/restart_axis.py)"
        if restart_cost_s
        else "restarts are free (the papers' setting)"
    )
    print(
        f"### One default for both papers: candidates against the best specialised scheduler\n\n"
        f"Command: `{command}`\n\n"
        f"- Synergy: {BIG_CLUSTER.servers} x {BIG_CLUSTER.gpus_per_server} GPUs, {grid.jobs:,} generated "
        f"jobs, split ({grid.split}), seed {grid.seed}, mean JCT (h) of ids [{grid.window[0]}, "
        f"{grid.window[1]}), round-end convention; single-GPU at "
        f"{', '.join(f'{x:g}' for x in grid.single_loads)} jobs/h, multi-GPU (1/2/4/8 GPUs) at "
        f"{', '.join(f'{x:g}' for x in grid.multi_loads)} jobs/h. Specialised: fifo+tune (FIFO rows), "
        f"srtf+tune (SRTF rows). Cell: JCT (candidate / best - 1).\n"
        f"- GENIE: genie_trace, {grid.genie_jobs} jobs, {GENIE_CLUSTER.servers} x "
        f"{GENIE_CLUSTER.gpus_per_server} GPUs, seeds {seeds} (mean), QoS-guarantee rate (%). "
        f"Specialised: swaf+genie. Cell: rate (best - candidate in points, relative).\n"
        f"- Restarts: {restarts}.\n"
        f"- A positive gap is worse than the specialised scheduler; within 5 % means every gap <= +5 %.\n"
    )
    labels = [p.label for p in CANDIDATES]
    table: list[list[Any]] = []
    for r in rows:
        unit = "h" if r.metric == "jct_h" else "%"
        best = f"{r.best:.2f} h" if unit == "h" else f"{r.best:.1f} %"
        table.append([r.name, f"{r.specialised.label}: {best}"] + [r.cell(r.candidates[x]) for x in labels])
    result = verdicts(rows)
    table.append(["**worst gap**", ""] + [f"{100 * result[x][0]:+.1f} % ({result[x][1]})" for x in labels])
    table.append(["**within 5 % everywhere?**", ""] + ["yes" if result[x][2] else "**no**" for x in labels])
    shipped = [f"{x} (shipped)" if x == SHIPPED.label else x for x in labels]
    print(md_table(["row", "best specialised", *shipped], table))
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a small grid (a few minutes)")
    parser.add_argument("--json", type=Path, help="also write every figure here")
    parser.add_argument(
        "--restart-cost",
        type=float,
        default=0.0,
        help="seconds of start-up per restart for every scheduler, with the live move guard (0: free)",
    )
    add_workers_argument(parser)
    args = parser.parse_args()
    if args.restart_cost < 0:
        parser.error(f"--restart-cost must be >= 0 s, got {args.restart_cost:g}")
    logging.getLogger("scheduler_app").setLevel(logging.WARNING)
    grid = QUICK if args.quick else FULL
    command = "python -m bench.default_pair" + (" --quick" if args.quick else "")
    command += f" --restart-cost {args.restart_cost:g}" if args.restart_cost else ""
    started = time.perf_counter()
    rows = synergy_rows(grid, args.workers, args.restart_cost)
    log(f"[synergy: {time.perf_counter() - started:.0f} s]")
    t0 = time.perf_counter()
    g_rows, genie_runs = genie_rows(grid, args.workers, args.restart_cost)
    log(f"[genie: {time.perf_counter() - t0:.0f} s]")
    rows += g_rows
    result = print_report(grid, command, rows, args.restart_cost)
    print(f"\n(total wall time {time.perf_counter() - started:.0f} s)")
    if args.json:
        payload = {
            "grid": asdict(grid),
            "restart_cost_s": args.restart_cost,
            "rows": [
                {
                    **asdict(r),
                    "specialised": r.specialised.label,
                    "gaps": {k: r.gap(v) for k, v in r.candidates.items()},
                }
                for r in rows
            ],
            "verdicts": {k: {"worst_gap": g, "row": w, "within": ok} for k, (g, w, ok) in result.items()},
            "genie_runs": genie_runs,
        }
        args.json.write_text(json.dumps(payload, indent=1))


if __name__ == "__main__":
    main()
