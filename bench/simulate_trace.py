"""Whole-trace simulation speed: the 1,000-job, 128-GPU reference trace and a generated one, per allocator.

Run: `python -m bench.simulate_trace [--allocators proportional,greedy,tune,tune_matrix,opt]`. Prints wall
time, peak Python memory and avg JCT per allocator, and the wall-time ratio to proportional in the
same run. Target (issue 3): under 10 s per allocator for proportional, greedy and tune on the 2-core
dev machine; the reference simulator needs about 220 s per allocator for the same trace here.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from bench.common import peak_memory_mb, print_table
from scheduler_app.simulator import ClusterSpec, philly_derived_trace, read_trace, simulate

REFERENCE_TRACE = Path(__file__).resolve().parent.parent / "tests/data/synergy/philly1gpu_l9_n1000_s42.csv"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--allocators", default="proportional,greedy,tune,tune_matrix,opt")
    parser.add_argument("--trace", type=Path, default=REFERENCE_TRACE, help="reference trace file")
    parser.add_argument("--round-end", action="store_true", help="finish jobs at round ends (reference)")
    args = parser.parse_args()

    cluster = ClusterSpec(servers=16, gpus_per_server=8, cpus_per_server=24, mem_gb_per_server=500.0)
    traces = {"generated (seed 1, load 9)": philly_derived_trace(1000, jobs_per_hour=9.0, seed=1)}
    if args.trace.is_file():
        traces = {f"reference {args.trace.name}": read_trace(args.trace), **traces}
    else:
        print(f"(reference trace {args.trace} not found; generated trace only)")
    for label, trace in traces.items():
        print(f"\n{label}: {len(trace)} jobs on {cluster.servers * cluster.gpus_per_server} GPUs, FIFO")
        rows, baseline = [], None
        for name in args.allocators.split(","):
            result, peak_mb = peak_memory_mb(
                lambda n=name, t=trace: simulate(
                    t, cluster, policy="fifo", allocator=n, finish_at_round_end=args.round_end
                )
            )
            # tracemalloc slows Python down; time a second, untraced run for the wall figure.
            wall_s = simulate(
                trace, cluster, policy="fifo", allocator=name, finish_at_round_end=args.round_end
            ).wall_s
            baseline = baseline or wall_s
            rows.append([name, wall_s, wall_s / baseline, peak_mb, result.rounds, result.avg_jct_h])
        print_table(["allocator", "wall s", "x proportional", "peak MB", "rounds", "avg JCT h"], rows)


if __name__ == "__main__":
    main()
