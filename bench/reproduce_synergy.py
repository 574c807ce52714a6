"""Reproduce Synergy's headline figures (PAPERS.md section 6) with Attune's simulator, as Markdown tables."""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
from scipy.optimize import linprog

from bench import restart_axis
from bench.common import add_workers_argument, parallel_map
from profiles_app.catalog import load_catalog
from scheduler_app.core import reasons
from scheduler_app.core.allocators import ALLOCATORS, Allocator
from scheduler_app.core.allocators.opt import opt_throughput_bound, plan_throughput
from scheduler_app.core.allocators.tune import TuneAllocator, TuneRound
from scheduler_app.core.placement import FIRST_FIT, gpu_admission, infeasible_reasons
from scheduler_app.core.policies.base import Policy
from scheduler_app.core.policies.srtf import SrtfPolicy
from scheduler_app.core.restarts import RestartPolicy
from scheduler_app.core.throughput import ServerShape, best_case, relative_speed, with_penalty
from scheduler_app.core.types import ClusterSnapshot, JobView, RoundPlan
from scheduler_app.simulator import (
    ClusterSpec,
    SimulationResult,
    TraceJob,
    jct_stats,
    philly_derived_trace,
    read_trace,
    simulate,
)

REPO_ROOT = Path(__file__).resolve().parent.parent
# The reference traces copied into the repository (the dynamic one is not: pass --data-dir for it).
DEFAULT_DATA_DIR = REPO_ROOT / "tests/data/synergy"
STATIC_TRACE = "static_100job.csv"
DYNAMIC_TRACE = "dynamic_100job.csv"
BIG_CLUSTER = ClusterSpec(servers=16, gpus_per_server=8, cpus_per_server=24, mem_gb_per_server=500.0)
TESTBED = ClusterSpec(servers=4, gpus_per_server=8, cpus_per_server=24, mem_gb_per_server=500.0)
CAPACITY_JOBS = 100_000  # a long trace: its mean job size is close to the distribution's (16.8 GPU-hours)
# The reference's three splits (image, language, speech): default, equal, and image + speech only.
SPLITS: dict[str, tuple[int, int, int]] = {
    "20,70,10": (20, 70, 10),
    "33,33,33": (33, 33, 33),
    "50,0,50": (50, 0, 50),
}
TUNE_REF = "tune_ref"  # measurement-only: tune in policy order with first-fit placement (the reference's)
TUNE_DEMAND = "tune_demand"  # tune sorting by best-case CPU and memory too, as the paper's text says
ALLOCATOR_LABELS = {
    "proportional": "proportional",
    "greedy": "greedy",
    "tune": "tune",
    "tune_matrix": "tune_matrix",
    "opt": "opt",
    TUNE_REF: "tune, policy order + first fit",
    TUNE_DEMAND: "tune, order=demand",
}


# -- the reference's FIFO+tune: no sort by demand, first-fit placement --------------------------------
class PolicyOrderTuneRound(TuneRound):
    """Tune's round with the admitted jobs placed in policy order, as the reference's FIFO/SRTF+tune do.

    Mirrors TuneRound.run except that the admitted set is not sorted by (GPUs, CPU, memory) demand.
    Measurement only (docs/reference-synergy.md section 4); the shipped allocator is `tune`.
    """

    def run(self) -> RoundPlan:
        jobs, builder = self.jobs, self.builder
        infeasible = infeasible_reasons(jobs, self.snapshot)
        admitted = gpu_admission(jobs, infeasible, self.state.free_gpu_count)
        order: list[int] = []
        for pos, why in enumerate(infeasible):
            if why is not None:
                builder.infeasible(pos, why)
            elif not admitted[pos]:
                builder.pending(pos, reasons.INSUFFICIENT_GPUS)
            else:
                order.append(pos)
        claim_current = getattr(self.state, "claim_current", None)
        if claim_current is not None:  # placement stickiness, where the core has it (as tune does)
            claim_current(jobs[pos] for pos in order)
        for pos in order:
            self.place_job(pos)
        state = self.state
        for h in self.held:
            speed = with_penalty(h.speed, h.job.profile, len(h.shares), h.job.num_gpus)
            builder.placed(h.pos, state.server_shares(h.shares), speed, h.reason)
        return builder.build()


class PolicyOrderTune(TuneAllocator):
    """`tune` placing jobs in policy order with first fit (the reference's evaluated FIFO+tune)."""

    name = TUNE_REF
    round_class = PolicyOrderTuneRound

    def __init__(self) -> None:
        super().__init__(placement=FIRST_FIT)


def make_allocator(label: str) -> Allocator:
    if label == TUNE_REF:
        return PolicyOrderTune()
    if label == TUNE_DEMAND:
        return TuneAllocator(order="demand")
    return ALLOCATORS.get(label)()


# -- running simulations, with an in-process cache ----------------------------------------------------
@dataclass(frozen=True)
class Workload:
    """A generated Philly-derived trace on the 128-GPU cluster."""

    jobs: int
    load: float
    split: tuple[int, int, int]
    multi_gpu: bool
    seed: int


_TRACES: dict[Workload, list[TraceJob]] = {}
_RUNS: dict[tuple[Any, ...], dict[tuple[int, int], float]] = {}
_RAW: list[dict[str, Any]] = []
_PROGRESS_FILE: Path | None = None


