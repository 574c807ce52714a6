"""Reproduce Synergy's headline figures (PAPERS.md section 6) with Attune's simulator, as Markdown tables."""

from __future__ import annotations

import argparse
import json
import logging
import time
from collections.abc import Callable
from dataclasses import replace
from functools import partial
from pathlib import Path

from bench import restart_axis, synergy_runs
from bench.common import add_workers_argument
from bench.synergy_capacity import capacity_rows, capacity_section
from bench.synergy_opt import opt_section, opt_workload_rows
from bench.synergy_restarts import restarts_section
from bench.synergy_runs import DEFAULT_DATA_DIR, TWO_WAY, SideTask, prefetch, preload
from bench.synergy_sweeps import Config, Sweep, load_section, multi_section, sweep_keys
from bench.synergy_tables import log
from bench.synergy_testbed import dynamic_section, static_section

# -- driver -------------------------------------------------------------------------------------------------
SINGLE_LOADS = (6.0, 7.0, 8.0, 9.0, 10.0, 11.0)
HEADLINE_LOADS = (6.0, 7.0, 8.0, 8.5, 9.0, 10.0, 11.0)  # finer around saturation (about 7.5-9 jobs/h)
# The image-heavy mix saturates the cluster at about 7.7 (proportional) and 7.9-8.4 jobs/h (tune).
IMAGE_LOADS = (6.0, 7.0, 7.5, 8.0, 8.25, 8.5, 9.0)
# The equal split saturates at about 7.7 (proportional) and 9.7 jobs/h (fluid LP).
EQUAL_LOADS = (6.0, 7.0, 8.0, 9.0, 10.0)
MULTI_LOADS = (3.0, 3.5, 4.0, 4.5, 5.0)
FULL = Config(
    # Arrivals go on after the measured window (ids 4000-4999), up to job 7000; the reference's
    # stream has no end. Past proportional's saturation point that matters for SRTF and LAS, where
    # later jobs overtake: --jobs makes the stream longer (docs/reproduction.md, b2).
    jobs=7000,
    window=(4000, 5000),
    position_windows=((1000, 2000), (2000, 3000), (3000, 4000), (4000, 5000)),
    sweeps=(
        Sweep("fifo", "20,70,10", False, HEADLINE_LOADS, (1, 2, 3), TWO_WAY),
        Sweep("fifo", "33,33,33", False, EQUAL_LOADS, (1, 2, 3), TWO_WAY),
        Sweep("fifo", "50,0,50", False, IMAGE_LOADS, (1,), TWO_WAY),
        Sweep("srtf", "20,70,10", False, SINGLE_LOADS, (1,), TWO_WAY),
        Sweep("srtf", "33,33,33", False, EQUAL_LOADS, (1,), TWO_WAY),
        Sweep("srtf", "50,0,50", False, IMAGE_LOADS, (1,), TWO_WAY),
        Sweep("las", "20,70,10", False, (8.0, 10.0, 12.0, 14.0), (1,), TWO_WAY),
    ),
    position_sweep=Sweep("fifo", "20,70,10", False, HEADLINE_LOADS, (1, 2, 3), TWO_WAY),
    multi_sweeps=tuple(
        Sweep(p, split, True, MULTI_LOADS, (1,), TWO_WAY)
        for split in ("20,70,10", "33,33,33")
        for p in ("fifo", "srtf", "las")
    ),
    opt_jobs=3000,
    opt_every=60,
    opt_workloads=(
        ("20,70,10", False, 9.0),
        ("33,33,33", False, 9.0),
        ("50,0,50", False, 9.0),
        ("20,70,10", True, 4.5),
    ),
)
QUICK = Config(
    jobs=3000,
    window=(2000, 3000),
    position_windows=((1000, 2000), (2000, 3000)),
    sweeps=(Sweep("fifo", "20,70,10", False, (6.0, 9.0), (1,), ("proportional", "tune")),),
    position_sweep=Sweep("fifo", "20,70,10", False, (6.0, 9.0), (1,), ("proportional", "tune")),
    multi_sweeps=(),
    opt_jobs=1000,
    opt_every=60,
    opt_workloads=(("20,70,10", False, 9.0), ("50,0,50", False, 9.0)),
)
# Rough costs of the side tasks in the units of synergy_runs._RUN_COST_S (2026-12-01, one after the
# other: 54 s for the OPT section's four workloads, 11 s for the capacity table): their place among the runs.
OPT_WORKLOAD_COST_S = 7.0
CAPACITY_COST_S = 6.0
SECTIONS = ("static", "dynamic", "capacity", "load", "multi", "opt")
# Run only when asked (--sections restarts, or --restart-costs): the restart-cost axis of the headlines.
RESTARTS = "restarts"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="a small grid (minutes) exercising every table")
    parser.add_argument("--data-dir", type=Path, default=DEFAULT_DATA_DIR, help="reference traces' folder")
    parser.add_argument(
        "--sections", default=",".join(SECTIONS), help=f"comma list of {', '.join((*SECTIONS, RESTARTS))}"
    )
    restart_axis.add_arguments(parser)
    parser.add_argument("--json", type=Path, help="also write every simulated run's window JCTs here")
    parser.add_argument(
        "--reuse", type=Path, help="a --json file of an earlier run: its simulations are not repeated"
    )
    parser.add_argument(
        "--progress", type=Path, help="append every run here as it finishes (JSON lines; resume with --reuse)"
    )
    parser.add_argument(
        "--sweeps",
        help="only these load sweeps, a comma list of policy:split[:multi] (fifo:20,70,10 is "
        "'fifo:20-70-10'; the multi-GPU one 'fifo:20-70-10:multi')",
    )
    parser.add_argument(
        "--jobs",
        type=int,
        help="jobs per generated sweep trace (default 7000); more keeps arrivals coming longer after it",
    )
    add_workers_argument(parser)
    args = parser.parse_args()
    logging.getLogger("scheduler_app").setLevel(logging.WARNING)  # no per-run INFO lines

    cfg = QUICK if args.quick else FULL
    if args.jobs is not None:
        if args.jobs < cfg.window[1]:
            parser.error(f"--jobs must be at least {cfg.window[1]}, the end of the measured window")
        cfg = replace(cfg, jobs=args.jobs)
    if args.sweeps:
        wanted_sweeps = set(args.sweeps.split(","))
        cfg = replace(
            cfg,
            sweeps=tuple(x for x in cfg.sweeps if x.key in wanted_sweeps),
            position_sweep=cfg.position_sweep if "fifo:20-70-10" in wanted_sweeps else None,
            multi_sweeps=tuple(x for x in cfg.multi_sweeps if x.key in wanted_sweeps),
        )
    synergy_runs.progress_to(args.progress)
    if args.reuse:
        preload(args.reuse)
    wanted = set(args.sections.split(","))
    if args.restart_costs and args.sections == ",".join(SECTIONS):
        wanted = {RESTARTS}
    unknown = wanted - {*SECTIONS, RESTARTS}
    if unknown:
        parser.error(f"unknown sections {sorted(unknown)}; valid: {', '.join(SECTIONS)}")
    command = "python -m bench.reproduce_synergy" + (" --quick" if args.quick else "")
    if args.sections != ",".join(SECTIONS):
        command += f" --sections {args.sections}"
    command += restart_axis.command_options(args)
    if args.sweeps:
        command += f" --sweeps {args.sweeps}"
    if args.jobs is not None:
        command += f" --jobs {args.jobs}"
    started = time.perf_counter()
    # The sweeps' runs are independent: made up front on every core, then the tables read them. The
    # OPT section's workloads and the capacity table are worked out beside them (each tens of seconds).
    side_tasks: list[SideTask] = []
    if "opt" in wanted:
        side_tasks += [
            (OPT_WORKLOAD_COST_S, partial(opt_workload_rows, cfg.opt_jobs, cfg.opt_every, w))
            for w in cfg.opt_workloads
        ]
    if "capacity" in wanted:
        side_tasks.append((CAPACITY_COST_S, partial(capacity_rows, cfg.jobs, cfg.sweeps[0].seeds)))
    side = prefetch(sweep_keys(cfg, wanted), args.workers, side_tasks)
    opt_rows = side[: len(cfg.opt_workloads)] if "opt" in wanted else None
    capacity = side[-1] if "capacity" in wanted else None
    steps: dict[str, Callable[[], None]] = {
        "static": lambda: static_section(args.data_dir, command),
        "dynamic": lambda: dynamic_section(args.data_dir, command),
        "capacity": lambda: capacity_section(command, cfg.jobs, cfg.sweeps[0].seeds, capacity),
        "load": lambda: load_section(cfg, command),
        "multi": lambda: multi_section(cfg, command),
        "opt": lambda: opt_section(command, cfg.opt_jobs, cfg.opt_every, cfg.opt_workloads, opt_rows),
        RESTARTS: lambda: restarts_section(args, cfg, command),
    }
    for name in (*SECTIONS, RESTARTS):
        if name in wanted:
            t0 = time.perf_counter()
            steps[name]()
            log(f"[{name}: {time.perf_counter() - t0:.0f} s]")
    print(f"\n(total wall time {time.perf_counter() - started:.0f} s)")
    if args.json:
        args.json.write_text(json.dumps(synergy_runs.runs_recorded(), indent=1))


if __name__ == "__main__":
    main()
