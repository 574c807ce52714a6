"""SWAF's guarantees under overload (core/policies/guarantees.py): QoS-guarantee rate against plain SWAF.

GENIE's workload with the predictor in the loop (as `bench.reproduce_genie --predictor`), SWAF + genie,
one arrival rate, several seeds, for each `plannable_share` (none = plain SWAF, the baseline of the
same run). Prints a Markdown table: QoS met %, its ratio to the baseline, makespan h.
Run: `python -m bench.swaf_guarantees [--load 4] [--seeds 1,2,3,4,5,6] [--mode events]
[--shares none,1.0,0.85,0.7,0.6,0.5,0.4,0.3]`.
"""

from __future__ import annotations

import argparse
import logging
import statistics
import sys
import time

from bench.reproduce_genie import CLUSTER
from scheduler_app.core.policies.swaf import SwafPolicy
from scheduler_app.simulator import genie_trace, simulate
from scheduler_app.simulator.genie_fits import BATCH_FACTORS
from scheduler_app.simulator.workloads import genie_fitted_catalog


def share_arg(text: str) -> float | None:
    return None if text == "none" else float(text)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--load", type=float, default=4.0, help="jobs per hour")
    parser.add_argument("--jobs", type=int, default=300)
    parser.add_argument("--seeds", default="1,2,3,4,5,6")
    parser.add_argument("--mode", choices=["events", "rounds"], default="events")
    parser.add_argument("--shares", default="none,1.0,0.85,0.7,0.6,0.5,0.4,0.3")
    args = parser.parse_args()
    logging.getLogger("scheduler_app").setLevel(logging.WARNING)
    seeds = [int(s) for s in args.seeds.split(",")]
    shares = [share_arg(s) for s in args.shares.split(",")]
    if shares[0] is not None:
        shares.insert(0, None)  # the baseline is always measured in the same run
    catalog = genie_fitted_catalog(BATCH_FACTORS)
    traces = {
        seed: genie_trace(args.jobs, jobs_per_hour=args.load, seed=seed, batch_factors=BATCH_FACTORS)
        for seed in seeds
    }
    started = time.perf_counter()
    rows: list[tuple[float | None, list[float], float]] = []
    for share in shares:
        met, makespans = [], []
        for seed in seeds:
            r = simulate(
                traces[seed],
                CLUSTER,
                policy=SwafPolicy(plannable_share=share),
                allocator="genie",
                mode=args.mode,
                catalog=catalog,
            )
            met.append(r.qos.met_pct)
            makespans.append(r.makespan_h)
        rows.append((share, met, statistics.mean(makespans)))
        sys.stderr.write(f"  share {share}: {statistics.mean(met):.1f} %\n")
    baseline = statistics.mean(rows[0][1])
    print(
        f"SWAF + genie ({args.mode}), GENIE's workload with the predictor, {args.jobs} jobs at "
        f"{args.load:g} jobs/h, seeds {args.seeds}\n"
    )
    print("| plannable_share | QoS met % (mean) | per seed | x plain SWAF | makespan h |")
    print("|---|---:|---|---:|---:|")
    for share, met, makespan_h in rows:
        label = "none (plain SWAF, baseline)" if share is None else f"{share:g}"
        mean = statistics.mean(met)
        per_seed = " / ".join(f"{m:.1f}" for m in met)
        print(f"| {label} | {mean:.1f} | {per_seed} | {mean / baseline:.3f} | {makespan_h:.1f} |")
    print(f"\n(wall time {time.perf_counter() - started:.0f} s)")


if __name__ == "__main__":
    main()