def trace_for(w: Workload) -> list[TraceJob]:
    if w not in _TRACES:
        _TRACES[w] = philly_derived_trace(
            w.jobs, jobs_per_hour=w.load, class_split=w.split, multi_gpu=w.multi_gpu, seed=w.seed
        )
    return _TRACES[w]


def log(msg: str) -> None:
    sys.stderr.write(msg + "\n")
    sys.stderr.flush()


def window_jct(result: SimulationResult, windows: Sequence[tuple[int, int]]) -> dict[tuple[int, int], float]:
    """Mean JCT (hours) of the finished jobs with ids in each [lo, hi) window, from the per-job records."""
    out: dict[tuple[int, int], float] = {}
    for lo, hi in windows:
        jcts = [r.jct_s for r in result.records if lo <= r.job_id < hi and r.jct_s is not None]
        expected = sum(1 for r in result.records if lo <= r.job_id < hi)
        out[(lo, hi)] = jct_stats(jcts).avg_h if len(jcts) == expected else float("nan")
    return out


def run_windows(
    w: Workload,
    policy: str,
    label: str,
    windows: Sequence[tuple[int, int]],
    restart_cost_s: float = 0.0,
) -> dict[tuple[int, int], float]:
    """Simulate once (round-end convention, stop once every window has finished); mean JCT per window.

    One run serves several windows only under FIFO with single-GPU jobs, where a job is never affected
    by later arrivals; otherwise pass one window, which is then measured exactly as the reference does.
    Runs already made by `prefetch` (or read by `preload`) are not repeated. `restart_cost_s`: seconds
    of start-up per restart with the live move guard (bench/restart_axis.py); 0, the paper's free
    restarts.
    """
    key = (w, policy, label, tuple(windows), float(restart_cost_s))
    if key not in _RUNS:
        _record(key, _simulate_windows(key))
    return _RUNS[key]


# (workload, policy, allocator, windows, restart cost in seconds: 0 for the paper's free restarts)
RunKey = tuple[Workload, str, str, tuple[tuple[int, int], ...], float]


def _simulate_windows(key: RunKey) -> tuple[dict[tuple[int, int], float], float, int]:
    """One run of run_windows (a worker process's task): mean JCT per window, wall seconds, rounds."""
    w, policy, label, windows, restart_cost_s = key
    lo, hi = min(win[0] for win in windows), max(win[1] for win in windows)
    result = simulate(
        trace_for(w),
        BIG_CLUSTER,
        policy=policy,
        allocator=make_allocator(label),
        finish_at_round_end=True,
        measured_job_ids=(lo, hi),
        stop_when_measured=True,
        **restart_axis.simulate_kwargs(restart_cost_s, RestartPolicy()),
    )
    return window_jct(result, windows), result.wall_s, result.rounds


def _record(key: RunKey, outcome: tuple[dict[tuple[int, int], float], float, int]) -> None:
    w, policy, label, _, restart_cost_s = key
    jcts, wall_s, rounds = outcome
    _RUNS[key] = jcts
    cost = f" restart cost {restart_cost_s:g} s" if restart_cost_s else ""
    log(
        f"  {policy}/{label} load {w.load} split {w.split} multi {w.multi_gpu} seed {w.seed}{cost}: "
        f"{wall_s:.1f} s, {rounds} rounds"
    )
    entry = {
        "workload": w.__dict__,
        "policy": policy,
        "allocator": label,
        "windows": {f"{a}:{b}": v for (a, b), v in jcts.items()},
        "wall_s": wall_s,
    }
    if restart_cost_s:
        entry["restart_cost_s"] = restart_cost_s
    _RAW.append(entry)
    if _PROGRESS_FILE is not None:  # one JSON line a run, so a long sweep can be resumed
        with _PROGRESS_FILE.open("a") as f:
            f.write(json.dumps(entry) + "\n")


# Rough CPU seconds of one sweep run by (policy, multi-GPU jobs), from single runs timed on the
# 2-core machine (2026-11-30, docs/performance.md "Reproduction sweeps on every core"): only the
# order in which the workers are handed the runs, longest first, so that none is left alone with a
# long run at the end. Unknown kinds count as the longest.
_RUN_COST_S = {
    ("las", True): 45.0,
    ("las", False): 35.0,
    ("srtf", True): 30.0,
    ("srtf", False): 18.0,
    ("fifo", True): 16.0,
    ("fifo", False): 6.0,
}


def longest_first(keys: Sequence[RunKey]) -> list[int]:
    """Positions of `keys` by their rough cost, longest first (ties in the keys' order)."""
    cost = [_RUN_COST_S.get((k[1], k[0].multi_gpu), 60.0) for k in keys]
    return sorted(range(len(keys)), key=lambda i: -cost[i])


def prefetch(keys: Sequence[RunKey], workers: int) -> None:
    """Make the runs of `keys` not made yet, `workers` at a time (bench.common.parallel_map), handed
    to the workers longest first; they are recorded in the keys' order, so the --json and --progress
    files do not depend on the workers."""
    todo = list(dict.fromkeys(k for k in keys if k not in _RUNS))
    order = longest_first(todo) if workers > 1 else list(range(len(todo)))
    outcomes = parallel_map(_simulate_windows, [todo[i] for i in order], workers=workers)
    by_pos = dict(zip(order, outcomes, strict=True))
    for pos, key in enumerate(todo):
        _record(key, by_pos[pos])


