"""How many running jobs a round moves or resizes when a few jobs end on a full cluster (pure core).

Run: `python -m bench.moves_per_round [--servers 1000] [--rounds 5] [--ending 20]`. Builds the fleet
bench's queue (per server six jobs of 1, 1, 2, 4, 1, 2 GPUs, catalog workloads in turn, FIFO by
submission), plans a first round, then `--rounds` more: each time `--ending` random running jobs end
and every other job holds (`current`) what the previous plan gave it. Per round and allocator it
prints the running jobs moved to other servers, those resized on theirs (a restart too, on a live
cluster), the queued jobs started, and the round's wall time. On a live cluster each move or resize is
a checkpoint and a restart (docs/performance.md, "Moves per round").
"""

from __future__ import annotations

import argparse
import dataclasses
import random
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass

from bench.common import print_table
from bench.core_round import empty_cluster
from profiles_app.catalog import load_catalog
from scheduler_app.core.engine import schedule_round
from scheduler_app.core.types import ClusterSnapshot, JobView, RoundPlan

JOB_GPUS = (1, 1, 2, 4, 1, 2)  # per server, as bench.agent_fleet submits them


@dataclass(frozen=True)
class RoundChanges:
    moved: int  # running jobs now on other servers
    resized: int  # running jobs on the same servers with other GPUs, cores or memory
    started: int  # jobs that were queued
    seconds: float


def full_cluster(servers: int) -> tuple[ClusterSnapshot, list[JobView]]:
    """`servers` empty 8-GPU servers (24 cores, 500 GB) and the fleet bench's queue for them."""
    snapshot = empty_cluster(servers)
    catalog = load_catalog()
    profiles = [catalog[name] for name in sorted(catalog)]
    jobs = [
        JobView(
            job_id=n + 1,
            num_gpus=JOB_GPUS[n % len(JOB_GPUS)],
            arrival_s=float(n),
            profile=profiles[n % len(profiles)],
            total_iters=1000.0,
        )
        for n in range(servers * len(JOB_GPUS))
    ]
    return snapshot, jobs


def round_changes(
    allocator: str, *, servers: int, rounds: int, ending: int, seed: int = 7
) -> Iterator[RoundChanges]:
    """The changes of each round after the first (see the module docstring)."""
    snapshot, jobs = full_cluster(servers)
    plan: RoundPlan = schedule_round(snapshot, jobs, policy="fifo", allocator=allocator, now_s=1e6)
    rng = random.Random(seed)
    for _ in range(rounds):
        held = plan.placements()
        ended = {j.job_id for j in rng.sample([j for j in jobs if j.job_id in held], ending)}
        jobs = [dataclasses.replace(j, current=held.get(j.job_id)) for j in jobs if j.job_id not in ended]
        t0 = time.perf_counter()
        plan = schedule_round(snapshot, jobs, policy="fifo", allocator=allocator, now_s=1e6)
        seconds = time.perf_counter() - t0
        now = plan.placements()
        moved = resized = started = 0
        for job in jobs:
            placement = now.get(job.job_id)
            if placement is None:
                continue
            if job.current is None:
                started += 1
            elif [s.server_id for s in placement.shares] != [s.server_id for s in job.current.shares]:
                moved += 1
            elif not placement.same_resources(job.current):
                resized += 1
        yield RoundChanges(moved, resized, started, seconds)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--servers", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--ending", type=int, default=20, help="running jobs that end before each round")
    parser.add_argument("--allocators", default="tune,tune_matrix,proportional")
    args = parser.parse_args(argv)
    rows = []
    for allocator in args.allocators.split(","):
        for k, c in enumerate(
            round_changes(allocator, servers=args.servers, rounds=args.rounds, ending=args.ending), start=2
        ):
            rows.append([allocator, k, c.moved, c.resized, c.started, c.seconds])
    print(f"{args.servers} full servers, FIFO, {args.ending} running jobs ending before each round")
    print_table(["allocator", "round", "moved", "resized", "started", "round s"], rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
