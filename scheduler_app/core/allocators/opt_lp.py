"""Synergy-OPT's first linear program (the admitted jobs' cluster as one machine), solved with HiGHS."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from typing import TYPE_CHECKING

from scheduler_app.core.throughput import ServerShape, best_case, relative_speed
from scheduler_app.core.types import SensitivityProfile

if TYPE_CHECKING:
    import numpy as np

# numpy loads in about 0.1 s: imported by the functions that use it (the opt allocator's LP, genie's
# Pareto points), so that a run of the other allocators (a simulation's command, fifo + tune) does not
# pay for it at start-up.

# Throughputs and resource amounts closer than this are equal: the catalog has two decimals, and
# HiGHS returns values accurate to about 1e-9, so this only absorbs float noise.
EPS = 1e-7


@dataclass(frozen=True, slots=True, eq=False)
class OperatingPoints:
    """A job's candidate per-GPU operating points as parallel arrays, best throughput first.

    `key` identifies the point set by value, so jobs with equal candidates share one LP class.
    """

    cpus_per_gpu: np.ndarray
    mem_gb_per_gpu: np.ndarray
    tput: np.ndarray
    key: bytes = field(repr=False)

    def __len__(self) -> int:
        return len(self.tput)


def pareto_points(
    cpus_per_gpu: Sequence[float], mem_gb_per_gpu: Sequence[float], tput: Sequence[float]
) -> OperatingPoints:
    """The points that no other point beats: another with no more CPU, no more memory and no less speed.

    Dropping dominated points leaves the LP optimum unchanged (moving a dominated point's weight to
    its dominator frees resources and loses no throughput) and shrinks the LP several-fold, since
    the Synergy matrices are flat over most of their memory axis. Output order is by throughput
    descending, then CPU, then memory ascending, which makes rounding and ties deterministic.
    """
    import numpy as np  # noqa: PLC0415 - loaded only where points or an LP are built

    cpu = np.asarray(cpus_per_gpu, dtype=float)
    mem = np.asarray(mem_gb_per_gpu, dtype=float)
    tp = np.asarray(tput, dtype=float)
    order = np.lexsort((mem, cpu, -tp))
    cpu, mem, tp = cpu[order], mem[order], tp[order]
    # q dominates p when q is no worse everywhere; among exact duplicates the earlier one survives.
    no_more = (cpu[:, None] <= cpu[None, :] + EPS) & (mem[:, None] <= mem[None, :] + EPS)
    no_less = tp[:, None] >= tp[None, :] - EPS
    strictly = (
        (cpu[:, None] < cpu[None, :] - EPS)
        | (mem[:, None] < mem[None, :] - EPS)
        | (tp[:, None] > tp[None, :] + EPS)
    )
    earlier = np.arange(len(tp))[:, None] < np.arange(len(tp))[None, :]
    dominated = (no_more & no_less & (strictly | earlier)).any(axis=0)
    keep = ~dominated
    cpu, mem, tp = cpu[keep], mem[keep], tp[keep]
    for arr in (cpu, mem, tp):
        arr.setflags(write=False)  # point sets are cached and shared between calls
    key = np.concatenate((cpu, mem, tp)).round(9).tobytes()
    return OperatingPoints(cpus_per_gpu=cpu, mem_gb_per_gpu=mem, tput=tp, key=key)


@lru_cache(maxsize=4096)
def candidate_points(
    profile: SensitivityProfile,
    num_gpus: int,
    shape: ServerShape,
    *,
    max_cpus_per_gpu: float,
    max_mem_gb_per_gpu: float,
) -> OperatingPoints:
    """Every per-GPU point a Synergy allocator may give this job, with its speed (throughput.py).

    The matrix grid points, the (capped) best case and the proportional share of `shape`, keeping
    those at least as fast as proportional (speed >= 1.0, so every job keeps its GPU-proportional
    speed) and no larger than one server can hold per GPU; then the Pareto front of those. This is
    a superset of what tune (best case, proportional) and tune_matrix (intermediate grid points)
    use, which is what makes the LP optimum an upper bound on their total throughput. Cached:
    hashing a profile walks its matrix, but once per (profile, GPU count) instead of per point.
    """
    import numpy as np  # noqa: PLC0415 - loaded only where points or an LP are built

    best = best_case(profile, num_gpus, shape)
    cpus = [best.cpus_per_gpu, shape.cpus_per_gpu]
    mem = [best.mem_gb_per_gpu, shape.mem_gb_per_gpu]
    speed = [best.speed, 1.0]
    for c in profile.cpu_per_gpu_grid:
        for m in profile.mem_gb_per_gpu_grid:
            cpus.append(c)
            mem.append(m)
            speed.append(relative_speed(profile, num_gpus, shape, c, m))
    cpu_arr, mem_arr, speed_arr = np.array(cpus), np.array(mem), np.array(speed)
    keep = (
        (speed_arr >= 1.0 - EPS) & (cpu_arr <= max_cpus_per_gpu + EPS) & (mem_arr <= max_mem_gb_per_gpu + EPS)
    )
    keep[1] = True  # the proportional share always fits: it is how the servers are cut
    return pareto_points(cpu_arr[keep], mem_arr[keep], speed_arr[keep])


def single_point(cpus_per_gpu: float, mem_gb_per_gpu: float, speed: float) -> OperatingPoints:
    """A job with exactly one admissible point (a user's fixed demand)."""
    return pareto_points([cpus_per_gpu], [mem_gb_per_gpu], [speed])


@dataclass(frozen=True, slots=True)
class ShareSolution:
    """LP1's answer. `bound` is the LP optimum; `chosen[i]` the index (into job i's points) of the
    integral point job i gets after rounding, or -1 when the relaxed fallback left it out; `mix[i]`
    the job's fractional weights over its points; `all_jobs_fit` is False when the cluster's free
    CPU/memory cannot hold every job even at its cheapest point (see solve_share_lp).
    """

    bound: float
    chosen: tuple[int, ...]
    mix: tuple[np.ndarray, ...]
    all_jobs_fit: bool


def solve_share_lp(
    num_gpus: Sequence[int],
    points: Sequence[OperatingPoints],
    weights: Sequence[float],
    *,
    cpus_total: float,
    mem_gb_total: float,
) -> ShareSolution:
    """Maximise sum_j weights[j] * sum_p tput[j][p] * y[j][p] over the relaxation 0 <= y.

    Rows: sum_p y[j][p] == 1 per job; sum_j num_gpus[j] * sum_p cpu[j][p] * y[j][p] <= cpus_total;
    the same for memory. Jobs with the same GPU count, weight and point set are interchangeable, so
    they are merged into one class whose weights sum to the class size: the LP then has a handful
    of rows whatever the cluster size, and the per-job solution is the class average (an optimum of
    the per-job LP too). If even the cheapest points do not fit (only possible when servers are
    partly busy), the equality rows become <= 1: still an upper bound on any allocation, since a job
    left out contributes nothing, and `all_jobs_fit` is False.
    """
    # scipy loads in about half a second: only runs that solve an LP (opt) pay for it.
    import numpy as np  # noqa: PLC0415 - loaded only where points or an LP are built
    from scipy import sparse  # noqa: PLC0415 - scipy loads only when an LP is solved
    from scipy.optimize import linprog  # noqa: PLC0415 - likewise

    n = len(num_gpus)
    if n == 0:
        return ShareSolution(bound=0.0, chosen=(), mix=(), all_jobs_fit=True)
    class_of: dict[tuple[int, float, bytes], int] = {}
    job_class = np.empty(n, dtype=np.int64)
    class_points: list[OperatingPoints] = []
    class_gpus: list[int] = []
    class_weight: list[float] = []
    for i in range(n):
        key = (int(num_gpus[i]), float(weights[i]), points[i].key)
        cid = class_of.get(key)
        if cid is None:
            cid = class_of[key] = len(class_points)
            class_points.append(points[i])
            class_gpus.append(int(num_gpus[i]))
            class_weight.append(float(weights[i]))
        job_class[i] = cid
    num_classes = len(class_points)
    class_size = np.bincount(job_class, minlength=num_classes).astype(float)
    sizes = np.fromiter((len(p) for p in class_points), dtype=np.int64, count=num_classes)
    offsets = np.concatenate(([0], np.cumsum(sizes)))
    var_class = np.repeat(np.arange(num_classes), sizes)
    var_cpu = np.concatenate([p.cpus_per_gpu for p in class_points])
    var_mem = np.concatenate([p.mem_gb_per_gpu for p in class_points])
    var_tput = np.concatenate([p.tput for p in class_points])
    gpus = np.asarray(class_gpus, dtype=float)[var_class]
    objective = -np.asarray(class_weight)[var_class] * var_tput  # linprog minimises
    num_vars = len(var_class)
    one_per_job = sparse.csr_array(
        (np.ones(num_vars), (var_class, np.arange(num_vars))), shape=(num_classes, num_vars)
    )
    capacity = np.vstack((gpus * var_cpu, gpus * var_mem))
    capacity_rhs = np.array([cpus_total, mem_gb_total], dtype=float)
    result = linprog(
        objective,
        A_ub=capacity,
        b_ub=capacity_rhs,
        A_eq=one_per_job,
        b_eq=class_size,
        bounds=(0, None),
        method="highs-ds",
    )
    all_jobs_fit = result.status == 0
    if not all_jobs_fit:
        # Infeasible as equalities: let jobs drop out (sum <= 1) so that the bound stays an upper bound.
        result = linprog(
            objective,
            A_ub=sparse.vstack((sparse.csr_array(capacity), one_per_job)),
            b_ub=np.concatenate((capacity_rhs, class_size)),
            bounds=(0, None),
            method="highs-ds",
        )
        if result.status != 0:
            raise RuntimeError(f"OPT share LP failed: {result.message}")
    counts = np.clip(result.x, 0.0, None)
    bound = float(-result.fun)

    chosen = np.full(n, -1, dtype=np.int64)
    mix: list[np.ndarray] = [np.zeros(0)] * n
    for cid in range(num_classes):
        members = np.flatnonzero(job_class == cid)  # in input (policy) order
        class_counts = counts[offsets[cid] : offsets[cid + 1]]
        per_job = class_counts / class_size[cid]
        for i in members:
            mix[i] = per_job
        for rank, point in enumerate(round_class(class_points[cid], class_counts, len(members))):
            chosen[members[rank]] = point
    return ShareSolution(
        bound=bound, chosen=tuple(int(c) for c in chosen), mix=tuple(mix), all_jobs_fit=all_jobs_fit
    )


def round_class(points: OperatingPoints, counts: np.ndarray, size: int) -> list[int]:
    """Integral points for a class's `size` jobs from the LP's fractional `counts` per point.

    Each point gets floor(count) jobs, best throughput first, so earlier jobs in policy order get the
    better points. The few jobs left over (at an LP vertex at most two classes have any) get the
    fastest point that fits within the average CPU and memory of the leftover mass, so rounding
    never asks for more than the LP used; without such a point, the slowest point in the support.
    Jobs the relaxed fallback left out entirely get -1.
    """
    import numpy as np  # noqa: PLC0415 - loaded only where points or an LP are built

    whole = np.floor(counts + EPS).astype(np.int64)
    out: list[int] = []
    for p in range(len(points)):  # points are ordered best throughput first
        out.extend([p] * int(whole[p]))
    frac = np.clip(counts - whole, 0.0, None)
    leftover = round(float(frac.sum()))
    if leftover > 0:
        share = frac / frac.sum()
        avg_cpu = float(share @ points.cpus_per_gpu)
        avg_mem = float(share @ points.mem_gb_per_gpu)
        fits = (points.cpus_per_gpu <= avg_cpu + EPS) & (points.mem_gb_per_gpu <= avg_mem + EPS)
        # Without such a point: on a Pareto front the slowest point is the cheapest in some resource.
        pick = int(np.flatnonzero(fits)[0]) if fits.any() else int(np.flatnonzero(frac > EPS)[-1])
        out.extend([pick] * leftover)
    out = out[:size]
    out.extend([-1] * (size - len(out)))
    return out
