"""GENIE's candidates: a job's Pareto points cheapest first, its GPU-count variants, and the round's
bookkeeping of placed jobs and the EASY reservation (used by allocators/genie.py)."""

from __future__ import annotations

from dataclasses import replace
from functools import lru_cache

from scheduler_app.core.allocators.opt_lp import pareto_points
from scheduler_app.core.placement import HeldShare
from scheduler_app.core.throughput import (
    EPS,
    OperatingPoint,
    ServerShape,
    best_case,
    job_profile,
    relative_speed,
)
from scheduler_app.core.types import JobView, SensitivityProfile


@lru_cache(maxsize=4096)
def points_by_cost(
    profile: SensitivityProfile, num_gpus: int, shape: ServerShape
) -> tuple[OperatingPoint, ...]:
    """Every Pareto-efficient point of the matrix (plus proportional and the best case), cheapest first.

    Cost: cores and memory per GPU in proportional shares, summed. A point is dropped when another
    is at least as fast with no more of either resource.
    """
    best = best_case(profile, num_gpus, shape)
    candidates = {
        (best.cpus_per_gpu, best.mem_gb_per_gpu): best.speed,
        (shape.cpus_per_gpu, shape.mem_gb_per_gpu): relative_speed(
            profile, num_gpus, shape, shape.cpus_per_gpu, shape.mem_gb_per_gpu
        ),
    }
    for c in profile.cpu_per_gpu_grid:
        for m in profile.mem_gb_per_gpu_grid:
            if c > shape.num_cpus + EPS or m > shape.mem_gb + EPS:
                continue  # more per GPU than a whole server has
            candidates.setdefault((c, m), relative_speed(profile, num_gpus, shape, c, m))
    points = [OperatingPoint(c, m, v) for (c, m), v in candidates.items() if v > EPS]
    # opt's Pareto front (one definition of "dominated"); the candidates keep their order for ties.
    front = pareto_points(
        [p.cpus_per_gpu for p in points], [p.mem_gb_per_gpu for p in points], [p.speed for p in points]
    )
    kept = set(zip(front.cpus_per_gpu.tolist(), front.mem_gb_per_gpu.tolist(), strict=True))
    efficient = [p for p in points if (p.cpus_per_gpu, p.mem_gb_per_gpu) in kept]

    def cost(p: OperatingPoint) -> tuple[float, float]:
        return (p.cpus_per_gpu / shape.cpus_per_gpu + p.mem_gb_per_gpu / shape.mem_gb_per_gpu, -p.speed)

    return tuple(sorted(efficient, key=cost))


def gpu_variant(job: JobView, num_gpus: int) -> tuple[JobView, float]:
    """`job` as if it had asked for `num_gpus` GPUs, and the factor that turns a speed of that variant
    into one in the job's own terms. The samples are the same: an iteration on k GPUs processes k/G of
    an iteration on the job's G, so its work is G/k times as many iterations (progress and a minimum
    rate likewise), each taking the predictor's time for k GPUs (job_profile; Synergy's time without
    a fit). Speed s on k GPUs then finishes the job as fast as speed s x (k/G) x t(G)/t(k) on G."""
    g = job.num_gpus
    if num_gpus == g:
        return job, 1.0
    per_iteration = g / num_gpus
    profile = job_profile(job.profile, num_gpus)
    variant = replace(
        job,
        num_gpus=num_gpus,
        profile=profile,
        total_iters=job.total_iters * per_iteration,
        done_iters=job.done_iters * per_iteration,
        min_rate_iters_per_s=(
            None if job.min_rate_iters_per_s is None else job.min_rate_iters_per_s * per_iteration
        ),
        gpu_choices=(),
    )
    return variant, (num_gpus / g) * job.profile.iter_time_s / profile.iter_time_s


class Reservation:
    """EASY backfilling's single reservation: when the QoS job can start, and the GPUs spare then."""

    __slots__ = ("spare_gpus", "start_s")

    def __init__(self, start_s: float, spare_gpus: int) -> None:
        self.start_s = start_s
        self.spare_gpus = spare_gpus


class Held:
    """A job placed in this round (its point may still grow in the leftover pass)."""

    __slots__ = ("fixed", "job", "kept", "need", "point", "pos", "reason", "scale", "shares", "top")

    def __init__(
        self,
        pos: int,
        job: JobView,
        shares: list[HeldShare],
        point: OperatingPoint,
        reason: str,
        fixed: bool,
        need: float | None = None,
        scale: float = 1.0,
    ) -> None:
        self.pos = pos
        self.need = need  # the QoS speed it was placed for (None: best effort)
        self.scale = scale  # its speed at its GPU count -> in the job's own iterations (gpu_variant)
        self.job = job
        self.shares = shares
        self.point = point
        self.reason = reason
        self.fixed = fixed
        self.top = False  # known to hold its fastest point: the leftover pass skips it (genie_home.py)
        self.kept = False  # ... and to be on its own Placement as RoundSetup.placed records it
