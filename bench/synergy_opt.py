"""Tune and the other allocators against the OPT throughput bound on rounds sampled from a tune run."""

from __future__ import annotations

import statistics
from collections.abc import Sequence

from bench.synergy_runs import ALLOCATOR_LABELS, BIG_CLUSTER, SPLITS, TUNE_REF, make_allocator
from bench.synergy_tables import log, md_table, section
from scheduler_app.core.allocators import Allocator
from scheduler_app.core.allocators.opt import opt_throughput_bound, plan_throughput
from scheduler_app.core.types import ClusterSnapshot, JobView, RoundPlan
from scheduler_app.simulator import philly_derived_trace, simulate


# -- c. tune against the OPT bound on sampled rounds ----------------------------------------------------
class RoundSampler(Allocator):
    """Delegates to `inner` and keeps (ordered_jobs, snapshot) of every `every`-th round."""

    name = "sampler"
    # It counts its calls to sample every n-th round: the simulator must decide every round, not
    # reuse a steady plan (which it does for allocators that read no progress).
    reads_progress = True

    def __init__(self, inner: Allocator, every: int) -> None:
        self.inner = inner
        self.every = every
        self.calls = 0
        self.samples: list[tuple[tuple[JobView, ...], ClusterSnapshot]] = []

    def allocate(self, ordered_jobs: Sequence[JobView], snapshot: ClusterSnapshot) -> RoundPlan:
        self.calls += 1
        if self.calls % self.every == 0:
            self.samples.append((tuple(ordered_jobs), snapshot))
        return self.inner.allocate(ordered_jobs, snapshot)


LABELS = ("proportional", "greedy", "tune", "tune_matrix", "opt", TUNE_REF)
OptRows = tuple[list[list[object]], str]  # one workload's table rows, and its log line


def opt_workload_rows(jobs: int, every: int, workload: tuple[str, bool, float]) -> OptRows:
    """One workload of section c: its `jobs`-job tune run sampled every `every`-th round, each sample
    allocated by every allocator of LABELS and weighed against the OPT bound (a worker's task)."""
    name, multi, load = workload
    label = f"{'multi-GPU' if multi else '1 GPU'}, ({name}), {load:g}/h"
    trace = philly_derived_trace(jobs, jobs_per_hour=load, class_split=SPLITS[name], multi_gpu=multi, seed=1)
    sampler = RoundSampler(make_allocator("tune"), every)
    simulate(trace, BIG_CLUSTER, policy="fifo", allocator=sampler, finish_at_round_end=True)
    ratios: dict[str, list[float]] = {a: [] for a in LABELS}
    totals: dict[str, float] = {a: 0.0 for a in LABELS}
    total_bound = 0.0
    contended: list[bool] = []
    for jobs_, snapshot in sampler.samples:
        bound = opt_throughput_bound(jobs_, snapshot)
        total_bound += bound
        tputs = {a: plan_throughput(make_allocator(a).allocate(jobs_, snapshot)) for a in LABELS}
        contended.append(bound > tputs["proportional"] * 1.01)
        for a in LABELS:
            ratios[a].append(tputs[a] / bound if bound > 0 else 1.0)
            totals[a] += tputs[a]
    n_cont = sum(contended)
    rows: list[list[object]] = []
    for a in LABELS:
        allr = ratios[a]
        cont = [r for r, c in zip(allr, contended, strict=True) if c]
        rows.append(
            [
                label,
                ALLOCATOR_LABELS[a],
                f"{len(allr)}",
                f"{totals[a] / total_bound:.3f}" if total_bound > 0 else "-",
                f"{statistics.fmean(allr):.3f}",
                f"{min(allr):.3f}",
                f"{100 * sum(r >= 0.9 for r in allr) / len(allr):.0f} %",
                f"{n_cont}",
                f"{statistics.fmean(cont):.3f}" if cont else "-",
                f"{min(cont):.3f}" if cont else "-",
                f"{100 * sum(r >= 0.9 for r in cont) / len(cont):.0f} %" if cont else "-",
            ]
        )
    return rows, f"  {label}: {len(sampler.samples)} sampled rounds, {n_cont} contended"


def opt_section(
    command: str,
    jobs: int,
    every: int,
    workloads: Sequence[tuple[str, bool, float]],
    computed: Sequence[OptRows] | None = None,
) -> None:
    """Section c. `computed`: each workload's `opt_workload_rows`, worked out by the caller's workers
    (None: worked out here, one after the other)."""
    section(
        f"c. Throughput against the OPT bound on sampled rounds (128 GPUs, FIFO, {jobs} generated jobs "
        f"driven by tune, every {every}th round)",
        command,
    )
    if computed is None:
        computed = [opt_workload_rows(jobs, every, w) for w in workloads]
    rows: list[list[object]] = []
    for workload_rows, line in computed:
        log(line)
        rows += workload_rows
    print(
        md_table(
            [
                "workload",
                "allocator",
                "rounds",
                "total / total bound",
                "mean / bound",
                "min",
                "within 10 %",
                "contended rounds",
                "mean / bound",
                "min",
                "within 10 %",
            ],
            rows,
        )
    )
