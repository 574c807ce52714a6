"""The Synergy headlines with restart costs (issue 36): tune against proportional at each cost."""

from __future__ import annotations

import argparse
import statistics
from typing import Any

from bench import restart_axis
from bench.synergy_runs import (
    BIG_CLUSTER,
    SPLITS,
    STATIC_TRACE,
    TESTBED,
    TWO_WAY,
    Workload,
    make_allocator,
    trace_for,
    window_jct,
)
from bench.synergy_sweeps import Config
from bench.synergy_tables import log, md_table, section, spread
from scheduler_app.simulator import SimulationResult, read_trace, simulate

RESTART_LOAD = 9.0  # the load sweep's headline load (FIFO, split (20,70,10))


# -- the headlines with restart costs (issue 36) -----------------------------------------------------
def restart_row(
    cost_s: float,
    prop: list[SimulationResult],
    tune: list[SimulationResult],
    window: tuple[int, int],
    gain0: float | None,
) -> tuple[list[Any], float]:
    """One cost's row: JCTs and gain (means over seeds of the per-seed figures), kept share, restarts."""
    jct_p = [window_jct(r, [window])[window] for r in prop]
    jct_t = [window_jct(r, [window])[window] for r in tune]
    gain = statistics.fmean(p / t for p, t in zip(jct_p, jct_t, strict=True))
    ids = range(*window)
    fig_t = [restart_axis.restart_figures(r, ids) for r in tune]
    fig_p = [restart_axis.restart_figures(r, ids) for r in prop]

    def mean(figs: list[dict[str, float]], key: str) -> float:
        return statistics.fmean(f[key] for f in figs)

    kept = "100 %" if gain0 is None else f"{restart_axis.kept_pct(gain0 - 1, gain - 1):.0f} %"
    row = [
        restart_axis.cost_label(cost_s),
        spread(jct_p),
        spread(jct_t),
        f"{gain:.3f}x",
        kept,
        f"{mean(fig_t, 'preemptions_per_job'):.2f}",
        f"{mean(fig_t, 'moves_per_job'):.2f}",
        f"{mean(fig_t, 'lost_gpu_h'):.1f}",
        f"{mean(fig_p, 'preemptions_per_job'):.2f}",
        f"{mean(fig_p, 'lost_gpu_h'):.1f}",
    ]
    return row, gain


RESTART_HEADERS = [
    "restart cost",
    "proportional avg JCT h",
    "tune avg JCT h",
    "tune's gain",
    "share of the zero-cost gain kept",
    "tune: preemptions per job",
    "tune: moves per job",
    "tune: GPU-h lost to restarts",
    "proportional: preemptions per job",
    "proportional: GPU-h lost",
]


def restarts_section(args: argparse.Namespace, cfg: Config, command: str) -> None:
    """Tune's average-JCT gain over proportional on the static trace and at 9 jobs/h (FIFO, (20,70,10))
    at each restart cost (bench/restart_axis.py); both allocators pay the same costs."""
    costs = restart_axis.costs_of(args.restart_costs)
    costs = costs if 0.0 in costs else (0.0, *costs)
    policy = restart_axis.policy_of(args)
    section("With restart costs: tune against proportional, FIFO", command)
    print(
        f"Per restart: the cost's start-up ({restart_axis.startup_note(args)}), and the work since the "
        f"last checkpoint (every {restart_axis.CHECKPOINT_EVERY_S:g} s of run) done again; "
        f"{restart_axis.policy_note(policy)}. Cost 0: free restarts, no guard (the paper's setting)."
    )
    trace = read_trace(args.data_dir / STATIC_TRACE)
    rows, gain0 = [], None
    whole = (0, len(trace))
    for cost_s in costs:
        kw = restart_axis.simulate_kwargs(cost_s, policy, first_start_waits=not args.free_first_start)
        runs = [simulate(trace, TESTBED, policy="fifo", allocator=make_allocator(a), **kw) for a in TWO_WAY]
        row, gain = restart_row(cost_s, [runs[0]], [runs[1]], whole, gain0)
        gain0 = gain if gain0 is None else gain0
        rows.append(row)
        log(f"  static, restart cost {cost_s:g} s: {row}")
    print(f"\n**Static {len(trace)}-job trace, 4 x 8 GPUs, 300 s rounds, exact finishing** (all jobs)\n")
    print(md_table(RESTART_HEADERS, sorted(rows, key=restart_axis.cost_key)))

    seeds = cfg.sweeps[0].seeds if cfg.sweeps else (1,)
    rows, gain0 = [], None
    for cost_s in costs:
        kw = restart_axis.simulate_kwargs(cost_s, policy, first_start_waits=not args.free_first_start)
        results: dict[str, list[SimulationResult]] = {a: [] for a in TWO_WAY}
        for seed in seeds:
            w = Workload(cfg.jobs, RESTART_LOAD, SPLITS["20,70,10"], False, seed)
            for a in TWO_WAY:
                r = simulate(
                    trace_for(w),
                    BIG_CLUSTER,
                    policy="fifo",
                    allocator=make_allocator(a),
                    finish_at_round_end=True,
                    measured_job_ids=cfg.window,
                    stop_when_measured=True,
                    **kw,
                )
                results[a].append(r)
                log(
                    f"  load {RESTART_LOAD:g}/h seed {seed} {a}, restart cost {cost_s:g} s: avg JCT "
                    f"{r.avg_jct_h:.2f} h, {r.total_preemptions} preemptions, {r.restart_lost_gpu_h:.1f} "
                    f"GPU-h lost, {r.wall_s:.0f} s"
                )
        row, gain = restart_row(cost_s, results["proportional"], results["tune"], cfg.window, gain0)
        gain0 = gain if gain0 is None else gain0
        rows.append(row)
    print(
        f"\n**Load sweep's headline: {RESTART_LOAD:g} jobs/h, single-GPU, split (20,70,10), 128 GPUs, "
        f"{cfg.jobs:,} jobs, seeds {','.join(map(str, seeds))}, round-end convention** (mean JCT of ids "
        f"[{cfg.window[0]}, {cfg.window[1]}) and the gain: means over seeds; restarts of those jobs)\n"
    )
    print(md_table(RESTART_HEADERS, sorted(rows, key=restart_axis.cost_key)))