def preload(path: Path) -> None:
    """Fill the run cache from a --json file or a --progress file (one JSON object a line), so
    tables can be printed again, or a sweep resumed, without simulating again."""
    text = path.read_text()
    entries = (
        json.loads(text) if text.lstrip().startswith("[") else [json.loads(x) for x in text.splitlines() if x]
    )
    for entry in entries:
        wd = entry["workload"]
        w = Workload(wd["jobs"], wd["load"], tuple(wd["split"]), wd["multi_gpu"], wd["seed"])
        windows = {tuple(int(x) for x in k.split(":")): v for k, v in entry["windows"].items()}
        key = (
            w,
            entry["policy"],
            entry["allocator"],
            tuple(windows),
            float(entry.get("restart_cost_s", 0.0)),
        )
        _RUNS[key] = windows
        _RAW.append(entry)


# -- formatting -----------------------------------------------------------------------------------------
def md_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    def cell(v: Any) -> str:
        if isinstance(v, float):
            return "-" if v != v else f"{v:.2f}"
        return str(v)

    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


def spread(values: Sequence[float]) -> str:
    """'mean (min-max)' over seeds, or the value alone for one seed."""
    vals = [v for v in values if v == v]
    if not vals:
        return "-"
    if len(vals) == 1:
        return f"{vals[0]:.2f}"
    return f"{statistics.fmean(vals):.2f} ({min(vals):.2f}-{max(vals):.2f})"


def section(title: str, command: str) -> None:
    print(f"\n### {title}\n\nCommand: `{command}`\n")


# -- a. static 100-job trace on the 32-GPU testbed ------------------------------------------------------
def testbed_trace(data_dir: Path, file_name: str, title: str, command: str) -> list[TraceJob] | None:
    """Print the section's heading and read one of the reference's testbed traces (None: not there)."""
    path = data_dir / file_name
    section(f"{title}, 4 x 8 GPUs (24 cores, 500 GB each), 300 s rounds", command)
    if not path.is_file():
        print(f"(trace {path} not found: pass --data-dir)")
        return None
    return read_trace(path)


def static_section(data_dir: Path, command: str) -> None:
    trace = testbed_trace(data_dir, STATIC_TRACE, "a. Static 100-job trace, FIFO", command)
    if trace is None:
        return
    rows, base = [], {}
    for label in ("proportional", "greedy", "tune", "tune_matrix", "opt", TUNE_REF, TUNE_DEMAND):
        row: list[Any] = [ALLOCATOR_LABELS[label]]
        figures = []
        for round_end in (False, True):
            r = simulate(
                trace, TESTBED, policy="fifo", allocator=make_allocator(label), finish_at_round_end=round_end
            )
            figures.append((r.makespan_h, r.avg_jct_h))
            if label == "proportional":
                base[round_end] = r.makespan_h
        (mk_x, jct_x), (mk_r, jct_r) = figures
        row += [mk_x, mk_r, jct_x, jct_r, f"{base[False] / mk_x:.3f}x", f"{base[True] / mk_r:.3f}x"]
        rows.append(row)
    print(
        md_table(
            [
                "allocator",
                "makespan h (exact)",
                "makespan h (round end)",
                "avg JCT h (exact)",
                "avg JCT h (round end)",
                "makespan speed-up (exact)",
                "(round end)",
            ],
            rows,
        )
    )


def dynamic_section(data_dir: Path, command: str) -> None:
    """The paper's second testbed experiment: the dynamic 100-job trace under SRTF (PAPERS 6, row 3)."""
    trace = testbed_trace(data_dir, DYNAMIC_TRACE, "a'. Dynamic 100-job trace, SRTF", command)
    if trace is None:
        return
    rows, base = [], {}
    variants: list[tuple[str, str, Policy]] = [
        (ALLOCATOR_LABELS[a], a, SrtfPolicy())
        for a in ("proportional", "greedy", "tune", "tune_matrix", "opt", TUNE_REF)
    ]
    # The reference's Synergy mode orders SRTF by the remaining time at the best-case speed-up.
    variants.append(("tune, SRTF by best-case remaining time", "tune", SrtfPolicy(speedup_aware=True)))
    for name, label, policy in variants:
        row: list[Any] = [name]
        figures = []
        for round_end in (False, True):
            r = simulate(
                trace, TESTBED, policy=policy, allocator=make_allocator(label), finish_at_round_end=round_end
            )
            figures.append((r.avg_jct_h, r.p99_jct_h, r.makespan_h))
            if name == "proportional":
                base[round_end] = r.avg_jct_h
        (jct_x, p99_x, mk_x), (jct_r, _, _) = figures
        row += [jct_x, jct_r, p99_x, mk_x, f"{base[False] / jct_x:.3f}x", f"{base[True] / jct_r:.3f}x"]
        rows.append(row)
    print(
        md_table(
            [
                "allocator",
                "avg JCT h (exact)",
                "avg JCT h (round end)",
                "p99 JCT h (exact)",
                "makespan h (exact)",
                "avg JCT gain (exact)",
                "(round end)",
            ],
            rows,
        )
    )


