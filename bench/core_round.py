"""One scheduling round on a large cluster: each allocator against proportional, in the same process.

Run: `python -m bench.core_round [--servers 64] [--jobs 1000] [--repeats 20] [--sticky] [--restarts]
[--clock wall|cpu] [--policy fifo]`. Prints the median and best wall time of `schedule_round` per
allocator (FIFO order, or `--policy`'s: `--policy swaf --allocators genie` is the live round's core
under that pair) and its ratio to the first allocator's (proportional's by default). Target (issue
3): tune under 20 ms for 512 GPUs and 1,000 runnable jobs on the 2-core dev machine. `--sticky`
times a steady-state round instead of a first one: every job the allocator placed in a first round
holds that placement (`current`), and every tenth of them has finished, so queued jobs are admitted
around the others (the claim path of core/placement).
`--restarts` decides under the move guard with the default RestartPolicy (core/move_guard.py), as
the live rounds and the forecast do: every job that fits a server on one server (a node count of
1), and in a steady-state round the jobs placed hold leases started ten minutes before, past their
minimum run time. `--clock cpu` times by the process's CPU time (steadier on a shared machine).
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import time

from bench.common import peak_memory_mb, print_table, time_call
from profiles_app.catalog import load_catalog
from scheduler_app.core.engine import schedule_round
from scheduler_app.core.restarts import RestartPolicy
from scheduler_app.core.types import ClusterSnapshot, JobView, ServerView
from scheduler_app.simulator import philly_derived_trace


def empty_cluster(num_servers: int) -> ClusterSnapshot:
    """`num_servers` free servers of 8 GPUs, 24 cores and 500 GB (the paper's server)."""
    return ClusterSnapshot(
        servers=tuple(
            ServerView(
                server_id=i,
                name=f"s{i}",
                num_gpus=8,
                num_cpus=24,
                mem_gb=500.0,
                free_gpus=tuple(range(8)),
                free_cpus=24,
                free_mem_gb=500.0,
            )
            for i in range(num_servers)
        )
    )


def build_round(num_servers: int, num_jobs: int, seed: int) -> tuple[ClusterSnapshot, list[JobView]]:
    catalog = load_catalog()
    trace = philly_derived_trace(num_jobs, jobs_per_hour=36.0, multi_gpu=True, seed=seed)
    jobs = [
        JobView(
            job_id=t.job_id,
            num_gpus=t.num_gpus,
            arrival_s=t.arrival_s,
            profile=catalog[t.model],
            total_iters=t.total_iters,
        )
        for t in trace
    ]
    return empty_cluster(num_servers), jobs


def next_round(
    snapshot: ClusterSnapshot,
    jobs: list[JobView],
    allocator: str,
    restarts: RestartPolicy | None = None,
    policy: str = "fifo",
) -> list[JobView]:
    """The jobs one round later: placed ones hold their placement (a lease started ten minutes
    before), every tenth placed one is done."""
    placements = schedule_round(
        snapshot, jobs, policy=policy, allocator=allocator, now_s=0.0, restarts=restarts
    ).placements()
    done = set(sorted(placements)[::10])
    return [
        dataclasses.replace(
            j,
            current=placements.get(j.job_id),
            lease_started_s=-600.0 if j.job_id in placements else None,
        )
        for j in jobs
        if j.job_id not in done
    ]


def cpu_times(call, repeats: int) -> tuple[float, float]:
    """Median and best CPU seconds of `repeats` calls."""
    times = []
    for _ in range(repeats):
        start = time.process_time()
        call()
        times.append(time.process_time() - start)
    return statistics.median(times), min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--servers", type=int, default=64)
    parser.add_argument("--jobs", type=int, default=1000)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--allocators", default="proportional,greedy,tune,tune_matrix,opt")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--sticky", action="store_true", help="time a steady-state round (see above)")
    parser.add_argument(
        "--restarts", action="store_true", help="decide under the move guard (default RestartPolicy)"
    )
    parser.add_argument("--clock", choices=("wall", "cpu"), default="wall")
    parser.add_argument("--policy", default="fifo", help="the order (a registered policy name)")
    args = parser.parse_args()

    snapshot, first_jobs = build_round(args.servers, args.jobs, args.seed)
    restarts = RestartPolicy() if args.restarts else None
    kind = "steady-state round" if args.sticky else "one round"
    guard = ", move guard" if restarts else ""
    print(
        f"{kind}: {snapshot.total_gpus} GPUs, {len(first_jobs)} jobs, {args.policy}{guard}, "
        f"{args.repeats} repeats, {args.clock} clock"
    )
    timer = cpu_times if args.clock == "cpu" else time_call
    rows, baseline = [], None
    for name in args.allocators.split(","):
        jobs = next_round(snapshot, first_jobs, name, restarts, args.policy) if args.sticky else first_jobs
        repeats = max(3, args.repeats // 5) if name == "opt" else args.repeats

        def decide(n: str = name, j: list[JobView] = jobs):
            return schedule_round(snapshot, j, policy=args.policy, allocator=n, now_s=0.0, restarts=restarts)

        median_s, best_s = timer(decide, repeats=repeats)
        plan, peak_mb = peak_memory_mb(decide)
        placed = sum(1 for d in plan.decisions if d.placement is not None)
        if baseline is None:
            baseline = median_s
        rows.append([name, median_s * 1e3, best_s * 1e3, median_s / baseline, peak_mb, placed])
    first = args.allocators.split(",")[0]
    print_table(["allocator", "median ms", "best ms", f"x {first}", "peak MB", "placed"], rows)


if __name__ == "__main__":
    main()
