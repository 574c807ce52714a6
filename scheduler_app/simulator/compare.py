"""Compare policies x allocators on one trace: the request, its checks, its trace and the runs (no Django)."""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from scheduler_app.core.allocators import ALLOCATORS
from scheduler_app.core.policies import POLICIES
from scheduler_app.core.throughput import ServerShape
from scheduler_app.core.types import SensitivityProfile
from scheduler_app.simulator.cluster import ClusterSpec
from scheduler_app.simulator.parallel import run_parallel
from scheduler_app.simulator.simulation import MODES, simulate
from scheduler_app.simulator.trace import TraceJob, read_trace
from scheduler_app.simulator.workloads import genie_trace, philly_derived_trace

__all__ = [
    "BASELINE_ALLOCATOR",
    "WORKLOADS",
    "SimulationRequest",
    "SimulationRequestError",
    "simulation_compare",
    "simulation_request_validate",
    "simulation_trace_build",
]

BASELINE_ALLOCATOR = "proportional"
WORKLOADS = (
    "philly",
    "genie",
)  # Synergy's Philly-derived mix; GENIE's QoS workload (every job has a deadline)


class SimulationRequestError(ValueError):
    """A simulation request that cannot run; the message says what to change."""


@dataclass(frozen=True)
class SimulationRequest:
    """Everything one comparison needs: the cluster, the trace (a file or a generator), the grid."""

    servers: int = 16
    gpus_per_server: int = 8
    cpus_per_server: int = 24
    mem_gb_per_server: float = 500.0
    policies: tuple[str, ...] = ("fifo",)
    allocators: tuple[str, ...] = ("proportional", "tune")
    round_s: float = 300.0
    finish_at_round_end: bool = False
    restart_overhead_s: float = 0.0
    mode: str = "rounds"  # or "events": decide at arrivals and completions (simulator MODES)
    trace_path: str | None = None
    workload: str = "philly"
    num_jobs: int = 1000
    jobs_per_hour: float = 9.0
    class_split: tuple[int, int, int] | None = None  # None: the workload's own default mix
    multi_gpu: bool = False
    static: bool = False
    seed: int = 1
    min_rate_share: float = 0.0  # genie workload: share of minimum-rate jobs (the rest have deadlines)
    measured_job_ids: tuple[int, int] | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def cluster(self) -> ClusterSpec:
        return ClusterSpec(
            servers=self.servers,
            gpus_per_server=self.gpus_per_server,
            cpus_per_server=self.cpus_per_server,
            mem_gb_per_server=self.mem_gb_per_server,
        )

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def simulation_request_validate(request: SimulationRequest) -> None:
    """Raise SimulationRequestError naming the first bad option (valid names listed for registries)."""
    for label, value in (
        ("servers", request.servers),
        ("gpus per server", request.gpus_per_server),
        ("cpus per server", request.cpus_per_server),
        ("memory per server", request.mem_gb_per_server),
        ("round length", request.round_s),
    ):
        if not value > 0:
            raise SimulationRequestError(f"{label} must be positive, got {value}")
    if request.mode not in MODES:
        raise SimulationRequestError(f"unknown mode {request.mode!r}; valid: {', '.join(MODES)}")
    if request.mode == "events" and request.finish_at_round_end:
        raise SimulationRequestError("finish at round end applies to the rounds mode only")
    if request.restart_overhead_s < 0:
        raise SimulationRequestError(f"restart overhead must be >= 0 s, got {request.restart_overhead_s}")
    if not request.policies or not request.allocators:
        raise SimulationRequestError("give at least one policy and one allocator")
    for name in request.policies:
        if name not in POLICIES.names():
            raise SimulationRequestError(f"unknown policy {name!r}; valid: {', '.join(POLICIES.names())}")
    for name in request.allocators:
        if name not in ALLOCATORS.names():
            raise SimulationRequestError(
                f"unknown allocator {name!r}; valid: {', '.join(ALLOCATORS.names())}"
            )
    if request.workload not in WORKLOADS:
        raise SimulationRequestError(f"unknown workload {request.workload!r}; valid: {', '.join(WORKLOADS)}")
    if request.trace_path is None:
        if request.num_jobs < 1:
            raise SimulationRequestError(f"the number of jobs must be at least 1, got {request.num_jobs}")
        if not request.static and not request.jobs_per_hour > 0:
            raise SimulationRequestError(f"load must be positive jobs per hour, got {request.jobs_per_hour}")
        if not 0.0 <= request.min_rate_share <= 1.0:
            raise SimulationRequestError(f"min-rate share must be in [0, 1], got {request.min_rate_share}")
        if request.min_rate_share and request.workload != "genie":
            raise SimulationRequestError("min-rate share applies to the genie workload only")
        split = request.class_split
        if split is not None and (len(split) != 3 or any(p < 0 for p in split) or sum(split) <= 0):
            raise SimulationRequestError(
                f"split must be three non-negative percentages (image,language,speech), got {split}"
            )
    elif not Path(request.trace_path).is_file():
        raise SimulationRequestError(f"trace file not found: {request.trace_path}")