# -- capacity: where the 128-GPU cluster saturates --------------------------------------------------------
def no_queueing_gain(trace: Sequence[TraceJob], cluster: ClusterSpec) -> float:
    """Tune's mean-JCT gain over proportional if no job ever waited or shared: every job at its best case.

    Mean of the jobs' proportional durations over the mean of their best-case durations. It is the limit
    of the gain as the load goes to 0; any larger gain has to come from queueing (a shorter wait).
    """
    catalog = load_catalog()
    shape = ServerShape(cluster.gpus_per_server, float(cluster.cpus_per_server), cluster.mem_gb_per_server)
    at_proportional = at_best = 0.0
    for t in trace:
        duration_s = t.total_iters * catalog[t.model].iter_time_s
        at_proportional += duration_s
        at_best += duration_s / best_case(catalog[t.model], t.num_gpus, shape).speed
    return at_proportional / at_best


def fluid_capacity(trace: Sequence[TraceJob], cluster: ClusterSpec) -> tuple[float, float, float]:
    """Mean GPU-hours a job (at proportional), saturation jobs/h at proportional and at the best CPU/memory.

    The second is the fluid LP: choose per (model, GPU count) class a mix of operating points (matrix grid
    points at least as fast as proportional, and the capped best case) that serves the arrival rate, within
    the cluster's total GPUs, cores and memory; maximise the arrival rate. No packing or ordering losses, so
    no allocator can sustain a higher load.
    """
    catalog = load_catalog()
    shape = ServerShape(cluster.gpus_per_server, float(cluster.cpus_per_server), cluster.mem_gb_per_server)
    work: dict[tuple[str, int], float] = {}
    for t in trace:
        key = (t.model, t.num_gpus)
        work[key] = work.get(key, 0.0) + t.total_iters * catalog[t.model].iter_time_s * t.num_gpus / 3600.0
    span_jobs = len(trace)
    mean_work = sum(work.values()) / span_jobs
    columns: list[tuple[int, float, float, float]] = []  # (class, speed, cpus/GPU, mem/GPU)
    classes = sorted(work)
    for ci, (model, gpus) in enumerate(classes):
        profile = catalog[model]
        best = best_case(profile, gpus, shape)
        points = {
            (best.cpus_per_gpu, best.mem_gb_per_gpu): best.speed,
            (shape.cpus_per_gpu, shape.mem_gb_per_gpu): 1.0,
        }
        on_one = min(gpus, shape.num_gpus)  # a job never holds more than one server's share per GPU
        for c in profile.cpu_per_gpu_grid:
            for m in profile.mem_gb_per_gpu_grid:
                if c <= shape.num_cpus / on_one and m <= shape.mem_gb / on_one:
                    s = relative_speed(profile, gpus, shape, c, m)
                    if s >= 1.0:
                        points.setdefault((c, m), s)
        columns += [(ci, s, c, m) for (c, m), s in points.items()]
    n = len(columns)
    # Variables: GPUs busy at each column (n), then the arrival rate lam. Maximise lam.
    cost = np.zeros(n + 1)
    cost[-1] = -1.0
    a_ub, b_ub = [], []
    for ci, key in enumerate(classes):
        row = np.zeros(n + 1)  # lam * share * work - sum(gpus * speed) <= 0
        for j, (cj, s, _, _) in enumerate(columns):
            if cj == ci:
                row[j] = -s
        row[-1] = work[key] / span_jobs
        a_ub.append(row)
        b_ub.append(0.0)
    for idx, cap in ((None, cluster.total_gpus), (2, cluster.total_cpus), (3, cluster.total_mem_gb)):
        row = np.zeros(n + 1)
        for j, col in enumerate(columns):
            row[j] = 1.0 if idx is None else col[idx]
        a_ub.append(row)
        b_ub.append(float(cap))
    res = linprog(
        cost, A_ub=np.array(a_ub), b_ub=np.array(b_ub), bounds=[(0, None)] * (n + 1), method="highs"
    )
    return mean_work, cluster.total_gpus / mean_work, float(res.x[-1]) if res.success else float("nan")


def capacity_section(command: str, jobs: int, seeds: Sequence[int]) -> None:
    section("Capacity of the 128-GPU cluster (16 x 8 GPUs, 24 cores, 500 GB)", command)
    headers = [
        "jobs",
        "split",
        "trace",
        "mean GPU-h per job (proportional)",
        "saturation jobs/h, proportional",
        "saturation jobs/h, best CPU/mem (fluid LP)",
        "ratio",
        "tune's gain with no queueing (load -> 0)",
    ]
    rows = []
    for multi in (False, True):
        kind = "multi-GPU" if multi else "1 GPU"
        for name, split in SPLITS.items():
            traces = [(f"{CAPACITY_JOBS:,} jobs, seed 1", CAPACITY_JOBS, 1)]
            if name == "20,70,10":  # durations do not depend on the class: the other split's figures match
                traces += [(f"{jobs:,} jobs, seed {seed}", jobs, seed) for seed in seeds]
            for label, n, seed in traces:
                trace = philly_derived_trace(
                    n, jobs_per_hour=9.0, class_split=split, multi_gpu=multi, seed=seed
                )
                mean_work, sat_prop, sat_fluid = fluid_capacity(trace, BIG_CLUSTER)
                gain = no_queueing_gain(trace, BIG_CLUSTER)
                rows.append([kind, name, label, mean_work, sat_prop, sat_fluid, sat_fluid / sat_prop, gain])
    print(md_table(headers, rows))


