"""The what-if page's replay of a week of a 128-GPU cluster's history: how long until it answers.

Run: `python -m bench.whatif_week [--jobs-per-hour 9] [--days 7] [--repeats 3]`.

A what-if run of the recorded history (dashboards/services.py `whatif_run_execute`) replays the
completed jobs through `simulation_compare` under the page's default grid: the shipped policy
against proportional and the shipped allocator (fifo x (proportional, tune); `--policy` and
`--allocator` time another grid, e.g. swaf and genie). This bench builds the same shape without a
database: a week of Philly-derived arrivals at the Synergy load for 128 GPUs (9 jobs an hour, about
1,500 jobs), 16 servers x 8 GPUs, 300 s rounds, and times `simulation_compare` on it: wall and CPU,
best and median of the repeats. The database part of the page (reading the jobs, saving progress
and results) is not in these figures. Target (issue 40): under 2 s.
"""

from __future__ import annotations

import argparse
import statistics
import time

from scheduler_app.simulator.compare import SimulationRequest, simulation_compare, simulation_trace_build

TARGET_S = 2.0
# The what-if form's default grid: config/settings.py's ATTUNE_POLICY and ATTUNE_ALLOCATOR defaults (this
# bench runs without Django).
SHIPPED_POLICY, SHIPPED_ALLOCATOR = "fifo", "tune"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs-per-hour", type=float, default=9.0, help="arrival rate (default 9)")
    parser.add_argument("--days", type=float, default=7.0, help="history length in days (default 7)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--policy", default=SHIPPED_POLICY, help=f"default {SHIPPED_POLICY}, the shipped one")
    parser.add_argument(
        "--allocator", default=SHIPPED_ALLOCATOR, help=f"beside proportional; default {SHIPPED_ALLOCATOR}"
    )
    args = parser.parse_args()
    request = SimulationRequest(
        servers=16,
        gpus_per_server=8,
        policies=(args.policy,),
        allocators=tuple(sorted({"proportional", args.allocator})),
        num_jobs=round(args.jobs_per_hour * 24 * args.days),
        jobs_per_hour=args.jobs_per_hour,
        seed=1,
    )
    trace = simulation_trace_build(request)
    walls, cpus = [], []
    for _ in range(args.repeats):
        w0, c0 = time.perf_counter(), time.process_time()
        runs = simulation_compare(request, trace=trace)
        walls.append(time.perf_counter() - w0)
        cpus.append(time.process_time() - c0)
    span_h = (max(j.arrival_s for j in trace) - min(j.arrival_s for j in trace)) / 3600
    print(
        f"what-if replay: {len(trace)} jobs arriving over {span_h:.0f} h on "
        f"{request.servers * request.gpus_per_server} GPUs, {args.policy} x "
        f"({', '.join(request.allocators)}), "
        f"{args.repeats} repeats"
    )
    for r in runs:
        print(f"  {r['policy']}+{r['allocator']}: {r['rounds']} rounds, avg JCT {r['avg_jct_h']:.2f} h")
    print(
        f"answer: wall best {min(walls):.2f} s, median {statistics.median(walls):.2f} s; "
        f"CPU best {min(cpus):.2f} s, median {statistics.median(cpus):.2f} s; "
        f"target under {TARGET_S:g} s: {'met' if min(walls) < TARGET_S else 'NOT met'}"
    )


if __name__ == "__main__":
    main()
