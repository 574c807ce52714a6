"""The job speed model: Synergy's sensitivity matrix, its two operating points and the capping rule.

Units. Every speed this module returns is *relative*: 1.0 is the job's speed at the GPU-proportional
share of the server shape it runs on (on the reference shape, 8 GPUs / 24 cores / 500 GB, that is
3 cores and 62.5 GB per GPU, the point the catalog's matrices are normalised to, so there it agrees
with `Placement.speedup`'s definition). This is the reference's own convention: it runs jobs at
`iter_time / synergy_speedup`, with speed-up 1 at the fair share, and ships one profile set per
CPU:GPU ratio (models-4/5/6) whose `speedup` is relative to that server's proportional point.

The model (msr-fiddle/synergy, simulator/jobs/workload.py `add_synergy_profile`, jobs/job.py):
- two operating points: the GPU-proportional share runs at 1.0, the best-case demand (per-GPU
  demand x num_gpus) at `profile.speedup`;
- capping rule: if the best-case demand exceeds one server's cores or memory it is capped at the
  server size and the speed-up is interpolated linearly *in CPU* between the proportional point
  (1.0) and the best case; a job with more GPUs than a server gets the proportional share in the
  exceeding dimension and speed-up 1 (it must span servers anyway);
- placement penalty: a job spread over more than one server runs `placement_penalty` times slower
  (with a GENIE fit on the profile, as much slower as the predictor says: `placement_slowdown`).

Beyond the reference (needed by tune_matrix and fixed-demand jobs): the speed at any other per-GPU
allocation is the matrix ratio tput(alloc) / tput(proportional), where tput(c, m) is the matrix
entry at the largest grid points <= (c, m) (below the smallest grid point: the smallest point).
That ratio is clamped so the model stays monotone and consistent with the two operating points:
an allocation that covers the best-case demand runs at the best-case speed, one that covers the
proportional share runs at >= 1.0, and nothing runs faster than the best case. Judgement calls:
- where only memory is capped and the CPU demand equals the proportional CPU, the reference's
  interpolation divides by zero (it raises); we keep the speed-up (the formula's limit);
- a best-case speed below 1.0 is clamped to 1.0: the best case is by definition the cheapest
  point reaching the matrix maximum, so it is never slower than proportional.

Everything is cached per (profile, num_gpus, shape); profiles are frozen and hashable, but hashing
one walks its whole matrix, so hot loops should memoise per call on `id(profile)`.
"""

from __future__ import annotations

from bisect import bisect_right
from dataclasses import dataclass, replace
from functools import lru_cache

from scheduler_app.core.predictor import gpu_count_slowdown, spread_slowdown
from scheduler_app.core.types import ClusterSnapshot, SensitivityProfile, ServerView

EPS = 1e-9


@dataclass(frozen=True, slots=True)
class ServerShape:
    """The capacity of one server: what "proportional" and "capped" are measured against."""

    num_gpus: int
    num_cpus: float
    mem_gb: float

    @property
    def cpus_per_gpu(self) -> float:
        """The GPU-proportional CPU share of one GPU."""
        return self.num_cpus / self.num_gpus

    @property
    def mem_gb_per_gpu(self) -> float:
        """The GPU-proportional memory share of one GPU."""
        return self.mem_gb / self.num_gpus


# The shape the catalog's matrices are normalised to (the paper's testbed servers).
REFERENCE_SHAPE = ServerShape(num_gpus=8, num_cpus=24, mem_gb=500.0)


@dataclass(frozen=True, slots=True)
class OperatingPoint:
    """A per-GPU (cores, memory) allocation and the relative speed a job reaches there."""

    cpus_per_gpu: float
    mem_gb_per_gpu: float
    speed: float
    capped: bool = False


def shape_of(server: ServerView) -> ServerShape:
    """The shape (total capacity) of one server."""
    return ServerShape(server.num_gpus, float(server.num_cpus), float(server.mem_gb))


def cluster_shape(snapshot: ClusterSnapshot) -> ServerShape | None:
    """The per-server size the capping rule and proportional speeds are measured against.

    Like the reference (resources/cluster.py `per_server_size`: totals divided by the number of
    servers, GPUs and cores truncated to integers), which assumes homogeneous servers; for a
    homogeneous cluster this is simply the server shape. None for an empty cluster.
    """
    servers = snapshot.servers
    if not servers:
        return None
    n = len(servers)
    num_gpus = sum(s.num_gpus for s in servers) // n
    num_cpus = sum(s.num_cpus for s in servers) // n
    mem_gb = sum(s.mem_gb for s in servers) / n
    return ServerShape(max(1, num_gpus), float(num_cpus), float(mem_gb))


