"""Profiling runs: queued, assigned to a server, their points recorded, then succeeded, failed or requeued."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from django.utils import timezone

from cluster_app.models import Server
from profiles_app import optimistic
from profiles_app.models import CpuSearch, ProfilingKind, ProfilingRun, ProfilingRunStatus, Workload

logger = logging.getLogger(__name__)


def profiling_run_queue(
    *,
    workload: Workload,
    num_gpus: int = 1,
    strategy: str = CpuSearch.BISECTION,
    rel_tol: float = optimistic.DEFAULT_REL_TOL,
    iters_per_point: int = 50,
    warmup_iters: int = 5,
) -> ProfilingRun:
    """A QUEUED Synergy profiling run of `workload` (at most one is active per workload: the database
    refuses a second, so callers check `profiling_run_active` first)."""
    return ProfilingRun.objects.create(
        workload=workload,
        kind=ProfilingKind.SYNERGY_CPU_SWEEP,
        status=ProfilingRunStatus.QUEUED,
        strategy=strategy,
        rel_tol=rel_tol,
        iters_per_point=iters_per_point,
        warmup_iters=warmup_iters,
        num_gpus=num_gpus,
    )


def profiling_run_assign(
    *,
    run: ProfilingRun,
    server: Server,
    gpu_indices: Sequence[int],
    num_cpus: int,
    mem_gb: float,
    now: datetime,
) -> ProfilingRun:
    """QUEUED -> RUNNING on `server`, holding these GPUs, cores and memory; the first points to measure.

    The caller holds the scheduling round's lock, so nothing else hands these resources out meanwhile.
    """
    run.server = server
    run.gpu_indices = [int(i) for i in gpu_indices]
    run.num_cpus = int(num_cpus)
    run.mem_gb = float(mem_gb)
    run.status = ProfilingRunStatus.RUNNING
    run.started_at = now
    run.measured_points = []
    run.pending_cpus = optimistic.next_cpu_counts(
        {}, max_cpus=run.num_cpus, num_gpus=run.num_gpus, strategy=run.strategy, rel_tol=run.rel_tol
    )
    run.save()
    logger.info(
        "profiling run %s (%s): on %s, GPUs %s, %d cores, %.1f GB; first points %s",
        run.pk,
        run.workload.name,
        server.name,
        run.gpu_indices,
        run.num_cpus,
        run.mem_gb,
        run.pending_cpus,
    )
    return run


def _points_by_cpus(run: ProfilingRun) -> dict[int, float]:
    return {int(p["cpus"]): float(p["sec_per_iter"]) for p in run.measured_points}


def profiling_point_record(*, run: ProfilingRun, point: Mapping[str, Any]) -> bool:
    """Store one measured point (the first measurement of a core count wins) and decide the next ones.

    Returns True when the search is complete (nothing left to measure). The caller locked `run`.
    """
    cpus = int(point["cpus"])
    if cpus not in _points_by_cpus(run):
        run.measured_points = [*run.measured_points, {**point, "cpus_per_gpu": cpus / run.num_gpus}]
    host = {k: point[k] for k in ("mem_gbps", "disk_mbps") if point.get(k)}
    if host:
        run.host = {**run.host, **host}
    run.pending_cpus = optimistic.next_cpu_counts(
        _points_by_cpus(run),
        max_cpus=run.num_cpus,
        num_gpus=run.num_gpus,
        strategy=run.strategy,
        rel_tol=run.rel_tol,
    )
    run.save(update_fields=["measured_points", "host", "pending_cpus"])
    return not run.pending_cpus


def profiling_run_costs(run: ProfilingRun, now: datetime) -> None:
    """Add this attempt's wall and GPU time to the run's costs (the caller saves the run)."""
    # The GPUs were held from assignment to now, whether a point was running or not; added to what
    # earlier attempts of the run (requeued from a failed server) cost. A GENIE run's peer GPU was
    # held until its part was measured.
    held_s = max(0.0, (now - run.started_at).total_seconds()) if run.started_at else 0.0
    run.cost_wall_s += held_s
    run.cost_gpu_s += run.num_gpus * held_s
    if run.peer_gpu_indices and run.started_at:
        peer_until = min(now, run.peer_released_at or now)
        run.cost_gpu_s += len(run.peer_gpu_indices) * max(0.0, (peer_until - run.started_at).total_seconds())


def profiling_run_succeed(*, run: ProfilingRun, now: datetime | None = None) -> Workload:
    """Derive the full matrix from the measured CPU points (MinIO memory model) and store it on the
    workload, with source "profiled on <server>"; the run becomes SUCCEEDED with its costs."""
    now = now or timezone.now()
    workload = Workload.objects.select_for_update().get(pk=run.workload_id)
    points = _points_by_cpus(run)
    peak_rss_mb = max((float(p.get("peak_rss_mb") or 0) for p in run.measured_points), default=0.0)
    working_set_gb = peak_rss_mb / 1024 / run.num_gpus
    has_dataset = workload.dataset_gb > 0 and workload.dataset_samples > 0 and workload.batch_size > 0
    dataset = optimistic.DatasetSpec(
        dataset_gb=workload.dataset_gb if has_dataset else 0.0,
        samples=workload.dataset_samples or 1,
        samples_per_iter=(workload.batch_size or 1) * run.num_gpus,
        working_set_gb=working_set_gb,
    )
    node = optimistic.NodeBandwidth(
        mem_gbps=float(run.host.get("mem_gbps") or 0.0),
        disk_mbps=float(run.host.get("disk_mbps") or (run.server.storage_mbps if run.server else 0.0)),
    )
    derived = optimistic.derive_profile(
        optimistic.per_gpu(points, run.num_gpus), dataset=dataset, node=node, num_gpus=run.num_gpus
    )
    server_name = run.server.name if run.server else "?"
    workload.cpu_per_gpu_grid = list(derived.cpu_per_gpu_grid)
    workload.mem_gb_per_gpu_grid = list(derived.mem_gb_per_gpu_grid)
    workload.tput_matrix = [list(row) for row in derived.tput]
    workload.best_cpus_per_gpu = derived.best_cpus_per_gpu
    workload.best_mem_gb_per_gpu = derived.best_mem_gb_per_gpu
    workload.speedup = derived.speedup
    workload.iter_time_s = derived.iter_time_s
    workload.working_set_gb = working_set_gb
    workload.source = f"profiled on {server_name} (run {run.pk})"[:255]
    workload.speed_correction = 1.0  # the correction was of the old profile
    workload.speed_correction_jobs = 0
    workload.save()
    run.status = ProfilingRunStatus.SUCCEEDED
    run.finished_at = now
    run.pending_cpus = []
    run.result = {
        **derived.as_json(),
        "dataset": {
            "dataset_gb": dataset.dataset_gb,
            "samples": dataset.samples,
            "samples_per_iter": dataset.samples_per_iter,
            "working_set_gb": working_set_gb,
        },
        "node": {"mem_gbps": node.mem_gbps, "disk_mbps": node.disk_mbps},
        "memory_model": "minio" if has_dataset else "none (no dataset size and sample count)",
    }
    profiling_run_costs(run, now)
    run.save()
    logger.info(
        "profiling run %s (%s) on %s: %d points, best %g cores / %g GB per GPU, speed-up %.2f, %.0f GPU-s",
        run.pk,
        workload.name,
        server_name,
        len(points),
        derived.best_cpus_per_gpu,
        derived.best_mem_gb_per_gpu,
        derived.speedup,
        run.cost_gpu_s,
    )
    return workload


def profiling_run_fail(*, run: ProfilingRun, error: str, now: datetime | None = None) -> ProfilingRun:
    """The run failed (a point crashed, the search cannot give a profile): FAILED, resources released.

    The workload stays unprofiled; its jobs are then scheduled at the GPU-proportional share.
    """
    now = now or timezone.now()
    run.status = ProfilingRunStatus.FAILED
    run.finished_at = now
    run.error = error[:5000]
    run.pending_cpus = []
    profiling_run_costs(run, now)
    run.save()
    logger.warning("profiling run %s (%s) failed: %s", run.pk, run.workload.name, error)
    return run


def profiling_run_requeue(*, run: ProfilingRun, reason: str, now: datetime | None = None) -> ProfilingRun:
    """RUNNING -> QUEUED (its server went away): it starts over on the next server that has room.

    A new lease id: the old agent's late reports are refused, and the next agent's seqs start afresh.
    """
    logger.warning("profiling run %s (%s) requeued: %s", run.pk, run.workload.name, reason)
    profiling_run_costs(run, now or timezone.now())
    run.lease_id = uuid.uuid4()
    run.status = ProfilingRunStatus.QUEUED
    run.server = None
    run.gpu_indices = []
    run.num_cpus = 0
    run.mem_gb = 0
    run.pending_cpus = []
    run.measured_points = []
    run.peer_server = None
    run.peer_lease_id = None
    run.peer_gpu_indices = []
    run.peer_num_cpus = 0
    run.peer_mem_gb = 0
    run.peer_released_at = None
    run.configs = []
    run.started_at = None
    run.error = f"requeued: {reason}"
    run.save()
    return run
