"""Synergy's optimistic profiling, pure: the CPU search, the MinIO memory model and the matrix they give.

Framework-free (no Django): the simulator-side acceptance test, the live service and the docs all use
these functions. docs/profiling.md explains the choices; in short:

1. CPU axis, measured. `cpu_search` bisects the CPU grid (PAPERS.md 3.2 step 1, the paper's variant):
   measure both ends, then the middle grid point of every interval whose end points differ by more
   than `rel_tol`. With a throughput that never falls as cores are added, a point left unmeasured lies
   between its measured neighbours, so interpolating it errs by less than `rel_tol`: with rel_tol = 3 %
   that is Synergy's accuracy claim. The reference repo's rule (halve while the time changes < 10 %,
   else step down by one GPU's worth of cores) is `cpu_search_halving`, kept for comparison: it skips
   grid points (24 -> 12 -> 6 never visits 9) and so misses steps such as AlexNet's 9-core point.
   Every search is a pure function of the points measured so far (`next_cpu_counts`), so the live
   service can drive an agent point by point and a simulation can call it in a loop.
2. Memory axis, analytic (MinIO, PAPERS.md 3.2 step 2 / 5.3; the reference's `estimate_speed`): a
   MinIO cache of C GB pins C GB of the D GB dataset, so an epoch reads C from memory and D - C from
   storage: T_io = C / B_mem + (D - C) * 1024 / B_disk; T_epoch = max(T_cpu(c), T_io).
3. One departure, the memory floor: below the job's working set (its own resident memory, measured
   as the peak RSS during profiling) it cannot run without thrashing. The reference's matrices mark
   such allocations with a throughput of 0.1 (their 20.83 GB column); MinIO alone cannot produce that
   column together with the others (see docs/profiling.md), so we keep the reference's convention.
4. Normalised to the GPU-proportional point (1.0 there), best-case demand = the smallest grid point
   (fewest cores, then least memory) within `best_tol` of the maximum, speed-up = throughput there.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

# Synergy's grid (reference simulator Job.cpu_val / mem_val): per GPU.
CPU_GRID: tuple[float, ...] = (1, 2, 3, 4, 5, 6, 9, 12, 24)
MEM_GRID: tuple[float, ...] = (20.83, 62.5, 125, 187.5, 250)
# The GPU-proportional point of the reference server (8 GPUs, 24 cores, 500 GB): tput 1.0 there.
FAIR_CPUS_PER_GPU = 3.0
FAIR_MEM_GB_PER_GPU = 62.5
# The reference's throughput for an allocation below the job's working set (see the module docstring).
BELOW_WORKING_SET_TPUT = 0.1
DEFAULT_REL_TOL = 0.03
DEFAULT_BEST_TOL = 0.03
MB_PER_GB = 1024.0
EPS = 1e-9

SEARCH_BISECTION = "bisection"
SEARCH_HALVING = "halving"
SEARCHES = (SEARCH_BISECTION, SEARCH_HALVING)


class ProfilingError(ValueError):
    """The measurements cannot give a profile (no points, a non-positive time...)."""


# ---------------------------------------------------------------------------------------------------
# 1. The CPU search
# ---------------------------------------------------------------------------------------------------


def _differ(a_s: float, b_s: float, rel_tol: float) -> bool:
    """True when two seconds-per-iteration values differ by more than rel_tol (of the faster one)."""
    return abs(a_s - b_s) > rel_tol * min(a_s, b_s) + EPS


def search_grid(max_cpus: float, *, num_gpus: int = 1, grid: Sequence[float] = CPU_GRID) -> list[int]:
    """The total core counts a bisection may measure: the grid points (per GPU x GPUs) up to max_cpus.

    `max_cpus` itself is added when it falls between grid points, so the search always starts at the
    most cores the profiling run holds.
    """
    if max_cpus < 1:
        raise ProfilingError(f"max_cpus must be at least 1, not {max_cpus}")
    counts = sorted({round(c * num_gpus) for c in grid if c * num_gpus <= max_cpus + EPS})
    if not counts or counts[-1] < int(max_cpus):
        counts.append(int(max_cpus))
    return [c for c in counts if c >= 1]


def next_cpu_counts(
    measured: Mapping[int, float],
    *,
    max_cpus: int,
    num_gpus: int = 1,
    strategy: str = SEARCH_BISECTION,
    rel_tol: float = DEFAULT_REL_TOL,
    grid: Sequence[float] = CPU_GRID,
) -> list[int]:
    """The core counts to measure next, given {cores: seconds per iteration} so far; [] when done.

    Pure and deterministic: replaying the same measurements gives the same answer, which is what lets
    the live service decide each step from the points stored so far.
    """
    if strategy == SEARCH_HALVING:
        return _next_halving(measured, max_cpus=max_cpus, num_gpus=num_gpus)
    if strategy != SEARCH_BISECTION:
        raise ProfilingError(f"unknown search {strategy!r}; valid: {', '.join(SEARCHES)}")
    points = search_grid(max_cpus, num_gpus=num_gpus, grid=grid)
    wanted = [c for c in (points[-1], points[0]) if c not in measured]  # the most cores first
    if wanted:
        return wanted
    out: list[int] = []
    intervals = [(0, len(points) - 1)]
    while intervals:
        lo, hi = intervals.pop()
        if hi - lo <= 1:
            continue
        if not _differ(measured[points[lo]], measured[points[hi]], rel_tol):
            continue  # flat enough: the points between are interpolated
        mid = (lo + hi) // 2
        if points[mid] not in measured:
            out.append(points[mid])
        else:
            intervals += [(lo, mid), (mid, hi)]
    return sorted(out, reverse=True)


def _next_halving(measured: Mapping[int, float], *, max_cpus: int, num_gpus: int) -> list[int]:
    """The reference repo's rule (src/profiler/offline_profiler.py `profile_cpu`), replayed.

    Start at max_cpus; after each point: halve (whole cores) when its time is within 10 % of the
    previous point's (the first point always halves), else step down by num_gpus; stop below 1.
    """
    cpus, previous = int(max_cpus), None
    while cpus >= 1:
        if cpus not in measured:
            return [cpus]
        now = measured[cpus]
        same = previous is None or not _differ(previous, now, 0.10)
        previous = now
        cpus = cpus // 2 if same else cpus - num_gpus
    return []


@dataclass(frozen=True)
class SearchResult:
    """What a CPU search measured: {cores: seconds per iteration}, in measurement order, and its runs."""

    points: dict[int, float]
    runs: list[int] = field(default_factory=list)  # every launch, the warm-up included

    @property
    def num_points(self) -> int:
        return len(self.points)


def cpu_search(
    measure: Callable[[int], float],
    *,
    max_cpus: int,
    num_gpus: int = 1,
    strategy: str = SEARCH_BISECTION,
    rel_tol: float = DEFAULT_REL_TOL,
    warmup: bool = True,
    grid: Sequence[float] = CPU_GRID,
) -> SearchResult:
    """Run a CPU search with `measure(total_cores) -> seconds per iteration` (dataset cached).

    With `warmup`, the first point is measured twice and the first result dropped (it warms the
    dataset cache and the page cache, as the reference's profiler does).
    """
    points: dict[int, float] = {}
    runs: list[int] = []
    while True:
        todo = next_cpu_counts(
            points, max_cpus=max_cpus, num_gpus=num_gpus, strategy=strategy, rel_tol=rel_tol, grid=grid
        )
        if not todo:
            return SearchResult(points, runs)
        for cpus in todo:
            if warmup and not runs:
                runs.append(cpus)
                measure(cpus)
            runs.append(cpus)
            seconds = float(measure(cpus))
            if not seconds > 0:
                raise ProfilingError(f"measured {seconds} s per iteration at {cpus} cores")
            points[cpus] = seconds


def interpolate_seconds(points: Mapping[float, float], cpus: float) -> float:
    """Seconds per iteration at `cpus` from measured points: linear in throughput between neighbours.

    Flat outside the measured range: above the most cores measured nothing more can be allocated on
    the profiling server, below the fewest the reference's grid starts.
    """
    if not points:
        raise ProfilingError("no measured points")
    xs = sorted(points)
    if cpus <= xs[0] + EPS:
        return points[xs[0]]
    if cpus >= xs[-1] - EPS:
        return points[xs[-1]]
    for lo, hi in itertools.pairwise(xs):
        if lo - EPS <= cpus <= hi + EPS:
            if abs(cpus - lo) <= EPS:
                return points[lo]
            f = (cpus - lo) / (hi - lo)
            rate = (1 - f) / points[lo] + f / points[hi]
            return 1.0 / rate
    raise AssertionError("unreachable")  # pragma: no cover


# ---------------------------------------------------------------------------------------------------
# 2. The MinIO memory model
# ---------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class DatasetSpec:
    """The job's training data: size in GB, samples, and samples per iteration (per GPU x GPUs).

    `working_set_gb` is the job's own memory besides the cache, per GPU (peak RSS when profiled); below
    it an allocation thrashes (BELOW_WORKING_SET_TPUT). A dataset of 0 GB means no I/O model (the job
    reads nothing worth caching, e.g. generated inputs).
    """

    dataset_gb: float
    samples: int
    samples_per_iter: int
    working_set_gb: float = 0.0

    @property
    def iters_per_epoch(self) -> float:
        return self.samples / self.samples_per_iter if self.samples_per_iter > 0 else 1.0


@dataclass(frozen=True)
class NodeBandwidth:
    """The profiling node's memory read bandwidth (GB/s) and storage read bandwidth (MB/s)."""

    mem_gbps: float
    disk_mbps: float


def epoch_seconds(cpu_epoch_s: float, cache_gb: float, *, dataset: DatasetSpec, node: NodeBandwidth) -> float:
    """MinIO: an epoch is the slower of the CPU-bound epoch and reading it (C from memory, D-C from disk)."""
    if dataset.dataset_gb <= 0:
        return cpu_epoch_s
    cached = max(0.0, min(cache_gb, dataset.dataset_gb))
    io_s = 0.0
    if cached > 0 and node.mem_gbps > 0:
        io_s += cached / node.mem_gbps
    uncached = dataset.dataset_gb - cached
    if uncached > EPS:
        if node.disk_mbps <= 0:
            raise ProfilingError("a dataset larger than the cache needs a storage bandwidth")
        io_s += uncached * MB_PER_GB / node.disk_mbps
    return max(cpu_epoch_s, io_s)


# ---------------------------------------------------------------------------------------------------
# 3. The matrix
# ---------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class DerivedProfile:
    """A sensitivity matrix derived from CPU points: what profiles_app stores on a Workload."""

    cpu_per_gpu_grid: tuple[float, ...]
    mem_gb_per_gpu_grid: tuple[float, ...]
    tput: tuple[tuple[float, ...], ...]
    best_cpus_per_gpu: float
    best_mem_gb_per_gpu: float
    speedup: float
    iter_time_s: float  # seconds per iteration at the proportional point

    def as_json(self) -> dict:
        return {
            "cpu_per_gpu_grid": list(self.cpu_per_gpu_grid),
            "mem_gb_per_gpu_grid": list(self.mem_gb_per_gpu_grid),
            "tput": [list(row) for row in self.tput],
            "best_cpus_per_gpu": self.best_cpus_per_gpu,
            "best_mem_gb_per_gpu": self.best_mem_gb_per_gpu,
            "speedup": self.speedup,
            "iter_time_s": self.iter_time_s,
        }


def best_case(
    tput: Sequence[Sequence[float]],
    cpu_grid: Sequence[float],
    mem_grid: Sequence[float],
    *,
    tol: float = DEFAULT_BEST_TOL,
) -> tuple[float, float, float]:
    """(cores, GB, throughput) of the smallest grid point (fewest cores, then least memory) within
    `tol` of the matrix maximum: measurements are noisy, and a point 1 % faster for twice the cores
    is not worth it. tol=0 is the reference's exact rule."""
    peak = max(max(row) for row in tput)
    for i, c in enumerate(cpu_grid):
        for j, m in enumerate(mem_grid):
            if tput[i][j] >= peak * (1 - tol) - EPS:
                return float(c), float(m), float(tput[i][j])
    raise AssertionError("unreachable")  # pragma: no cover


def derive_profile(
    points_per_gpu: Mapping[float, float],
    *,
    dataset: DatasetSpec,
    node: NodeBandwidth,
    num_gpus: int = 1,
    cpu_grid: Sequence[float] = CPU_GRID,
    mem_grid: Sequence[float] = MEM_GRID,
    fair_cpus_per_gpu: float = FAIR_CPUS_PER_GPU,
    fair_mem_gb_per_gpu: float = FAIR_MEM_GB_PER_GPU,
    best_tol: float = DEFAULT_BEST_TOL,
) -> DerivedProfile:
    """The full matrix from {cores per GPU: seconds per iteration} measured with the dataset cached.

    tput[c][m] = T_epoch(fair) / T_epoch(c, m), with the cache C = m x num_gpus GB, except the cells
    below the working set (BELOW_WORKING_SET_TPUT).
    """
    if not points_per_gpu:
        raise ProfilingError("no measured points")
    if any(not s > 0 for s in points_per_gpu.values()):
        raise ProfilingError(f"seconds per iteration must be positive: {dict(points_per_gpu)}")

    def epoch(cpus: float, mem_gb: float) -> float:
        cpu_epoch = interpolate_seconds(points_per_gpu, cpus) * dataset.iters_per_epoch
        return epoch_seconds(cpu_epoch, mem_gb * num_gpus, dataset=dataset, node=node)

    fair_s = epoch(fair_cpus_per_gpu, fair_mem_gb_per_gpu)
    rows = []
    for c in cpu_grid:
        row = []
        for m in mem_grid:
            if m + EPS < dataset.working_set_gb:
                row.append(BELOW_WORKING_SET_TPUT)
            else:
                row.append(round(fair_s / epoch(c, m), 4))
        rows.append(tuple(row))
    tput = tuple(rows)
    best_c, best_m, speedup = best_case(tput, cpu_grid, mem_grid, tol=best_tol)
    return DerivedProfile(
        cpu_per_gpu_grid=tuple(float(c) for c in cpu_grid),
        mem_gb_per_gpu_grid=tuple(float(m) for m in mem_grid),
        tput=tput,
        best_cpus_per_gpu=best_c,
        best_mem_gb_per_gpu=best_m,
        speedup=max(speedup, EPS),
        iter_time_s=fair_s / dataset.iters_per_epoch,
    )


def profiling_seconds(
    runs: Sequence[int], seconds_at: Callable[[int], float], *, iters_per_point: int
) -> float:
    """Time a search's runs take: iters_per_point iterations at each launch (start-up left out)."""
    return sum(iters_per_point * seconds_at(c) for c in runs)


def per_gpu(points: Mapping[int, float], num_gpus: int) -> dict[float, float]:
    """{total cores: s} -> {cores per GPU: s}."""
    return {c / num_gpus: s for c, s in points.items()}


def relative_error(derived: float, truth: float) -> float:
    """|derived - truth| / truth (0 when both are 0)."""
    if truth == 0:
        return 0.0 if derived == 0 else math.inf
    return abs(derived - truth) / abs(truth)