class ProfileTable:
    """A profile's matrix prepared for fast lookups (grids as lists, rows as tuples)."""

    __slots__ = ("cpu_grid", "mem_grid", "rows")

    def __init__(self, profile: SensitivityProfile) -> None:
        self.cpu_grid = list(profile.cpu_per_gpu_grid)
        self.mem_grid = list(profile.mem_gb_per_gpu_grid)
        self.rows = profile.tput

    def tput(self, cpus_per_gpu: float, mem_gb_per_gpu: float) -> float:
        """Matrix entry at the largest grid points <= the allocation (the smallest below the grid)."""
        i = bisect_right(self.cpu_grid, cpus_per_gpu + EPS) - 1
        j = bisect_right(self.mem_grid, mem_gb_per_gpu + EPS) - 1
        return self.rows[i if i > 0 else 0][j if j > 0 else 0]


@lru_cache(maxsize=256)
def profile_table(profile: SensitivityProfile) -> ProfileTable:
    """The cached lookup table of a profile."""
    return ProfileTable(profile)


def tput(profile: SensitivityProfile, cpus_per_gpu: float, mem_gb_per_gpu: float) -> float:
    """Normalised throughput of `profile` at a per-GPU allocation (1.0 = reference proportional point)."""
    return profile_table(profile).tput(cpus_per_gpu, mem_gb_per_gpu)


def proportional_point(shape: ServerShape) -> OperatingPoint:
    """The GPU-proportional per-GPU share of a server shape; speed 1.0 by definition."""
    return OperatingPoint(shape.cpus_per_gpu, shape.mem_gb_per_gpu, 1.0)


def proportional_tput(profile: SensitivityProfile, shape: ServerShape) -> float:
    """Normalised matrix throughput of a job at the GPU-proportional share of `shape`."""
    return tput(profile, shape.cpus_per_gpu, shape.mem_gb_per_gpu)


@lru_cache(maxsize=4096)
def best_case(profile: SensitivityProfile, num_gpus: int, shape: ServerShape) -> OperatingPoint:
    """The job's best-case per-GPU demand on `shape`, capped as the reference caps it, and its speed.

    Reference: simulator/jobs/workload.py `add_synergy_profile` (storage bandwidth, which we do not
    model, is left out).
    """
    speed = profile.speedup
    ideal_cpus = num_gpus * profile.best_cpus_per_gpu
    ideal_mem_gb = num_gpus * profile.best_mem_gb_per_gpu
    cpus, mem_gb = ideal_cpus, ideal_mem_gb
    interpolate = False
    capped = False
    larger_than_server = num_gpus > shape.num_gpus
    if ideal_cpus > shape.num_cpus + EPS:
        capped = True
        if larger_than_server:
            # It spans servers anyway: proportional CPU everywhere, and no speed-up.
            cpus, speed, interpolate = num_gpus * shape.cpus_per_gpu, 1.0, False
        else:
            cpus, interpolate = shape.num_cpus, True
    if ideal_mem_gb > shape.mem_gb + EPS:
        capped = True
        if larger_than_server:
            mem_gb, speed, interpolate = num_gpus * shape.mem_gb_per_gpu, 1.0, False
        else:
            mem_gb, interpolate = shape.mem_gb, True
    if interpolate:
        fair_cpus = num_gpus * shape.cpus_per_gpu
        cpu_diff = ideal_cpus - fair_cpus
        if abs(cpu_diff) > EPS:
            # Linear in CPU between (fair_cpus, 1.0) and (ideal_cpus, speedup).
            speed = 1.0 + (speed - 1.0) * (cpus - fair_cpus) / cpu_diff
    return OperatingPoint(cpus / num_gpus, mem_gb / num_gpus, max(1.0, speed), capped)


def needs_downgrade(best: OperatingPoint, shape: ServerShape) -> bool:
    """True when the best case asks for more than the proportional share in some dimension.

    The reference (resources/cluster.py `_make_fair_share`) switches such a job to the proportional
    share when it does not fit; a job asking for no more than proportional keeps its own demand.
    """
    return best.cpus_per_gpu > shape.cpus_per_gpu + EPS or best.mem_gb_per_gpu > shape.mem_gb_per_gpu + EPS


