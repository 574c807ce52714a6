"""Every figure of a fixed set of simulations, to check that a speed-up changed no result.

Run: `python -m bench.sim_identity --out after.json` in the new tree; in the old one (a `git worktree
add`), `PYTHONPATH=. python /path/to/new/bench/sim_identity.py --out before.json` (this file run
against the old tree's code); then `python -m bench.sim_identity --compare before.json after.json`
(exit status 1 if any run differs). `--only name,...` runs some of them.

Each run's `SimulationResult.to_dict()` is kept whole (every job's record, the utilisation series)
with its resource totals, wall time removed; the runs cover the reference traces under FIFO with
and without the round-end convention, progress-ordered policies, multi-GPU overload under every
allocator, restart costs, the move guard, a measured window, GENIE's workload and event mode, and
the what-if page's default grid (`simulation_compare`), and orders by progress and the clock (swaf
with aging, sjf with aging) whose plans simulator/reuse.py reuses round by round.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.synergy_runs import PolicyOrderTune
from scheduler_app.core.policies.aging import Aging
from scheduler_app.core.policies.sjf import SjfPolicy
from scheduler_app.core.restarts import RestartPolicy
from scheduler_app.simulator import ClusterSpec, read_trace, simulate
from scheduler_app.simulator.compare import SimulationRequest, simulation_compare, simulation_trace_build
from scheduler_app.simulator.metrics import SimulationResult
from scheduler_app.simulator.restart_costs import RestartCosts
from scheduler_app.simulator.workloads import genie_trace, philly_derived_trace

DATA = Path(__file__).resolve().parent.parent / "tests/data/synergy"
BIG = ClusterSpec(servers=16, gpus_per_server=8, cpus_per_server=24, mem_gb_per_server=500.0)
SMALL = ClusterSpec(servers=4, gpus_per_server=8, cpus_per_server=24, mem_gb_per_server=500.0)


def runs() -> dict[str, Callable[[], SimulationResult]]:
    ref = read_trace(DATA / "philly1gpu_l9_n1000_s42.csv")
    static = read_trace(DATA / "philly1gpu_static_n500_s42.csv")
    multi = philly_derived_trace(400, jobs_per_hour=12, multi_gpu=True, seed=3)
    heavy = philly_derived_trace(500, jobs_per_hour=14, seed=5)
    genie = genie_trace(150, seed=7)
    costs = RestartCosts(startup_s=120.0, checkpoint_every_s=600.0)
    return {
        "ref_fifo_tune_end": lambda: simulate(
            ref, BIG, policy="fifo", allocator="tune", finish_at_round_end=True
        ),
        "ref_fifo_prop_end": lambda: simulate(
            ref, BIG, policy="fifo", allocator="proportional", finish_at_round_end=True
        ),
        "ref_fifo_tune": lambda: simulate(ref, BIG, policy="fifo", allocator="tune"),
        "static_fifo_tune_end": lambda: simulate(
            static, BIG, policy="fifo", allocator="tune", finish_at_round_end=True
        ),
        "static_las_tune_end": lambda: simulate(
            static, BIG, policy="las", allocator="tune", finish_at_round_end=True
        ),
        "static_srtf_prop_end": lambda: simulate(
            static, BIG, policy="srtf", allocator="proportional", finish_at_round_end=True
        ),
        "multi_fifo_tune": lambda: simulate(multi, SMALL, policy="fifo", allocator="tune"),
        # The bench's policy-order tune: a tune round class with a `run` of its own.
        "static_ref_fifo_tune_ref": lambda: simulate(
            read_trace(DATA / "static_100job.csv"), SMALL, policy="fifo", allocator=PolicyOrderTune()
        ),
        "multi_fifo_greedy": lambda: simulate(multi, SMALL, policy="fifo", allocator="greedy"),
        "multi_fifo_tune_matrix": lambda: simulate(multi, SMALL, policy="fifo", allocator="tune_matrix"),
        "multi_fifo_prop": lambda: simulate(multi, SMALL, policy="fifo", allocator="proportional"),
        "multi_fifo_opt": lambda: simulate(multi[:120], SMALL, policy="fifo", allocator="opt"),
        "heavy_fifo_tune": lambda: simulate(heavy, BIG, policy="fifo", allocator="tune"),
        "heavy_fifo_prop_end": lambda: simulate(
            heavy, BIG, policy="fifo", allocator="proportional", finish_at_round_end=True
        ),
        "heavy_fifo_tune_costs": lambda: simulate(
            heavy, BIG, policy="fifo", allocator="tune", restart_costs=costs
        ),
        "heavy_fifo_tune_guard": lambda: simulate(
            heavy, BIG, policy="fifo", allocator="tune", restarts=RestartPolicy(), restart_costs=costs
        ),
        "heavy_fifo_tune_overhead": lambda: simulate(
            heavy, BIG, policy="fifo", allocator="tune", restart_overhead_s=60.0
        ),
        "heavy_fifo_tune_measured": lambda: simulate(
            heavy, BIG, policy="fifo", allocator="tune", measured_job_ids=(100, 300), stop_when_measured=True
        ),
        "genie_edf_genie_events": lambda: simulate(
            genie, SMALL, policy="edf", allocator="genie", mode="events"
        ),
        "genie_swaf_genie": lambda: simulate(genie, SMALL, policy="swaf", allocator="genie"),
        "genie_fifo_tune_events": lambda: simulate(
            genie, SMALL, policy="fifo", allocator="tune", mode="events"
        ),
        "genie_sjf_prop": lambda: simulate(genie, SMALL, policy="sjf", allocator="proportional"),
        # Orders by progress and the clock, whose plans are reused round by round (simulator/reuse.py):
        # swaf's aging and shortest-first tail on a trace without QoS targets, with genie, with and
        # without the guard; GENIE's workload (deadlines) under the guard; sjf with aging under tune.
        "multi_swaf_genie": lambda: simulate(multi, SMALL, policy="swaf", allocator="genie"),
        "multi_swaf_genie_guard": lambda: simulate(
            multi, SMALL, policy="swaf", allocator="genie", restarts=RestartPolicy(), restart_costs=costs
        ),
        "multi_swaf_genie_events": lambda: simulate(
            multi, SMALL, policy="swaf", allocator="genie", mode="events"
        ),
        "genie_swaf_genie_guard": lambda: simulate(
            genie, SMALL, policy="swaf", allocator="genie", restarts=RestartPolicy(), restart_costs=costs
        ),
        "heavy_sjf_aging_tune": lambda: simulate(
            heavy, BIG, policy=SjfPolicy(aging=Aging(factor=2.0, floor_s=0.0)), allocator="tune"
        ),
    }


def whatif() -> list[dict[str, Any]]:
    """The what-if page's default grid on a week at 9 jobs/h (bench.whatif_week's shape)."""
    request = SimulationRequest(num_jobs=1512, jobs_per_hour=9.0, seed=1)
    out = simulation_compare(request, trace=simulation_trace_build(request))
    for run in out:
        run.pop("wall_s", None)
    return out


def dump(only: set[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, run in runs().items():
        if only and name not in only:
            continue
        c0 = time.process_time()
        result = run()
        data = result.to_dict()
        data.pop("wall_s")
        data["totals"] = repr(result.totals)
        out[name] = data
        print(f"{name}: {time.process_time() - c0:.2f} s CPU, {result.rounds} rounds", file=sys.stderr)
    if not only or "whatif" in only:
        out["whatif"] = whatif()
    return out


def compare(before: dict[str, Any], after: dict[str, Any]) -> int:
    """Print the runs and keys that differ; return how many runs differ."""
    differing = 0
    for name in sorted(set(before) | set(after)):
        if name not in before or name not in after:
            print(f"{name}: only in {'after' if name not in before else 'before'}")
            differing += 1
        elif before[name] != after[name]:
            differing += 1
            keys = before[name].keys() if isinstance(before[name], dict) else ["(runs)"]
            changed = (
                [k for k in keys if before[name].get(k) != after[name].get(k)]
                if isinstance(before[name], dict)
                else list(keys)
            )
            print(f"{name}: differs in {', '.join(changed)}")
    print(f"{len(set(before) | set(after))} runs compared, {differing} differ")
    return differing


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="write every run's figures here")
    parser.add_argument("--compare", nargs=2, type=Path, metavar=("BEFORE", "AFTER"))
    parser.add_argument("--only", default="", help="comma list of run names (and 'whatif')")
    args = parser.parse_args()
    if args.compare:
        before, after = (json.loads(p.read_text()) for p in args.compare)
        sys.exit(1 if compare(before, after) else 0)
    if args.out is None:
        parser.error("--out or --compare")
    only = {n for n in args.only.split(",") if n}
    args.out.write_text(json.dumps(dump(only), sort_keys=True, indent=0, default=str))


if __name__ == "__main__":
    main()
