"""Fair share against FIFO when one user floods the queue: the other users' JCT, simulated.

Run: `python -m bench.fairshare [--seeds 3] [--burst 60]`. A 32-GPU cluster (4 x 8 GPUs, 24 cores,
500 GB) and the Philly-derived job mix (PAPERS 3.5: durations, 1/2/4/8 GPUs, default split). User 1
submits a burst of `--burst` jobs in its first minute (an array); users 2 to 5 each submit 8 jobs
at Poisson times over the first 12 hours. Every job is simulated under FIFO and under `fairshare`,
with tune, in 300 s rounds. Prints mean JCT of the burst's owner, of the others and of all, per
policy, and the ratio fairshare / FIFO measured in the same run.
"""

from __future__ import annotations

import argparse
import dataclasses
import random
import statistics

from bench.common import print_table
from scheduler_app.simulator import ClusterSpec, philly_derived_trace, simulate
from scheduler_app.simulator.trace import TraceJob

CLUSTER = ClusterSpec(servers=4, gpus_per_server=8, cpus_per_server=24, mem_gb_per_server=500.0)
OTHERS = (2, 3, 4, 5)
JOBS_PER_OTHER = 8
OTHERS_WINDOW_S = 12 * 3600


def workload(burst: int, seed: int) -> list[TraceJob]:
    """The burst (user 1, arriving within its first minute) and the other users' jobs, in arrival order."""
    rng = random.Random(seed)
    mix = philly_derived_trace(burst + JOBS_PER_OTHER * len(OTHERS), multi_gpu=True, seed=seed)
    jobs = [dataclasses.replace(job, arrival_s=float(rng.randint(0, 60)), owner_id=1) for job in mix[:burst]]
    rest = iter(mix[burst:])
    for owner in OTHERS:
        for _ in range(JOBS_PER_OTHER):
            arrival = rng.uniform(0, OTHERS_WINDOW_S)
            jobs.append(dataclasses.replace(next(rest), arrival_s=round(arrival), owner_id=owner))
    jobs.sort(key=lambda j: (j.arrival_s, j.job_id))
    return [dataclasses.replace(job, job_id=k) for k, job in enumerate(jobs)]


def mean_jct_h(records, owner_of: dict[int, int], owners: set[int]) -> float:
    return statistics.fmean(r.jct_s for r in records if owner_of[r.job_id] in owners) / 3600


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--burst", type=int, default=60)
    args = parser.parse_args()
    rows = []
    for seed in range(1, args.seeds + 1):
        trace = workload(args.burst, seed)
        owners = {job.job_id: job.owner_id for job in trace}
        means = {}
        for policy in ("fifo", "fairshare"):
            result = simulate(trace, CLUSTER, policy=policy, allocator="tune", round_s=300)
            records = result.records
            means[policy] = (
                mean_jct_h(records, owners, {1}),
                mean_jct_h(records, owners, set(OTHERS)),
                statistics.fmean(r.jct_s for r in records) / 3600,
                result.makespan_h,
            )
        for policy, (burst_h, others_h, all_h, makespan_h) in means.items():
            rows.append(
                [seed, policy, f"{burst_h:.2f}", f"{others_h:.2f}", f"{all_h:.2f}", f"{makespan_h:.2f}"]
            )
        ratio = [means["fairshare"][k] / means["fifo"][k] for k in range(3)]
        rows.append([seed, "fairshare / fifo", *(f"{r:.2f}x" for r in ratio), ""])
    print(
        f"\n{args.burst}-job burst from user 1 + {JOBS_PER_OTHER} jobs each from users 2-5 over 12 h; "
        f"{CLUSTER.servers * CLUSTER.gpus_per_server} GPUs, tune, 300 s rounds"
    )
    print_table(["seed", "policy", "user 1 JCT h", "users 2-5 JCT h", "all JCT h", "makespan h"], rows)


if __name__ == "__main__":
    main()