# -- b. load sweeps on 128 GPUs -----------------------------------------------------------------------------
@dataclass(frozen=True)
class Sweep:
    policy: str
    split: str
    multi_gpu: bool
    loads: tuple[float, ...]
    seeds: tuple[int, ...]
    allocators: tuple[str, ...]

    @property
    def key(self) -> str:
        """How --sweeps names it: policy:split with dashes, ':multi' for multi-GPU jobs."""
        return f"{self.policy}:{self.split.replace(',', '-')}" + (":multi" if self.multi_gpu else "")


def sweep_table(s: Sweep, jobs: int, window: tuple[int, int]) -> None:
    others = [a for a in s.allocators if a != "proportional"]
    rows = []
    for load in s.loads:
        jct: dict[str, list[float]] = {a: [] for a in s.allocators}
        for seed in s.seeds:
            w = Workload(jobs, load, SPLITS[s.split], s.multi_gpu, seed)
            for a in s.allocators:
                jct[a].append(run_windows(w, s.policy, a, [window])[window])
        row: list[Any] = [f"{load:g}"] + [spread(jct[a]) for a in s.allocators]
        for a in others:
            gains = [p / x for p, x in zip(jct["proportional"], jct[a], strict=True)]
            row.append(spread(gains))
            if len(s.seeds) > 1:
                row.append(", ".join(f"{g:.2f}" for g in gains))
        rows.append(row)
    headers = ["jobs/h"] + [f"{ALLOCATOR_LABELS[a]} JCT h" for a in s.allocators]
    for a in others:
        headers.append(f"gain {ALLOCATOR_LABELS[a]}")
        if len(s.seeds) > 1:
            headers.append("per seed")
    kind = "multi-GPU" if s.multi_gpu else "single-GPU"
    seeds = ",".join(str(x) for x in s.seeds)
    print(
        f"\n**{s.policy.upper()}, {kind}, split ({s.split}), seeds {seeds}, {jobs:,} jobs** "
        f"(mean JCT of ids [{window[0]}, {window[1]}); mean (min-max) over seeds)\n"
    )
    print(md_table(headers, rows))


def window_position_table(s: Sweep, jobs: int, windows: Sequence[tuple[int, int]]) -> None:
    """FIFO, single-GPU: gain of tune over proportional measured on successive id windows of the same runs."""
    rows = []
    for load in s.loads:
        gains: dict[tuple[int, int], list[float]] = {win: [] for win in windows}
        prop_jct: dict[tuple[int, int], list[float]] = {win: [] for win in windows}
        for seed in s.seeds:
            w = Workload(jobs, load, SPLITS[s.split], s.multi_gpu, seed)
            prop = run_windows(w, s.policy, "proportional", windows)
            tune = run_windows(w, s.policy, "tune", windows)
            for win in windows:
                gains[win].append(prop[win] / tune[win])
                prop_jct[win].append(prop[win])
        rows.append(
            [f"{load:g}"]
            + [spread(prop_jct[win]) for win in (windows[0], windows[-1])]
            + [spread(gains[win]) for win in windows]
        )
    headers = [
        "jobs/h",
        f"proportional JCT h, ids {windows[0][0]}-{windows[0][1] - 1}",
        f"proportional JCT h, ids {windows[-1][0]}-{windows[-1][1] - 1}",
    ] + [f"gain, ids {lo}-{hi - 1}" for lo, hi in windows]
    print(
        f"\n**Window position: FIFO, single-GPU, split ({s.split}), seeds "
        f"{','.join(str(x) for x in s.seeds)}: tune's gain on successive job-id windows of the same runs**\n"
    )
    print(md_table(headers, rows))


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


def opt_section(command: str, jobs: int, every: int, workloads: Sequence[tuple[str, bool, float]]) -> None:
    section(
        f"c. Throughput against the OPT bound on sampled rounds (128 GPUs, FIFO, {jobs} generated jobs "
        f"driven by tune, every {every}th round)",
        command,
    )
    labels = ("proportional", "greedy", "tune", "tune_matrix", "opt", TUNE_REF)
    rows = []
    for name, multi, load in workloads:
        label = f"{'multi-GPU' if multi else '1 GPU'}, ({name}), {load:g}/h"
        trace = philly_derived_trace(
            jobs, jobs_per_hour=load, class_split=SPLITS[name], multi_gpu=multi, seed=1
        )
        sampler = RoundSampler(make_allocator("tune"), every)
        simulate(trace, BIG_CLUSTER, policy="fifo", allocator=sampler, finish_at_round_end=True)
        ratios: dict[str, list[float]] = {a: [] for a in labels}
        totals: dict[str, float] = {a: 0.0 for a in labels}
        total_bound = 0.0
        contended: list[bool] = []
        for jobs_, snapshot in sampler.samples:
            bound = opt_throughput_bound(jobs_, snapshot)
            total_bound += bound
            tputs = {a: plan_throughput(make_allocator(a).allocate(jobs_, snapshot)) for a in labels}
            contended.append(bound > tputs["proportional"] * 1.01)
            for a in labels:
                ratios[a].append(tputs[a] / bound if bound > 0 else 1.0)
                totals[a] += tputs[a]
        n_cont = sum(contended)
        log(f"  {label}: {len(sampler.samples)} sampled rounds, {n_cont} contended")
        for a in labels:
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


# -- driver -------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Config:
    jobs: int
    window: tuple[int, int]
    position_windows: tuple[tuple[int, int], ...]
    sweeps: tuple[Sweep, ...]
    position_sweep: Sweep | None
    multi_sweeps: tuple[Sweep, ...]
    opt_jobs: int
    opt_every: int
    opt_workloads: tuple[tuple[str, bool, float], ...]


