"""Small builders for core views (servers, clusters, jobs) shared by the database-free test suites."""

from __future__ import annotations

import random
from collections.abc import Sequence

from profiles_app.catalog import profile_for
from scheduler_app.core.types import ClusterSnapshot, JobView, Placement, ServerView


def make_server(
    gpus: int = 8,
    cpus: int = 24,
    mem_gb: float = 500.0,
    server_id: int = 0,
    *,
    name: str | None = None,
    free_gpus: Sequence[int] | None = None,
    free_cpus: int | None = None,
    free_mem_gb: float | None = None,
) -> ServerView:
    """A server with `gpus` GPUs, `cpus` cores and `mem_gb` GB; everything free unless told."""
    return ServerView(
        server_id=server_id,
        name=name if name is not None else f"server-{server_id}",
        num_gpus=gpus,
        num_cpus=cpus,
        mem_gb=float(mem_gb),
        free_gpus=tuple(range(gpus)) if free_gpus is None else tuple(free_gpus),
        free_cpus=cpus if free_cpus is None else free_cpus,
        free_mem_gb=float(mem_gb if free_mem_gb is None else free_mem_gb),
    )


def make_cluster(
    servers: int | Sequence[ServerView] = 4,
    *,
    gpus: int = 8,
    cpus: int = 24,
    mem_gb: float = 500.0,
) -> ClusterSnapshot:
    """A snapshot of `servers` identical empty servers (ids 0..n-1), or of the given ServerViews."""
    if isinstance(servers, int):
        views = tuple(make_server(gpus, cpus, mem_gb, server_id=i) for i in range(servers))
    else:
        views = tuple(sorted(servers, key=lambda s: s.server_id))
    return ClusterSnapshot(servers=views)


def make_job(
    job_id: int,
    model: str = "res18",
    gpus: int = 1,
    arrival_s: float = 0.0,
    *,
    total_iters: float = 1000.0,
    done_iters: float = 0.0,
    attained_service_gpu_s: float = 0.0,
    cpus_per_gpu: float | None = None,
    mem_gb_per_gpu: float | None = None,
    deadline_s: float | None = None,
    priority: int = 0,
    current: Placement | None = None,
    profile_set: str = "models",
) -> JobView:
    """A runnable job of a catalog model (profiles_app.catalog); overrides fix its per-GPU demand."""
    return JobView(
        job_id=job_id,
        num_gpus=gpus,
        arrival_s=float(arrival_s),
        profile=profile_for(model, profile_set),
        total_iters=float(total_iters),
        done_iters=float(done_iters),
        attained_service_gpu_s=float(attained_service_gpu_s),
        cpus_per_gpu_override=cpus_per_gpu,
        mem_gb_per_gpu_override=mem_gb_per_gpu,
        deadline_s=deadline_s,
        priority=priority,
        current=current,
    )


def uniform_cluster(kind: int, rng: random.Random) -> ClusterSnapshot:
    """One of three clusters of identical empty servers, for random rounds: `kind` 0 the benches' 24
    cores and 500 GB on 8 GPUs, 1 shares off the 2^-20 grid (20 cores on 6 GPUs), 2 very short of
    cores (12 on 8 GPUs); the server count drawn from `rng`."""
    if kind == 0:
        return make_cluster(rng.choice((2, 3, 4)))
    if kind == 1:
        return make_cluster(rng.choice((2, 3)), gpus=6, cpus=20, mem_gb=300.0)
    if kind == 2:
        return make_cluster(rng.choice((2, 4)), gpus=8, cpus=12, mem_gb=200.0)
    raise ValueError(f"no uniform cluster of kind {kind}")
