"""How many decided rounds of bench.reproduce_synergy's runs repeat the round before: the most a rule
skipping rounds in which nothing happened could save.

Run: `python -m bench.repeated_rounds [--runs srtf:tune:4.5:multi,las:tune:4.5:multi,...]`.

Each run is one of the sweep's (7,000 jobs, split (20,70,10), seed 1, window 4000-4999, stop when
measured: `synergy_runs.simulate_windows`), with the simulator's `schedule_round` wrapped: a decided
round whose jobs are exactly those of the round decided 300 s before it (no arrival, no end, no drop)
is counted, and counted again where its placements (every job's shares and speed) are that round's
too. Printed per run: its CPU seconds, decided rounds and both counts.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable, Sequence
from typing import Any

import scheduler_app.simulator.simulation as simulation
from bench.synergy_runs import SPLITS, RunKey, Workload, simulate_windows, trace_for
from bench.synergy_tables import md_table

DEFAULT_RUNS = "srtf:tune:4.5:multi,las:tune:4.5:multi,srtf:tune:9:single,srtf:proportional:4.5:multi"
ROUND_S = 300.0  # the sweep's rounds
WINDOW = (4000, 5000)


class RepeatCounter:
    """Wraps schedule_round: each decided round against the one decided a round before it."""

    def __init__(self, decide: Callable[..., Any]) -> None:
        self.decide = decide
        self.decided = self.same_jobs = self.same_placements = 0
        self._last: tuple[float, frozenset[int], dict[int, tuple]] | None = None

    def __call__(self, snapshot: Any, views: Sequence[Any], **kwargs: Any) -> Any:
        plan = self.decide(snapshot, views, **kwargs)
        now_s = kwargs["now_s"]
        jobs = frozenset(v.job_id for v in views)
        placed = {
            d.job_id: (d.placement.shares, d.placement.speedup)
            for d in plan.decisions
            if d.placement is not None
        }
        self.decided += 1
        last = self._last
        if last is not None and last[0] == now_s - ROUND_S and last[1] == jobs:
            self.same_jobs += 1
            self.same_placements += last[2] == placed
        self._last = (now_s, jobs, placed)
        return plan


def counted_run(key: RunKey) -> tuple[float, RepeatCounter]:
    """CPU seconds of one sweep run, and its counts."""
    trace_for(key[0])  # generated outside the timing
    counter = RepeatCounter(simulation.schedule_round)
    simulation.schedule_round = counter
    try:
        started = time.process_time()
        simulate_windows(key)
        return time.process_time() - started, counter
    finally:
        simulation.schedule_round = counter.decide


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--runs", default=DEFAULT_RUNS, help="policy:allocator:jobs_per_hour:single|multi, ..."
    )
    args = parser.parse_args(argv)
    rows = []
    for spec in args.runs.split(","):
        policy, allocator, load, kind = spec.split(":")
        workload = Workload(7000, float(load), SPLITS["20,70,10"], kind == "multi", 1)
        cpu_s, counts = counted_run((workload, policy, allocator, (WINDOW,), 0.0))
        label = f"{policy} + {allocator}, {'multi-GPU' if kind == 'multi' else '1 GPU'}, {load} jobs/h"
        rows.append([label, f"{cpu_s:.1f}", counts.decided, counts.same_jobs, counts.same_placements])
    headers = ["run", "CPU s", "decided rounds", "with the last round's jobs", "and its placements"]
    print(md_table(headers, rows))


if __name__ == "__main__":
    main()