SINGLE_LOADS = (6.0, 7.0, 8.0, 9.0, 10.0, 11.0)
HEADLINE_LOADS = (6.0, 7.0, 8.0, 8.5, 9.0, 10.0, 11.0)  # finer around saturation (about 7.5-9 jobs/h)
# The image-heavy mix saturates the cluster at about 7.7 (proportional) and 7.9-8.4 jobs/h (tune).
IMAGE_LOADS = (6.0, 7.0, 7.5, 8.0, 8.25, 8.5, 9.0)
# The equal split saturates at about 7.7 (proportional) and 9.7 jobs/h (fluid LP).
EQUAL_LOADS = (6.0, 7.0, 8.0, 9.0, 10.0)
MULTI_LOADS = (3.0, 3.5, 4.0, 4.5, 5.0)
TWO_WAY = ("proportional", "tune")
THREE_WAY = ("proportional", "tune", "tune_matrix")
FULL = Config(
    # Arrivals go on after the measured window (ids 4000-4999), up to job 7000; the reference's
    # stream has no end. Past proportional's saturation point that matters for SRTF and LAS, where
    # later jobs overtake: --jobs makes the stream longer (docs/reproduction.md, b2).
    jobs=7000,
    window=(4000, 5000),
    position_windows=((1000, 2000), (2000, 3000), (3000, 4000), (4000, 5000)),
    sweeps=(
        Sweep("fifo", "20,70,10", False, HEADLINE_LOADS, (1, 2, 3), TWO_WAY),
        Sweep("fifo", "33,33,33", False, EQUAL_LOADS, (1, 2, 3), TWO_WAY),
        Sweep("fifo", "50,0,50", False, IMAGE_LOADS, (1,), TWO_WAY),
        Sweep("srtf", "20,70,10", False, SINGLE_LOADS, (1,), TWO_WAY),
        Sweep("srtf", "33,33,33", False, EQUAL_LOADS, (1,), TWO_WAY),
        Sweep("srtf", "50,0,50", False, IMAGE_LOADS, (1,), TWO_WAY),
        Sweep("las", "20,70,10", False, (8.0, 10.0, 12.0, 14.0), (1,), TWO_WAY),
    ),
    position_sweep=Sweep("fifo", "20,70,10", False, HEADLINE_LOADS, (1, 2, 3), TWO_WAY),
    multi_sweeps=tuple(
        Sweep(p, split, True, MULTI_LOADS, (1,), TWO_WAY)
        for split in ("20,70,10", "33,33,33")
        for p in ("fifo", "srtf", "las")
    ),
    opt_jobs=3000,
    opt_every=60,
    opt_workloads=(
        ("20,70,10", False, 9.0),
        ("33,33,33", False, 9.0),
        ("50,0,50", False, 9.0),
        ("20,70,10", True, 4.5),
    ),
)
QUICK = Config(
    jobs=3000,
    window=(2000, 3000),
    position_windows=((1000, 2000), (2000, 3000)),
    sweeps=(Sweep("fifo", "20,70,10", False, (6.0, 9.0), (1,), ("proportional", "tune")),),
    position_sweep=Sweep("fifo", "20,70,10", False, (6.0, 9.0), (1,), ("proportional", "tune")),
    multi_sweeps=(),
    opt_jobs=1000,
    opt_every=60,
    opt_workloads=(("20,70,10", False, 9.0), ("50,0,50", False, 9.0)),
)
SECTIONS = ("static", "dynamic", "capacity", "load", "multi", "opt")
# Run only when asked (--sections restarts, or --restart-costs): the restart-cost axis of the headlines.
RESTARTS = "restarts"
RESTART_LOAD = 9.0  # the load sweep's headline load (FIFO, split (20,70,10))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="a small grid (minutes) exercising every table")
    parser.add_argument("--data-dir", type=Path, default=DEFAULT_DATA_DIR, help="reference traces' folder")
    parser.add_argument(
        "--sections", default=",".join(SECTIONS), help=f"comma list of {', '.join((*SECTIONS, RESTARTS))}"
    )
    restart_axis.add_arguments(parser)
    parser.add_argument("--json", type=Path, help="also write every simulated run's window JCTs here")
    parser.add_argument(
        "--reuse", type=Path, help="a --json file of an earlier run: its simulations are not repeated"
    )
    parser.add_argument(
        "--progress", type=Path, help="append every run here as it finishes (JSON lines; resume with --reuse)"
    )
    parser.add_argument(
        "--sweeps",
        help="only these load sweeps, a comma list of policy:split[:multi] (fifo:20,70,10 is "
        "'fifo:20-70-10'; the multi-GPU one 'fifo:20-70-10:multi')",
    )
    parser.add_argument(
        "--jobs",
        type=int,
        help="jobs per generated sweep trace (default 7000); more keeps arrivals coming longer after it",
    )
    add_workers_argument(parser)
    args = parser.parse_args()
    logging.getLogger("scheduler_app").setLevel(logging.WARNING)  # no per-run INFO lines

    cfg = QUICK if args.quick else FULL
    if args.jobs is not None:
        if args.jobs < cfg.window[1]:
            parser.error(f"--jobs must be at least {cfg.window[1]}, the end of the measured window")
        cfg = replace(cfg, jobs=args.jobs)
    if args.sweeps:
        wanted_sweeps = set(args.sweeps.split(","))
        cfg = replace(
            cfg,
            sweeps=tuple(x for x in cfg.sweeps if x.key in wanted_sweeps),
            position_sweep=cfg.position_sweep if "fifo:20-70-10" in wanted_sweeps else None,
            multi_sweeps=tuple(x for x in cfg.multi_sweeps if x.key in wanted_sweeps),
        )
    global _PROGRESS_FILE
    _PROGRESS_FILE = args.progress
    if args.reuse:
        preload(args.reuse)
    wanted = set(args.sections.split(","))
    if args.restart_costs and args.sections == ",".join(SECTIONS):
        wanted = {RESTARTS}
    unknown = wanted - {*SECTIONS, RESTARTS}
    if unknown:
        parser.error(f"unknown sections {sorted(unknown)}; valid: {', '.join(SECTIONS)}")
    command = "python -m bench.reproduce_synergy" + (" --quick" if args.quick else "")
    if args.sections != ",".join(SECTIONS):
        command += f" --sections {args.sections}"
    command += restart_axis.command_options(args)
    if args.sweeps:
        command += f" --sweeps {args.sweeps}"
    if args.jobs is not None:
        command += f" --jobs {args.jobs}"
    started = time.perf_counter()
    # The sweeps' runs are independent: made up front on every core, then the tables read them.
    prefetch(sweep_keys(cfg, wanted), args.workers)
    steps: dict[str, Callable[[], None]] = {
        "static": lambda: static_section(args.data_dir, command),
        "dynamic": lambda: dynamic_section(args.data_dir, command),
        "capacity": lambda: capacity_section(command, cfg.jobs, cfg.sweeps[0].seeds),
        "load": lambda: load_section(cfg, command),
        "multi": lambda: multi_section(cfg, command),
        "opt": lambda: opt_section(command, cfg.opt_jobs, cfg.opt_every, cfg.opt_workloads),
        RESTARTS: lambda: restarts_section(args, cfg, command),
    }
    for name in (*SECTIONS, RESTARTS):
        if name in wanted:
            t0 = time.perf_counter()
            steps[name]()
            log(f"[{name}: {time.perf_counter() - t0:.0f} s]")
    print(f"\n(total wall time {time.perf_counter() - started:.0f} s)")
    if args.json:
        args.json.write_text(json.dumps(_RAW, indent=1))


