"""How many running jobs a round moves or resizes on a full cluster when jobs end, a node joins, jobs'
profiles change or the queue changes, with and without restart costs (pure core).

Run: `python -m bench.moves_per_round [--servers 1000] [--rounds 5] [--ending 20] [--events ...]
[--restarts both|on|off]`. Builds the fleet bench's queue (per server six jobs of 1, 1, 2, 4, 1, 2
GPUs, catalog workloads in turn, FIFO by submission), plans a first round, then `--rounds` more, a
round a minute: before each, per event, `--ending` random running jobs end (`ending`), or one empty
server joins (`join`), or `--ending` random running jobs' profiles change to the next catalog
workload's (`profile`: as when a job is profiled or its measured speed corrects its profile), or
`--ending` new jobs arrive and `--ending` waiting ones are cancelled (`queue`); every other job holds
(`current`) what the previous plan gave it. With restart costs (`RestartPolicy()`, the service's
defaults), every running job's lease started an hour before the first round (past the minimum run
time: the guard judges by cost), a job restarted starts a new one, start-up 30 s and a checkpoint
every 10 minutes (the catalog's defaults). Per round it prints the running jobs moved to other servers,
those resized on theirs (other GPUs, cores or memory), the restarts (`core/restarts.py`: other GPUs
or preempted; a change of cores or memory alone is made in place), the queued jobs started, and the
round's wall time (docs/performance.md, "Moves per round").
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
from scheduler_app.core.restarts import RestartPolicy, change_of, is_restart
from scheduler_app.core.types import ClusterSnapshot, JobView, RoundPlan, ServerView

JOB_GPUS = (1, 1, 2, 4, 1, 2)  # per server, as bench.agent_fleet submits them
EVENTS = ("ending", "join", "profile", "queue")
ROUND_S = 60.0  # the service's default round length
START_S = 1e6  # the first round's clock
STARTUP_S = 30.0  # Workload.startup_s's default (a profile default until measured)
CHECKPOINT_EVERY_S = 600.0  # Workload.checkpoint_every_s's default


@dataclass(frozen=True)
class RoundChanges:
    moved: int  # running jobs now on other servers
    resized: int  # running jobs on the same servers with other GPUs, cores or memory
    started: int  # jobs that were queued
    seconds: float
    restarts: int = 0  # running jobs stopped: other GPUs, or preempted (core/restarts.py)
    preempted: int = 0  # running jobs sent back to the queue


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
    allocator: str,
    *,
    servers: int,
    rounds: int,
    ending: int,
    seed: int = 7,
    event: str = "ending",
    restarts: RestartPolicy | None = None,
) -> Iterator[RoundChanges]:
    """The changes of each round after the first (see the module docstring)."""
    if event not in EVENTS:
        raise ValueError(f"event must be one of {EVENTS}, not {event!r}")
    snapshot, jobs = full_cluster(servers)
    catalog = load_catalog()
    names = sorted(catalog)
    now_s = START_S
    started_s = START_S - 3600.0  # every first lease: an hour old, past the minimum run time
    jobs = [dataclasses.replace(j, startup_s=STARTUP_S, checkpoint_every_s=CHECKPOINT_EVERY_S) for j in jobs]
    plan = _plan(snapshot, jobs, allocator, now_s, restarts)
    lease_started = dict.fromkeys(plan.placements(), started_s)
    rng = random.Random(seed)
    next_id = max(j.job_id for j in jobs) + 1
    for _ in range(rounds):
        now_s += ROUND_S
        held = plan.placements()
        running = [j for j in jobs if j.job_id in held]
        if event == "ending":
            ended = {j.job_id for j in rng.sample(running, ending)}
            jobs = [j for j in jobs if j.job_id not in ended]
        elif event == "join":
            snapshot = _joined(snapshot)
        elif event == "profile":
            changed = {j.job_id for j in rng.sample(running, ending)}
            jobs = [
                dataclasses.replace(j, profile=catalog[names[(names.index(j.profile.name) + 1) % len(names)]])
                if j.job_id in changed
                else j
                for j in jobs
            ]
        else:  # queue: new jobs arrive, waiting ones are cancelled
            waiting = [j for j in jobs if j.job_id not in held]
            cancelled = {j.job_id for j in rng.sample(waiting, min(ending, len(waiting)))}
            jobs = [j for j in jobs if j.job_id not in cancelled]
            for _ in range(ending):
                jobs.append(
                    JobView(
                        job_id=next_id,
                        num_gpus=rng.choice(JOB_GPUS),
                        arrival_s=now_s,
                        profile=catalog[rng.choice(names)],
                        total_iters=1000.0,
                        startup_s=STARTUP_S,
                        checkpoint_every_s=CHECKPOINT_EVERY_S,
                    )
                )
                next_id += 1
        jobs = [
            dataclasses.replace(j, current=held.get(j.job_id), lease_started_s=lease_started.get(j.job_id))
            for j in jobs
        ]
        t0 = time.perf_counter()
        plan = _plan(snapshot, jobs, allocator, now_s, restarts)
        seconds = time.perf_counter() - t0
        now = plan.placements()
        moved = resized = started = restarted = preempted = 0
        for job in jobs:
            placement = now.get(job.job_id)
            change = change_of(job.current, placement)
            if is_restart(change, restarts or RestartPolicy()):
                restarted += 1
            if placement is None:
                preempted += job.current is not None
                continue
            if job.current is None:
                started += 1
                lease_started[job.job_id] = now_s
            elif [s.server_id for s in placement.shares] != [s.server_id for s in job.current.shares]:
                moved += 1
                lease_started[job.job_id] = now_s
            elif not placement.same_resources(job.current):
                resized += 1
                if is_restart(change, restarts or RestartPolicy()):
                    lease_started[job.job_id] = now_s
        yield RoundChanges(moved, resized, started, seconds, restarted, preempted)


def _plan(
    snapshot: ClusterSnapshot,
    jobs: list[JobView],
    allocator: str,
    now_s: float,
    restarts: RestartPolicy | None,
) -> RoundPlan:
    return schedule_round(snapshot, jobs, policy="fifo", allocator=allocator, now_s=now_s, restarts=restarts)


def _joined(snapshot: ClusterSnapshot) -> ClusterSnapshot:
    """`snapshot` and one more empty server like the others."""
    first = snapshot.servers[0]
    new = ServerView(
        server_id=max(s.server_id for s in snapshot.servers) + 1,
        name=f"s{len(snapshot.servers)}",
        num_gpus=first.num_gpus,
        num_cpus=first.num_cpus,
        mem_gb=first.mem_gb,
        free_gpus=tuple(range(first.num_gpus)),
        free_cpus=first.num_cpus,
        free_mem_gb=first.mem_gb,
    )
    return ClusterSnapshot(servers=(*snapshot.servers, new))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--servers", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--ending", type=int, default=20, help="jobs each event touches (see the docstring)")
    parser.add_argument("--allocators", default="tune,tune_matrix,proportional")
    parser.add_argument("--events", default="ending", help=f"comma-separated, of {','.join(EVENTS)}")
    parser.add_argument("--restarts", choices=("both", "on", "off"), default="off", help="restart costs")
    args = parser.parse_args(argv)
    policies = {"off": [None], "on": [RestartPolicy()], "both": [None, RestartPolicy()]}[args.restarts]
    rows = []
    for event in args.events.split(","):
        for allocator in args.allocators.split(","):
            for restarts in policies:
                changes = round_changes(
                    allocator,
                    servers=args.servers,
                    rounds=args.rounds,
                    ending=args.ending,
                    event=event,
                    restarts=restarts,
                )
                for k, c in enumerate(changes, start=2):
                    rows.append(
                        [event, allocator, "on" if restarts else "off", k, c.moved, c.resized, c.restarts,
                         c.preempted, c.started, c.seconds]
                    )  # fmt: skip
    print(f"{args.servers} full servers, FIFO, {args.ending} jobs touched by each event, a round a minute")
    print_table(
        ["event", "allocator", "restart costs", "round", "moved", "resized", "restarts", "preempted",
         "started", "round s"],
        rows,
    )  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
