"""GENIE's QoS needs: the speed that meets a job's QoS target, and what a round reads of them (need_key).

genie.py decides with them; the simulator's exact reuse of rounds (simulator/reuse.py) compares need_key
between rounds, through GenieAllocator.progress_key.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence

from scheduler_app.core.allocators.genie_points import shape_points
from scheduler_app.core.throughput import EPS, ServerShape, cluster_shape
from scheduler_app.core.types import ClusterSnapshot, JobView


def required_speed(job: JobView, shape: ServerShape, now_s: float, slack: float) -> float | None:
    """The speed (x proportional, after the placement's slowdown) that meets the job's QoS target, or
    None: no target, or not attainable even at the best case on the fewest servers (a job given both
    kinds needs both, and is late when either is out of reach)."""
    if job.deadline_s is None and job.min_rate_iters_per_s is None:
        return None
    if job.deadline_s is not None and job.deadline_s - now_s <= 0:
        return None  # past its deadline (below: window_s <= 0), before any lookup
    servers = job.num_nodes or -(-job.num_gpus // shape.num_gpus)
    best = shape_points(job.profile, job.num_gpus, servers, shape).best_speed
    need = 0.0
    if job.deadline_s is not None:
        window_s = job.deadline_s - now_s
        work_s = job.remaining_iters * job.profile.iter_time_s
        if window_s <= 0 or work_s > best * window_s + EPS:
            return None
        # The slack is a margin taken where the best case allows it: a job that meets its deadline
        # only without it (an urgent one) needs its best case, not best effort.
        need = work_s / (window_s * slack)
        if need > best + EPS:
            need = work_s / window_s
    if job.min_rate_iters_per_s is not None:
        # The rate holds while it runs, on the servers it spans (the slowdown is in `best`).
        rate_need = job.min_rate_iters_per_s * job.profile.iter_time_s
        if rate_need > best + EPS:
            return None
        need = max(need, rate_need)
    return need


def need_key(
    jobs: Sequence[JobView], snapshot: ClusterSnapshot, now_s: float, slack: float
) -> tuple[tuple[int, int | None], ...]:
    """What a round reads of the deadline jobs' progress and of the clock, when it reads them only
    through their needs: for each job with a deadline, in order, None when its deadline is out of reach
    (best effort), else how many of its points (points_by_cost) meet its need at their speed on the
    fewest servers: the points that do are always the fastest that many (ShapePoints.meeting_count),
    so the count names the points `options` tries and the outcome of every comparison of its need
    with such a speed. Two rounds with equal keys, in which GenieRound.keyed stayed True, compared
    every need alike."""
    shape = cluster_shape(snapshot)
    if shape is None:
        return ()
    out = []
    for job in jobs:
        if job.deadline_s is None:
            continue
        need = required_speed(job, shape, now_s, slack)
        if need is None:
            out.append((job.job_id, None))
            continue
        servers = job.num_nodes or -(-job.num_gpus // shape.num_gpus)
        out.append((job.job_id, shape_points(job.profile, job.num_gpus, servers, shape).meeting_count(need)))
    return tuple(out)


def unchanging_key(key: Hashable) -> bool:
    """True for a progress key that stays what it is while no job arrives, finishes, starts or stops:
    an empty one (an allocator blind to progress, or no deadline job), or need_key's where no deadline
    job has a need (each past its deadline or out of reach: its work left less what its best case does
    by the deadline is linear in time, so out of reach at two times is out of reach between them). A
    need that some points meet may rise and fall between two times (the slack's switch)."""
    return key == () or (
        isinstance(key, tuple) and all(isinstance(e, tuple) and len(e) == 2 and e[1] is None for e in key)
    )
