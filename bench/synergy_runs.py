"""The Synergy reproduction's shared setup and runs: clusters, splits, allocators, the run cache."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench import restart_axis
from bench.common import parallel_map
from bench.synergy_tables import log
from scheduler_app.core import reasons
from scheduler_app.core.allocators import ALLOCATORS, Allocator
from scheduler_app.core.allocators.tune import TuneAllocator, TuneRound
from scheduler_app.core.placement import FIRST_FIT, gpu_admission, infeasible_reasons
from scheduler_app.core.restarts import RestartPolicy
from scheduler_app.core.throughput import with_penalty
from scheduler_app.core.types import RoundPlan
from scheduler_app.simulator import (
    ClusterSpec,
    SimulationResult,
    TraceJob,
    jct_stats,
    philly_derived_trace,
    simulate,
)

REPO_ROOT = Path(__file__).resolve().parent.parent
# The reference traces copied into the repository (the dynamic one is not: pass --data-dir for it).
DEFAULT_DATA_DIR = REPO_ROOT / "tests/data/synergy"
STATIC_TRACE = "static_100job.csv"
DYNAMIC_TRACE = "dynamic_100job.csv"
BIG_CLUSTER = ClusterSpec(servers=16, gpus_per_server=8, cpus_per_server=24, mem_gb_per_server=500.0)
TESTBED = ClusterSpec(servers=4, gpus_per_server=8, cpus_per_server=24, mem_gb_per_server=500.0)
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
TWO_WAY = ("proportional", "tune")
THREE_WAY = ("proportional", "tune", "tune_matrix")


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


def progress_to(path: Path | None) -> None:
    """Append every run finished from now on to `path`, a JSON line each (None: nowhere)."""
    global _PROGRESS_FILE
    _PROGRESS_FILE = path


def runs_recorded() -> list[dict[str, Any]]:
    """Every run simulated in this process, in the order they were recorded (what --json writes)."""
    return _RAW


def run_alias(key: RunKey, jcts: dict[tuple[int, int], float]) -> None:
    """Answer `key` with these window JCTs, measured by another run (run_windows finds them cached)."""
    _RUNS[key] = jcts


def trace_for(w: Workload) -> list[TraceJob]:
    if w not in _TRACES:
        _TRACES[w] = philly_derived_trace(
            w.jobs, jobs_per_hour=w.load, class_split=w.split, multi_gpu=w.multi_gpu, seed=w.seed
        )
    return _TRACES[w]


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
        _record(key, simulate_windows(key))
    return _RUNS[key]


# (workload, policy, allocator, windows, restart cost in seconds: 0 for the paper's free restarts)
RunKey = tuple[Workload, str, str, tuple[tuple[int, int], ...], float]


def simulate_windows(key: RunKey) -> tuple[dict[tuple[int, int], float], float, int]:
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


# Rough CPU seconds of one sweep run by (policy, allocator, multi-GPU jobs): the mean of each kind's
# runs in the full default run on the 2-core machine (2026-12-01 19:59 to 20:14, 4afe73b,
# docs/performance.md "Reproduction sweeps on every core"). Only the order in which the workers are
# handed the runs, longest first, so that none is left alone with a long run at the end. Another
# allocator counts as tune (tune's variants, greedy, opt); an unknown policy as the longest.
_RUN_COST_S = {
    ("las", "tune", True): 20.1,
    ("las", "tune", False): 19.0,
    ("las", "proportional", False): 17.0,
    ("srtf", "tune", False): 15.4,
    ("srtf", "tune", True): 14.9,
    ("las", "proportional", True): 10.8,
    ("fifo", "tune", True): 8.7,
    ("fifo", "tune", False): 7.7,
    ("srtf", "proportional", False): 7.5,
    ("srtf", "proportional", True): 7.4,
    ("fifo", "proportional", False): 4.9,
    ("fifo", "proportional", True): 4.3,
}


def run_cost_s(key: RunKey) -> float:
    """A sweep run's rough cost (`_RUN_COST_S`)."""
    w, policy, label = key[0], key[1], key[2]
    cost = _RUN_COST_S.get((policy, label if label == "proportional" else "tune", w.multi_gpu))
    return 60.0 if cost is None else cost


def longest_first(keys: Sequence[RunKey], side_costs: Sequence[float] = ()) -> list[int]:
    """Positions of `keys`, then of side tasks of `side_costs` after them, by their rough cost,
    longest first (ties in that order)."""
    cost = [run_cost_s(k) for k in keys] + list(side_costs)
    return sorted(range(len(cost)), key=lambda i: -cost[i])


# A section's own computation handed to the workers beside the sweep's runs (bench/reproduce_synergy.py:
# the OPT section's workloads, the capacity table): a picklable call, and its rough cost in the units
# of _RUN_COST_S, by which it is handed out among the runs.
SideTask = tuple[float, Callable[[], Any]]


def _run_item(item: RunKey | Callable[[], Any]) -> Any:
    """A worker's item: a sweep run's key (simulate_windows), or a section's task (called)."""
    return item() if callable(item) else simulate_windows(item)


def prefetch(keys: Sequence[RunKey], workers: int, side_tasks: Sequence[SideTask] = ()) -> list[Any]:
    """Make the runs of `keys` not made yet, and `side_tasks`, `workers` at a time
    (bench.common.parallel_map), handed to the workers longest first; the runs are recorded in the
    keys' order, so the --json and --progress files do not depend on the workers. Returns the side
    tasks' results, in their order."""
    todo: list[Any] = list(dict.fromkeys(k for k in keys if k not in _RUNS))
    num_runs = len(todo)
    items = todo + [task for _, task in side_tasks]
    sequential = list(range(len(items)))
    order = longest_first(todo, [cost for cost, _ in side_tasks]) if workers > 1 else sequential
    outcomes = parallel_map(_run_item, [items[i] for i in order], workers=workers)
    by_pos = dict(zip(order, outcomes, strict=True))
    for pos, key in enumerate(todo):
        _record(key, by_pos[pos])
    return [by_pos[num_runs + n] for n in range(len(side_tasks))]


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
