"""The what-if page's replay of a week of a 128-GPU cluster's history: how long until it answers.

Run: `python -m bench.whatif_week [--jobs-per-hour 9] [--days 7] [--repeats 3]`.

A what-if run of the recorded history (dashboards/services.py `whatif_run_execute`) replays the
completed jobs through `simulation_compare` under the page's default grid: the shipped policy
against proportional and the shipped allocator (fifo x (proportional, tune); `--policy` and
`--allocator` time another grid, e.g. swaf and genie). This bench builds the same shape without a
database: a week of Philly-derived arrivals at the Synergy load for 128 GPUs (9 jobs an hour, about
1,500 jobs), 16 servers x 8 GPUs, 300 s rounds, and times `simulation_compare` on it, alternating its
default workers (one process per run, up to the cores: what the page does) with `workers=1` (the runs
one after the other in this process): wall, best and median of the repeats, and the ratio of the
medians; CPU of this process (with workers, the runs' CPU is in the worker processes: the runs' own
simulation time, `wall_s` of their summaries, is printed beside it). The first parallel call also
starts the fork server (simulator/parallel.py), which a long-lived web or Celery process pays once:
it is timed apart, as "first call". The database part of the page (reading the jobs, saving progress
and results) is not in these figures. Target (issue 40): under 2 s.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

from scheduler_app.simulator.compare import SimulationRequest, simulation_compare, simulation_trace_build

TARGET_S = 2.0
# The what-if form's default grid: config/settings.py's ATTUNE_POLICY and ATTUNE_ALLOCATOR defaults (this
# bench runs without Django).
SHIPPED_POLICY, SHIPPED_ALLOCATOR = "swaf", "genie"


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
    load_before = os.getloadavg()[0]
    default_workers = min(len(request.policies) * len(request.allocators), os.cpu_count() or 1)
    w0 = time.perf_counter()
    simulation_compare(request, trace=trace)
    first_s = time.perf_counter() - w0
    timings: dict[int, dict[str, list[float]]] = {
        n: {"wall": [], "cpu": [], "runs": []} for n in (default_workers, 1)
    }
    results = {}
    for _ in range(args.repeats):
        for n, t in timings.items():
            w0, c0 = time.perf_counter(), time.process_time()
            runs = simulation_compare(request, trace=trace, workers=n)
            t["wall"].append(time.perf_counter() - w0)
            t["cpu"].append(time.process_time() - c0)
            t["runs"].append(sum(r["wall_s"] for r in runs))
            results[n] = [{k: v for k, v in r.items() if k != "wall_s"} for r in runs]
    span_h = (max(j.arrival_s for j in trace) - min(j.arrival_s for j in trace)) / 3600
    print(
        f"what-if replay: {len(trace)} jobs arriving over {span_h:.0f} h on "
        f"{request.servers * request.gpus_per_server} GPUs, {args.policy} x "
        f"({', '.join(request.allocators)}), {args.repeats} repeats, {os.cpu_count()} cores, "
        f"load average {load_before:.1f} before, {os.getloadavg()[0]:.1f} after"
    )
    for r in runs:
        print(f"  {r['policy']}+{r['allocator']}: {r['rounds']} rounds, avg JCT {r['avg_jct_h']:.2f} h")
    print(f"  same summaries with workers={default_workers} and 1: {results[default_workers] == results[1]}")
    print(f"  first call (starts the fork server and its workers): wall {first_s:.2f} s")
    for n, t in timings.items():
        print(
            f"  workers={n}: wall best {min(t['wall']):.2f} s, median {statistics.median(t['wall']):.2f} s; "
            f"CPU here median {statistics.median(t['cpu']):.2f} s; runs' own time median "
            f"{statistics.median(t['runs']):.2f} s"
        )
    answer = timings[default_workers]["wall"]
    ratio = statistics.median(timings[1]["wall"]) / statistics.median(answer)
    print(
        f"answer (workers={default_workers}): wall best {min(answer):.2f} s, median "
        f"{statistics.median(answer):.2f} s, {ratio:.2f}x workers=1's median; "
        f"target under {TARGET_S:g} s: {'met' if min(answer) < TARGET_S else 'NOT met'}"
    )


if __name__ == "__main__":
    main()