def sweep_keys(cfg: Config, sections: set[str]) -> list[RunKey]:
    """Every run the load and multi sections will ask run_windows for, in the order they ask."""
    keys: list[RunKey] = []

    def windows_of(sweep: Sweep) -> tuple[tuple[int, int], ...]:
        # As load_section: FIFO with single-GPU jobs measures every window in one run.
        fifo_single = sweep.policy == "fifo" and not sweep.multi_gpu
        return tuple(cfg.position_windows) if fifo_single else (cfg.window,)

    sweeps = [*cfg.sweeps] if "load" in sections else []
    sweeps += [*cfg.multi_sweeps] if "multi" in sections else []
    for s in sweeps:
        for load in s.loads:
            for seed in s.seeds:
                w = Workload(cfg.jobs, load, SPLITS[s.split], s.multi_gpu, seed)
                keys += [(w, s.policy, a, windows_of(s), 0.0) for a in s.allocators]
    if "load" in sections and cfg.position_sweep is not None:
        s = cfg.position_sweep
        for load in s.loads:
            for seed in s.seeds:
                w = Workload(cfg.jobs, load, SPLITS[s.split], s.multi_gpu, seed)
                keys += [(w, s.policy, a, tuple(cfg.position_windows), 0.0) for a in ("proportional", "tune")]
    return keys


def load_section(cfg: Config, command: str) -> None:
    section(
        f"b. Load sweep, 128 GPUs, {cfg.jobs} generated single-GPU jobs (arrivals go on after the window), "
        f"JCT of ids [{cfg.window[0]}, {cfg.window[1]}), reference round-end convention, stop when measured",
        command,
    )
    for s in cfg.sweeps:
        if s.policy == "fifo" and not s.multi_gpu:
            # FIFO, single-GPU jobs: later arrivals never affect earlier jobs; one run measures every window.
            for seed in s.seeds:
                for load in s.loads:
                    w = Workload(cfg.jobs, load, SPLITS[s.split], False, seed)
                    for a in s.allocators:
                        _RUNS[(w, s.policy, a, (cfg.window,), 0.0)] = {
                            cfg.window: run_windows(w, s.policy, a, cfg.position_windows)[cfg.window]
                        }
        sweep_table(s, cfg.jobs, cfg.window)
    if cfg.position_sweep is not None:
        window_position_table(cfg.position_sweep, cfg.jobs, cfg.position_windows)


def multi_section(cfg: Config, command: str) -> None:
    if not cfg.multi_sweeps:
        return
    section(
        f"b'. Load sweep with multi-GPU jobs (1/2/4/8 GPUs, 70/10/15/5 %), 128 GPUs, {cfg.jobs} jobs, "
        f"JCT of ids [{cfg.window[0]}, {cfg.window[1]})",
        command,
    )
    for s in cfg.multi_sweeps:
        sweep_table(s, cfg.jobs, cfg.window)