def relative_speed(
    profile: SensitivityProfile,
    num_gpus: int,
    shape: ServerShape,
    cpus_per_gpu: float,
    mem_gb_per_gpu: float,
) -> float:
    """Speed at an arbitrary per-GPU allocation, relative to the proportional share of `shape`.

    Agrees with the two-operating-point model at both points (see the module docstring).
    """
    best = best_case(profile, num_gpus, shape)
    if cpus_per_gpu + EPS >= best.cpus_per_gpu and mem_gb_per_gpu + EPS >= best.mem_gb_per_gpu:
        return best.speed
    table = profile_table(profile)
    base = table.tput(shape.cpus_per_gpu, shape.mem_gb_per_gpu)
    ratio = table.tput(cpus_per_gpu, mem_gb_per_gpu) / base if base > 0 else 1.0
    if cpus_per_gpu + EPS >= shape.cpus_per_gpu and mem_gb_per_gpu + EPS >= shape.mem_gb_per_gpu:
        ratio = max(ratio, 1.0)
    return min(ratio, best.speed)


def gpu_count_factor(profile: SensitivityProfile, num_gpus: int) -> float:
    """t(1, k, b) / t(1, 1, b): how much longer an iteration of a k-GPU job on one server takes than
    a 1-GPU one (the all-reduce inside the server), by the workload's fit; 1.0 without one (Synergy's
    model: data-parallel jobs scale perfectly)."""
    if profile.predictor is None or not profile.batch_per_gpu > 0:
        return 1.0
    return gpu_count_slowdown(profile.predictor, profile.batch_per_gpu, num_gpus)


def job_profile(profile: SensitivityProfile, num_gpus: int) -> SensitivityProfile:
    """The profile a job of `num_gpus` GPUs runs with: `iter_time_s` for that many GPUs on one server
    (a workload's profile holds 1 GPU's). The same profile back without a fit, or when it already
    holds `num_gpus`; one built from a workload's profile otherwise."""
    if profile.predictor is None or profile.scaled_for_gpus == num_gpus:
        return profile
    base_s = profile.iter_time_s / gpu_count_factor(profile, profile.scaled_for_gpus)
    return replace(
        profile, iter_time_s=base_s * gpu_count_factor(profile, num_gpus), scaled_for_gpus=num_gpus
    )


def placement_slowdown(profile: SensitivityProfile, num_gpus: int, num_servers: int) -> float:
    """How many times slower a job of `num_gpus` GPUs runs spread over `num_servers` servers than on
    one (>= 1). With a fit, the predictor's t(n, ceil(k/n), b) / t(1, k, b): the log2(n) t_cross term
    and the smaller all-reduce tree inside each server; without one, the constant `placement_penalty`
    (learnt online, or as shipped)."""
    if num_servers <= 1:
        return 1.0
    if profile.predictor is not None and profile.batch_per_gpu > 0:
        return spread_slowdown(profile.predictor, profile.batch_per_gpu, num_gpus, num_servers)
    return profile.placement_penalty if profile.placement_penalty > 0 else 1.0


def with_penalty(speed: float, profile: SensitivityProfile, num_servers: int, num_gpus: int) -> float:
    """Apply the placement's cost: a job of `num_gpus` spread over more than one server runs slower
    (`placement_slowdown`)."""
    if num_servers <= 1:
        return speed
    return speed / placement_slowdown(profile, num_gpus, num_servers)


@lru_cache(maxsize=4096)
def intermediate_points(
    profile: SensitivityProfile, num_gpus: int, shape: ServerShape
) -> tuple[OperatingPoint, ...]:
    """Grid points strictly between proportional (1.0) and the best case, best first (tune_matrix).

    Only Pareto-efficient points are kept (no other point is as fast with no more cores and no more
    memory); ties in speed go to the smaller allocation, counted in proportional shares.
    """
    best = best_case(profile, num_gpus, shape)
    candidates: list[tuple[float, float, float, float]] = []
    for c in profile.cpu_per_gpu_grid:
        for m in profile.mem_gb_per_gpu_grid:
            if c >= best.cpus_per_gpu - EPS and m >= best.mem_gb_per_gpu - EPS:
                continue  # covers the best case: that is the best case, not an intermediate point
            speed = relative_speed(profile, num_gpus, shape, c, m)
            if 1.0 + EPS < speed < best.speed - EPS:
                size = c / shape.cpus_per_gpu + m / shape.mem_gb_per_gpu
                candidates.append((-speed, size, c, m))
    candidates.sort()
    kept: list[OperatingPoint] = []
    for neg_speed, _size, c, m in candidates:
        # Sorted by speed desc then size asc, so any dominating point is already kept.
        if any(k.cpus_per_gpu <= c + EPS and k.mem_gb_per_gpu <= m + EPS for k in kept):
            continue
        kept.append(OperatingPoint(c, m, -neg_speed))
    return tuple(kept)
