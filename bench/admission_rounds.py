"""An admission forecast's core rounds, one by one, from inputs bench.admission_deep pickled (`--dump`).

Run: `python -m bench.admission_rounds PATH [--rounds 100] [--profile N] [--no-shortcuts]`: builds the
ForecastRun the worker builds and plays `--rounds` rounds (or until it is done), printing each
round's CPU and whether the core decided it, then how many rounds fit in 2 s of CPU and the
targets' starts. No database: the core alone, so that a change to its rounds is timed apart from
the queue's read.
"""

from __future__ import annotations

import argparse
import cProfile
import hashlib
import pickle
import sys
import time

from bench.common import profile_print


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("path")
    parser.add_argument("--rounds", type=int, default=100)
    parser.add_argument("--profile", type=int, default=0, help="print cProfile's N costliest functions")
    parser.add_argument("--no-shortcuts", action="store_true", help="decide every round")
    parser.add_argument("--quiet", action="store_true", help="no line per round")
    args = parser.parse_args(argv)

    from scheduler_app.simulator.forecast import ForecastRun

    with open(args.path, "rb") as source:
        snapshot, views, kwargs = pickle.load(source)
    kwargs.pop("time_budget_s", None)
    if args.no_shortcuts:
        kwargs["shortcuts"] = False
    start_cpu = time.process_time()
    run = ForecastRun(snapshot, views, **kwargs)
    build_s = time.process_time() - start_cpu
    targets = sorted(run.waiting_for)
    print(f"{len(views)} views, {len(targets)} targets; the run built in {build_s:.3f} s CPU")
    profiler = cProfile.Profile(time.process_time) if args.profile else None
    cpu: list[tuple[float, bool]] = []
    if profiler:
        profiler.enable()
    while not run.done and len(cpu) < args.rounds:
        decided, start = run.decided, time.process_time()
        asked = [0]

        def once(_round_s: float, asked: list[int] = asked) -> bool:
            asked[0] += 1
            return asked[0] > 1  # one round a call

        run.play(once)
        cpu.append((time.process_time() - start, run.decided > decided))
        if not args.quiet:
            print(
                f"round {run.k:>4}: {1000 * cpu[-1][0]:7.1f} ms CPU, {'decided' if cpu[-1][1] else 'reused'}"
            )
    if profiler:
        profiler.disable()
    total = 0.0
    within = 0
    for round_cpu, _ in cpu:
        total += round_cpu
        if total > 2.0:
            break
        within += 1
    print(
        f"{len(cpu)} rounds played ({run.k} with skipped ones), {sum(d for _, d in cpu)} decided, "
        f"{sum(c for c, _ in cpu):.2f} s CPU; {within} rounds within 2 s of CPU (after the build)"
    )
    every = run.results()
    digest = hashlib.sha256(repr(sorted(every.items())).encode()).hexdigest()[:16]
    print(f"every job's start and finish so far: digest {digest}")
    results = run.results(targets)
    started = [r for r in results.values() if r.start_s is not None]
    print(f"targets started: {len(started)} of {len(targets)}")
    for result in sorted(results.values(), key=lambda r: r.job_id):
        print(f"  job {result.job_id}: start {result.start_s}, finish {result.finish_s}")
    if profiler:
        profile_print(profiler, args.profile)
    return 0


if __name__ == "__main__":
    sys.exit(main())