# -- the headlines with restart costs (issue 36) -----------------------------------------------------
def restart_row(
    cost_s: float,
    prop: list[SimulationResult],
    tune: list[SimulationResult],
    window: tuple[int, int],
    gain0: float | None,
) -> tuple[list[Any], float]:
    """One cost's row: JCTs and gain (means over seeds of the per-seed figures), kept share, restarts."""
    jct_p = [window_jct(r, [window])[window] for r in prop]
    jct_t = [window_jct(r, [window])[window] for r in tune]
    gain = statistics.fmean(p / t for p, t in zip(jct_p, jct_t, strict=True))
    ids = range(*window)
    fig_t = [restart_axis.restart_figures(r, ids) for r in tune]
    fig_p = [restart_axis.restart_figures(r, ids) for r in prop]

    def mean(figs: list[dict[str, float]], key: str) -> float:
        return statistics.fmean(f[key] for f in figs)

    kept = "100 %" if gain0 is None else f"{restart_axis.kept_pct(gain0 - 1, gain - 1):.0f} %"
    row = [
        restart_axis.cost_label(cost_s),
        spread(jct_p),
        spread(jct_t),
        f"{gain:.3f}x",
        kept,
        f"{mean(fig_t, 'preemptions_per_job'):.2f}",
        f"{mean(fig_t, 'moves_per_job'):.2f}",
        f"{mean(fig_t, 'lost_gpu_h'):.1f}",
        f"{mean(fig_p, 'preemptions_per_job'):.2f}",
        f"{mean(fig_p, 'lost_gpu_h'):.1f}",
    ]
    return row, gain


RESTART_HEADERS = [
    "restart cost",
    "proportional avg JCT h",
    "tune avg JCT h",
    "tune's gain",
    "share of the zero-cost gain kept",
    "tune: preemptions per job",
    "tune: moves per job",
    "tune: GPU-h lost to restarts",
    "proportional: preemptions per job",
    "proportional: GPU-h lost",
]


def restarts_section(args: argparse.Namespace, cfg: Config, command: str) -> None:
    """Tune's average-JCT gain over proportional on the static trace and at 9 jobs/h (FIFO, (20,70,10))
    at each restart cost (bench/restart_axis.py); both allocators pay the same costs."""
    costs = restart_axis.costs_of(args.restart_costs)
    costs = costs if 0.0 in costs else (0.0, *costs)
    policy = restart_axis.policy_of(args)
    section("With restart costs: tune against proportional, FIFO", command)
    print(
        f"Per restart: the cost's start-up ({restart_axis.startup_note(args)}), and the work since the "
        f"last checkpoint (every {restart_axis.CHECKPOINT_EVERY_S:g} s of run) done again; "
        f"{restart_axis.policy_note(policy)}. Cost 0: free restarts, no guard (the paper's setting)."
    )
    trace = read_trace(args.data_dir / STATIC_TRACE)
    rows, gain0 = [], None
    whole = (0, len(trace))
    for cost_s in costs:
        kw = restart_axis.simulate_kwargs(cost_s, policy, first_start_waits=not args.free_first_start)
        runs = [simulate(trace, TESTBED, policy="fifo", allocator=make_allocator(a), **kw) for a in TWO_WAY]
        row, gain = restart_row(cost_s, [runs[0]], [runs[1]], whole, gain0)
        gain0 = gain if gain0 is None else gain0
        rows.append(row)
        log(f"  static, restart cost {cost_s:g} s: {row}")
    print(f"\n**Static {len(trace)}-job trace, 4 x 8 GPUs, 300 s rounds, exact finishing** (all jobs)\n")
    print(md_table(RESTART_HEADERS, sorted(rows, key=restart_axis.cost_key)))

    seeds = cfg.sweeps[0].seeds if cfg.sweeps else (1,)
    rows, gain0 = [], None
    for cost_s in costs:
        kw = restart_axis.simulate_kwargs(cost_s, policy, first_start_waits=not args.free_first_start)
        results: dict[str, list[SimulationResult]] = {a: [] for a in TWO_WAY}
        for seed in seeds:
            w = Workload(cfg.jobs, RESTART_LOAD, SPLITS["20,70,10"], False, seed)
            for a in TWO_WAY:
                r = simulate(
                    trace_for(w),
                    BIG_CLUSTER,
                    policy="fifo",
                    allocator=make_allocator(a),
                    finish_at_round_end=True,
                    measured_job_ids=cfg.window,
                    stop_when_measured=True,
                    **kw,
                )
                results[a].append(r)
                log(
                    f"  load {RESTART_LOAD:g}/h seed {seed} {a}, restart cost {cost_s:g} s: avg JCT "
                    f"{r.avg_jct_h:.2f} h, {r.total_preemptions} preemptions, {r.restart_lost_gpu_h:.1f} "
                    f"GPU-h lost, {r.wall_s:.0f} s"
                )
        row, gain = restart_row(cost_s, results["proportional"], results["tune"], cfg.window, gain0)
        gain0 = gain if gain0 is None else gain0
        rows.append(row)
    print(
        f"\n**Load sweep's headline: {RESTART_LOAD:g} jobs/h, single-GPU, split (20,70,10), 128 GPUs, "
        f"{cfg.jobs:,} jobs, seeds {','.join(map(str, seeds))}, round-end convention** (mean JCT of ids "
        f"[{cfg.window[0]}, {cfg.window[1]}) and the gain: means over seeds; restarts of those jobs)\n"
    )
    print(md_table(RESTART_HEADERS, sorted(rows, key=restart_axis.cost_key)))


if __name__ == "__main__":
    main()
