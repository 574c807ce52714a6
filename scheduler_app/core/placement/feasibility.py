"""What no placement can change: jobs that can never fit, GPU-only admission, why a job stays pending."""

from __future__ import annotations

import math
from collections.abc import Sequence

from scheduler_app.core import reasons
from scheduler_app.core.placement.plan import EPS
from scheduler_app.core.types import ClusterSnapshot, JobView, ServerView


def has_fixed_demand(job: JobView) -> bool:
    """True when the user fixed the per-GPU cores or memory of this job."""
    return job.cpus_per_gpu_override is not None or job.mem_gb_per_gpu_override is not None


def infeasible_reason(
    job: JobView,
    snapshot: ClusterSnapshot,
    total_gpus: int | None = None,
    memo: dict[tuple[int, float | None, float | None], int] | None = None,
) -> str | None:
    """Why `job` can never fit this cluster (even empty), or None if it could.

    A fixed demand is infeasible when the cluster cannot hold `num_gpus` GPUs each with that
    per-GPU share, counting every server's full capacity (a split job needs the share on every
    server it touches); a dimension that is not overridden gets each server's proportional share,
    which always fits. A job with `num_nodes` = N needs num_gpus to split evenly, and N servers that
    could each hold num_gpus / N of its GPUs (with its fixed demand, if any). `memo`: a dict shared
    by the calls on one snapshot (counts of servers by demand), as `infeasible_reasons` passes.
    """
    if job.num_gpus < 1:
        raise ValueError(f"job {job.job_id}: num_gpus must be >= 1, got {job.num_gpus}")
    if job.num_nodes is not None:
        return _node_infeasible_reason(job, snapshot, total_gpus, {} if memo is None else memo)
    if job.num_gpus > (snapshot.total_gpus if total_gpus is None else total_gpus):
        return reasons.EXCEEDS_CLUSTER_GPUS
    if not has_fixed_demand(job):
        return None
    # A helper, not a generator here: capturing c and m would cost every job two cells per call.
    holdable = _holdable_total(snapshot, job.cpus_per_gpu_override, job.mem_gb_per_gpu_override)
    return reasons.EXCEEDS_SERVER_RESOURCES if holdable < job.num_gpus else None


def _node_infeasible_reason(
    job: JobView,
    snapshot: ClusterSnapshot,
    total_gpus: int | None,
    memo: dict[tuple[int, float | None, float | None], int],
) -> str | None:
    """`infeasible_reason` for a job with a node count (kept apart: every job passes the other path).

    `memo` keys: (0, c, m) -> GPUs the cluster holds at (c, m); (k, c, m) -> servers holding k of
    them. Live jobs mostly carry a node count, so each is counted once per snapshot, not per job.
    """
    nodes = job.num_nodes
    assert nodes is not None
    num_gpus = job.num_gpus
    if nodes < 1:
        raise ValueError(f"job {job.job_id}: num_nodes must be >= 1 or None, got {nodes}")
    if num_gpus % nodes:
        return reasons.UNEVEN_NODE_SPLIT
    if num_gpus > (snapshot.total_gpus if total_gpus is None else total_gpus):
        return reasons.EXCEEDS_CLUSTER_GPUS
    c, m = job.cpus_per_gpu_override, job.mem_gb_per_gpu_override
    if c is not None or m is not None:
        holdable = memo.get((0, c, m))
        if holdable is None:
            holdable = memo[(0, c, m)] = _holdable_total(snapshot, c, m)
        if holdable < num_gpus:
            return reasons.EXCEEDS_SERVER_RESOURCES
    per_node = num_gpus // nodes
    servers = memo.get((per_node, c, m))
    if servers is None:
        servers = memo[(per_node, c, m)] = _servers_holding(snapshot, per_node, c, m)
    return reasons.EXCEEDS_CLUSTER_NODES if servers < nodes else None


def _holdable_total(snapshot: ClusterSnapshot, c: float | None, m: float | None) -> int:
    """How many GPUs of the whole (empty) cluster a job with fixed per-GPU demand (c, m) could hold."""
    return sum(_holdable_gpus(s, c, m) for s in snapshot.servers)


def _servers_holding(snapshot: ClusterSnapshot, k: int, c: float | None, m: float | None) -> int:
    """How many servers of the (empty) cluster could each hold k GPUs at fixed per-GPU demand (c, m)."""
    return sum(1 for s in snapshot.servers if _holdable_gpus(s, c, m) >= k)


def _holdable_gpus(server: ServerView, c: float | None, m: float | None) -> int:
    """How many GPUs of an empty `server` a job with fixed per-GPU demand (c, m) could hold."""
    k = server.num_gpus
    if c is not None and c > 0:
        k = min(k, math.floor((server.num_cpus + EPS) / c))
    if m is not None and m > 0:
        k = min(k, math.floor((server.mem_gb + EPS) / m))
    return k


def infeasible_reasons(jobs: Sequence[JobView], snapshot: ClusterSnapshot) -> list[str | None]:
    """`infeasible_reason` for every job (the cluster's GPU total and server counts computed once)."""
    total_gpus = snapshot.total_gpus
    memo: dict[tuple[int, float | None, float | None], int] = {}
    out: list[str | None] = []
    append = out.append
    for job in jobs:
        num_gpus = job.num_gpus
        if (
            0 < num_gpus <= total_gpus
            and job.num_nodes is None
            and job.cpus_per_gpu_override is None
            and job.mem_gb_per_gpu_override is None
        ):
            append(None)  # infeasible_reason's answer for such a job (most jobs), without the call
        else:
            append(infeasible_reason(job, snapshot, total_gpus, memo))
    return out


def gpu_admission(
    ordered_jobs: Sequence[JobView],
    infeasible: Sequence[str | None],
    free_gpu_count: int,
    snapshot: ClusterSnapshot | None = None,
) -> list[bool]:
    """Synergy's runnable set: in policy order, admit a job if its GPU count fits what is left.

    Only GPUs are checked, so a later smaller job may be admitted past a big one that does not fit.
    Infeasible jobs are never admitted. Reference: simulator/schedulers/*_synergy_new.py
    (`jobs_this_round`). With `snapshot`, a job with a node count N is admitted only if N servers
    have num_gpus / N free GPUs: otherwise it cannot start this round whatever the others do, and
    admitting it would only hold GPUs back from the jobs behind it.
    """
    admitted = [False] * len(ordered_jobs)
    left = free_gpu_count
    servers_free: dict[int, int] = {}  # k -> servers with at least k free GPUs
    for pos, job in enumerate(ordered_jobs):
        if infeasible[pos] is None and job.num_gpus <= left:
            nodes = job.num_nodes
            if nodes is not None and snapshot is not None:
                per_node = job.num_gpus // nodes
                servers = servers_free.get(per_node)
                if servers is None:
                    servers = servers_free[per_node] = _servers_with_free(snapshot, per_node)
                if servers < nodes:
                    continue
            admitted[pos] = True
            left -= job.num_gpus
    return admitted


def _servers_with_free(snapshot: ClusterSnapshot, k: int) -> int:
    """How many servers of the snapshot have at least k free GPUs."""
    return sum(1 for s in snapshot.servers if len(s.free_gpus) >= k)


def pending_reason(num_gpus: int, free_gpu_count: int) -> str:
    """`insufficient_gpus` when the GPUs were not there, `fragmented` when CPU/memory were missing."""
    return reasons.INSUFFICIENT_GPUS if num_gpus > free_gpu_count else reasons.FRAGMENTED