def simulation_trace_build(request: SimulationRequest) -> list[TraceJob]:
    """The request's trace: read from its file (TraceError names file and line) or generated."""
    if request.trace_path is not None:
        return read_trace(request.trace_path)
    split = {"class_split": request.class_split} if request.class_split is not None else {}
    if request.workload == "genie":
        cluster = request.cluster
        shape = ServerShape(cluster.gpus_per_server, cluster.cpus_per_server, cluster.mem_gb_per_server)
        return genie_trace(
            request.num_jobs,
            jobs_per_hour=request.jobs_per_hour,
            multi_gpu=request.multi_gpu,
            seed=request.seed,
            shape=shape,
            min_rate_share=request.min_rate_share,
            **split,
        )
    return philly_derived_trace(
        request.num_jobs,
        jobs_per_hour=request.jobs_per_hour,
        **split,
        multi_gpu=request.multi_gpu,
        seed=request.seed,
        static=request.static,
    )


def simulation_compare(
    request: SimulationRequest,
    *,
    trace: list[TraceJob] | None = None,
    catalog: Mapping[str, SensitivityProfile] | None = None,
    progress: Callable[[str, str, float], None] | None = None,
    workers: int | None = None,
) -> list[dict[str, Any]]:
    """Simulate every (policy, allocator) pair on one trace; summaries in grid order. `catalog`: the
    profiles of the trace's models (default: the shipped catalog).

    Each summary gains `speedup_vs_proportional` (the proportional run's average JCT divided by this
    run's, same policy) when the grid includes proportional. `progress(policy, allocator, fraction)`,
    always called on the caller's thread: in-process, once per finished job; with worker processes,
    each run's fraction at every whole percent and at its end (runs interleave).

    `workers`: processes running the grid's independent simulations at once (simulator/parallel.py,
    'forkserver' or 'spawn' processes, never a fork of the caller); default min(runs, cores); 1 runs
    them one after the other in this process. Same summaries, same order, whatever the workers; a
    run's exception is raised here as it was raised in the run (the first failing run's in grid order).
    """
    simulation_request_validate(request)
    jobs = trace if trace is not None else simulation_trace_build(request)
    grid = [(policy, allocator) for policy in request.policies for allocator in request.allocators]
    if workers is None:
        workers = min(len(grid), os.cpu_count() or 1)
    args = [(jobs, request, policy, allocator, catalog) for policy, allocator in grid]
    on_progress = None
    if progress is not None:

        def on_progress(index: int, fraction: float) -> None:
            progress(grid[index][0], grid[index][1], fraction)

    runs = run_parallel(_run_one, args, workers=workers, progress=on_progress)
    _add_speedups(runs)
    return runs


def _run_one(
    args: tuple[list[TraceJob], SimulationRequest, str, str, Mapping[str, SensitivityProfile] | None],
    progress: Callable[[float], None] | None = None,
) -> dict[str, Any]:
    """One cell of the grid: its summary (module-level, so that a worker process can run it)."""
    jobs, request, policy, allocator, catalog = args
    result = simulate(
        jobs,
        request.cluster,
        policy=policy,
        allocator=allocator,
        round_s=request.round_s,
        finish_at_round_end=request.finish_at_round_end,
        restart_overhead_s=request.restart_overhead_s,
        measured_job_ids=request.measured_job_ids,
        progress=progress,
        mode=request.mode,
        catalog=catalog,
    )
    return result.summary()


def _add_speedups(runs: list[dict[str, Any]]) -> None:
    baseline = {r["policy"]: r["avg_jct_h"] for r in runs if r["allocator"] == BASELINE_ALLOCATOR}
    for run in runs:
        base, mine = baseline.get(run["policy"]), run["avg_jct_h"]
        ok = base is not None and mine is not None and mine > 0 and not math.isnan(mine)
        run["speedup_vs_proportional"] = base / mine if ok else None
