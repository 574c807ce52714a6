"""Which deadline jobs SWAF guarantees when the cluster is overloaded (our extension to GENIE's order).

SWAF alone serves least slack first, so under overload it spends the cluster on long jobs that are
about to miss while shorter ones then miss too (measured: docs/reproduction.md, GENIE at 4 jobs/h).
Moore and Hodgson's rule, which maximises the jobs on time on one machine, is the fix: walk the deadline
jobs that can still make it in deadline order, adding up the capacity each needs; whenever the sum
exceeds what the cluster can offer by the current job's deadline, the job needing the most so far
loses its guarantee and goes to SWAF's best-effort tail (shortest first), where it may still finish
in time on what is left. Chronus (PAPERS §2.4) labels SLO jobs guaranteed / unguaranteed the same way.

- A job's need: GPU-seconds weighted by its dominant resource, at the cheapest Pareto point of its
  sensitivity matrix that still finishes it by its deadline, on the fewest servers that hold it
  (num_gpus x max(1, cores / proportional cores, GB / proportional GB) x execution time there).
- The cluster's offer by deadline D: `plannable_share` x its GPUs x (D - now). The rest is what this
  account leaves out: whole-GPU packing on servers, the allocator's slack, the round grid and restarts,
  and urgent jobs that arrive later with tighter deadlines. On GENIE's workload at 4 jobs/h
  (`python -m bench.swaf_guarantees`, seeds 1-6) 0.3 to 0.6 meet 89 to 92 % of deadlines against
  78.7 % without guarantees; 1.0 meets 80.2 %.
- A job with a higher `priority` (GENIE's emergency flag) loses its guarantee only when no job of a
  lower priority walked so far can.
- No job loses its guarantee while all of them fit on the cluster's GPUs at once: they do not compete
  now, and the share would otherwise reorder jobs on a cluster that is not overloaded (a test's two
  6-GPU jobs due in 1,500 s on 16 GPUs, 51 % of the offer, were split that way before this rule).
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence

from scheduler_app.core.allocators.genie_points import shape_points
from scheduler_app.core.throughput import EPS, ServerShape
from scheduler_app.core.types import ClusterSnapshot, JobView

DEFAULT_PLANNABLE_SHARE = 0.5


def deadline_need_gpu_s(job: JobView, shape: ServerShape, now_s: float) -> float | None:
    """The dominant-resource GPU-seconds `job` needs to finish by its deadline at its cheapest point
    (None: no deadline, or no point of its matrix finishes it in time)."""
    if job.deadline_s is None or job.deadline_s <= now_s:
        return None
    work_s = job.remaining_iters * job.profile.iter_time_s
    speed_needed = work_s / (job.deadline_s - now_s)
    servers = job.num_nodes or -(-job.num_gpus // shape.num_gpus)
    # Over its points (points_by_cost) fast enough on those servers: num_gpus x max(1, cores /
    # proportional cores, GB / proportional GB) x work_s / speed, the least (ShapePoints' memo).
    return shape_points(job.profile, job.num_gpus, servers, shape).cheapest_gpu_s(work_s, speed_needed)


def unguaranteed_jobs(
    jobs: Sequence[JobView],
    snapshot: ClusterSnapshot,
    shape: ServerShape | None,
    now_s: float,
    plannable_share: float = DEFAULT_PLANNABLE_SHARE,
) -> set[int]:
    """The ids of the deadline jobs that lose their guarantee (see the module docstring); `jobs` are
    a round's jobs (those without a deadline, or that no point finishes in time, need none)."""
    if shape is None:
        return set()
    cluster_gpus = sum(s.num_gpus for s in snapshot.servers)
    walk: list[tuple[float, float, int, int, float]] = []
    walked_gpus = 0
    for job in jobs:
        need = deadline_need_gpu_s(job, shape, now_s)
        if need is not None:
            assert job.deadline_s is not None
            walk.append((job.deadline_s, job.arrival_s, job.job_id, job.priority, need))
            walked_gpus += job.num_gpus
    if walked_gpus <= cluster_gpus:
        return set()  # they all fit on the cluster's GPUs at once: none competes for them now
    walk.sort()
    guaranteed: list[tuple[int, float, int]] = []  # heap: lowest priority, then largest need first
    committed_gpu_s = 0.0
    dropped: set[int] = set()
    for deadline_s, _, job_id, priority, need in walk:
        heapq.heappush(guaranteed, (priority, -need, job_id))
        committed_gpu_s += need
        offer_gpu_s = plannable_share * cluster_gpus * (deadline_s - now_s)
        while committed_gpu_s > offer_gpu_s + EPS and guaranteed:
            _, minus_need, loser = heapq.heappop(guaranteed)
            committed_gpu_s += minus_need
            dropped.add(loser)
    return dropped
