"""bench.core_round on two source trees, alternated in the same minutes: is a change slower?

Run (from the repository root; the base tree is any checkout, e.g. a worktree of the commit before
the change):

    git worktree add /tmp/base <commit>
    python -m bench.compare_trees --base /tmp/base [--runs 7] [--repeats 20] [--modes first,sticky]

Each run times `python -m bench.core_round` (and `--sticky`) once in each tree, in a fresh process,
alternating which tree goes first, so that load from other work on a shared machine falls on both
alike. `--clock cpu` times the same rounds (core_round's `build_round` / `next_round`) by the
process's CPU time instead of the wall clock, which other processes on a busy machine disturb less.
Prints, per mode and allocator, the median over runs of each tree's median round time, the
best round seen, and new / base; then the ratio of the summed medians (the round as a whole). A
ratio under 1.05 is within the 5 % a refactor may cost (issue 35). Both trees run with this
interpreter; PYTHONPATH is the tree, so each imports its own code.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
from pathlib import Path

from bench.common import print_table

REPO_ROOT = Path(__file__).resolve().parent.parent


# core_round's rounds timed by CPU time: argv = repeats, allocators, "sticky" or "first".
CPU_CLOCK = """
import statistics, sys, time
from bench.core_round import build_round, next_round
from scheduler_app.core.engine import schedule_round
repeats, allocators, mode = int(sys.argv[1]), sys.argv[2].split(","), sys.argv[3]
snapshot, first_jobs = build_round(64, 1000, 7)
print("cpu clock"); print("allocator median best")
for name in allocators:
    jobs = next_round(snapshot, first_jobs, name) if mode == "sticky" else first_jobs
    times = []
    for _ in range(max(3, repeats // 5) if name == "opt" else repeats):
        t0 = time.process_time()
        schedule_round(snapshot, jobs, policy="fifo", allocator=name, now_s=0.0)
        times.append((time.process_time() - t0) * 1e3)
    print(name, statistics.median(times), min(times))
"""


def core_round(
    tree: Path, sticky: bool, repeats: int, allocators: str, clock: str
) -> dict[str, tuple[float, float]]:
    """One `bench.core_round` run in `tree`: allocator -> (median ms, best ms)."""
    if clock == "cpu":
        cmd = [sys.executable, "-c", CPU_CLOCK, str(repeats), allocators, "sticky" if sticky else "first"]
    else:
        cmd = [sys.executable, "-m", "bench.core_round", "--repeats", str(repeats)]
        cmd += ["--allocators", allocators]
        if sticky:
            cmd.append("--sticky")
    env = {**os.environ, "PYTHONPATH": str(tree)}
    out = subprocess.run(cmd, cwd=tree, env=env, check=True, capture_output=True, text=True).stdout
    rows: dict[str, tuple[float, float]] = {}
    for line in out.splitlines()[2:]:  # a title line, then the table's header
        parts = line.split()
        if len(parts) >= 3:
            rows[parts[0]] = (float(parts[1]), float(parts[2]))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", type=Path, required=True, help="the tree to compare against")
    parser.add_argument("--new", type=Path, default=REPO_ROOT, help="the changed tree (default: this one)")
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--repeats", type=int, default=20, help="core_round's --repeats")
    parser.add_argument("--modes", default="first,sticky", help="first (one round) and/or sticky")
    parser.add_argument("--allocators", default="proportional,greedy,tune,tune_matrix,opt")
    parser.add_argument("--clock", choices=("wall", "cpu"), default="wall", help="wall: core_round as is")
    args = parser.parse_args()

    trees = {"base": args.base.resolve(), "new": args.new.resolve()}
    for mode in args.modes.split(","):
        sticky = mode == "sticky"
        runs: dict[str, list[dict[str, tuple[float, float]]]] = {"base": [], "new": []}
        for i in range(args.runs):
            order = ("base", "new") if i % 2 == 0 else ("new", "base")
            for name in order:
                runs[name].append(core_round(trees[name], sticky, args.repeats, args.allocators, args.clock))
        print(
            f"\n{mode} round ({args.clock} clock): {args.runs} alternated runs per tree, "
            f"{args.repeats} repeats each"
        )
        rows, sums = [], {"base": 0.0, "new": 0.0}
        for alloc in args.allocators.split(","):
            med = {t: statistics.median(r[alloc][0] for r in runs[t]) for t in runs}
            best = {t: min(r[alloc][1] for r in runs[t]) for t in runs}
            sums["base"] += med["base"]
            sums["new"] += med["new"]
            rows.append([alloc, med["base"], med["new"], med["new"] / med["base"], best["base"], best["new"]])
        rows.append(["(sum)", sums["base"], sums["new"], sums["new"] / sums["base"], "", ""])
        print_table(["allocator", "base ms", "new ms", "new / base", "base best", "new best"], rows)


if __name__ == "__main__":
    main()
