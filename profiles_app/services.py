"""Every state change of workload knowledge: the catalog, profiling runs, stored profiles, observed speeds."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db import connection, transaction
from django.db.models import F, FloatField, Sum, Value
from django.db.models.functions import Cast
from django.utils import timezone

from cluster_app.models import Server
from profiles_app import optimistic
from profiles_app.catalog import DEFAULT_PROFILE_SET, batch_size_for, load_catalog
from profiles_app.models import (
    CpuSearch,
    ProfilingKind,
    ProfilingRun,
    ProfilingRunStatus,
    SpeedObservation,
    Workload,
    WorkloadClass,
)
from scheduler_app.core.predictor import fit_interference_kappa, fit_placement_penalty

logger = logging.getLogger(__name__)

CATALOG_SOURCE = "msr-fiddle/synergy simulator model profiles (MIT licence)"


@dataclass(frozen=True)
class CatalogLoad:
    """What workload_catalog_load did with each model of the shipped catalog."""

    created: int
    updated: int
    unchanged: int
    kept: int  # profiled or registered on this cluster: its own profile is not replaced by the shipped one

    @property
    def total(self) -> int:
        return self.created + self.updated + self.unchanged + self.kept


@transaction.atomic
def workload_catalog_load(*, profile_set: str = DEFAULT_PROFILE_SET) -> CatalogLoad:
    """Create the shipped catalog's missing workloads and bring those it shipped before up to date.

    Idempotent: a row already as shipped is not written at all. A workload whose profile was measured
    here (a profiling run) or that was registered here under a catalog name keeps its own profile, and
    what finished jobs taught (the speed correction, a learnt placement penalty) is never overwritten,
    so a deployment may run this at every start (docker-compose.yml does, after migrate).
    """
    catalog = load_catalog(profile_set)
    # Locked: two containers starting at once (web replicas) update the rows one after the other.
    existing = {w.name: w for w in Workload.objects.select_for_update().filter(name__in=list(catalog))}
    counts = {"created": 0, "updated": 0, "unchanged": 0, "kept": 0}
    for name, profile in catalog.items():
        fields: dict[str, Any] = {
            "workload_class": profile.workload_class,
            "source": CATALOG_SOURCE,
            "iter_time_s": profile.iter_time_s,
            "cpu_per_gpu_grid": list(profile.cpu_per_gpu_grid),
            "mem_gb_per_gpu_grid": list(profile.mem_gb_per_gpu_grid),
            "tput_matrix": [list(row) for row in profile.tput],
            "best_cpus_per_gpu": profile.best_cpus_per_gpu,
            "best_mem_gb_per_gpu": profile.best_mem_gb_per_gpu,
            "speedup": profile.speedup,
            "batch_size": batch_size_for(name, profile_set),  # GENIE's profile and predictor time it
        }
        row = existing.get(name)
        if row is None:
            Workload.objects.create(name=name, placement_penalty=profile.placement_penalty, **fields)
            counts["created"] += 1
            continue
        if row.source != CATALOG_SOURCE:
            counts["kept"] += 1
            continue
        # A penalty learnt on this cluster's network outlives a reload of the shipped one.
        if row.placement_penalty_leases == 0:
            fields["placement_penalty"] = profile.placement_penalty
        changed = [field for field, value in fields.items() if getattr(row, field) != value]
        if not changed:
            counts["unchanged"] += 1
            continue
        for field in changed:
            setattr(row, field, fields[field])
        row.save(update_fields=[*changed, "updated_at"])
        counts["updated"] += 1
    return CatalogLoad(**counts)


@transaction.atomic
def workload_register(
    *,
    name: str,
    argv: Sequence[str] = (),
    workload_class: str = WorkloadClass.OTHER,
    description: str = "",
    dataset_gb: float = 0.0,
    dataset_samples: int = 0,
    batch_size: int = 0,
    ground_truth: Mapping[str, Any] | None = None,
) -> Workload:
    """A workload known by name but not profiled yet (empty matrix): its first job gets it profiled.

    The best case and speed are placeholders (the proportional share, 1 s per iteration) until a
    profiling run stores the measured ones. `ground_truth` is for demos and tests (see Workload).
    """
    return Workload.objects.create(
        name=name,
        argv=[str(a) for a in argv],
        workload_class=workload_class,
        description=description,
        source="registered; not profiled yet",
        dataset_gb=dataset_gb,
        dataset_samples=dataset_samples,
        batch_size=batch_size,
        iter_time_s=1.0,
        cpu_per_gpu_grid=[],
        mem_gb_per_gpu_grid=[],
        tput_matrix=[],
        best_cpus_per_gpu=optimistic.FAIR_CPUS_PER_GPU,
        best_mem_gb_per_gpu=optimistic.FAIR_MEM_GB_PER_GPU,
        speedup=1.0,
        ground_truth=dict(ground_truth or {}),
    )


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


@dataclass(frozen=True)
class SpeedMeasurement:
    """A lease's measured speed next to what its profile predicted (see SpeedObservation)."""

    workload_id: int
    job_id: int
    allocation_id: int
    cpus_per_gpu: float
    mem_gb_per_gpu: float
    predicted_iters_per_s: float
    measured_iters_per_s: float
    at: datetime
    num_servers: int = 1
    placement_penalty: float = 1.0
    colocated_comm_jobs: int = 0
    interference_factor: float = 1.0


def speed_observations_record(measurements: Sequence[SpeedMeasurement]) -> int:
    """Record the latest measured speed of each lease next to its prediction, one row per lease, in one
    statement whatever their number (an agent's sync carries a report per running lease).

    INSERT ... ON CONFLICT (allocation) DO UPDATE: a new lease's row is created with its first report's
    prediction and penalty (`placement_penalty` is the penalty the prediction holds, 1 on one server;
    the placement fit takes it out again); a known one gets the new speed, one more sample and the
    later date. Of several measurements of one lease in a batch the latest counts, each as a sample.
    Returns how many leases were recorded.
    """
    latest: dict[int, SpeedMeasurement] = {}
    counts: dict[int, int] = {}
    for m in measurements:
        counts[m.allocation_id] = counts.get(m.allocation_id, 0) + 1
        if m.allocation_id not in latest or m.at >= latest[m.allocation_id].at:
            latest[m.allocation_id] = m
    if not latest:
        return 0
    meta, qn = SpeedObservation._meta, connection.ops.quote_name
    table = qn(meta.db_table)
    names = [
        "workload_id",
        "job_id",
        "allocation_id",
        "cpus_per_gpu",
        "mem_gb_per_gpu",
        "num_servers",
        "placement_penalty",
        "colocated_comm_jobs",
        "interference_factor",
        "predicted_iters_per_s",
        "measured_iters_per_s",
        "samples",
        "first_at",
        "at",
    ]
    fields = [meta.get_field(n) for n in names]
    params: list[Any] = []
    for allocation_id, m in sorted(latest.items()):  # sorted: concurrent batches lock rows in one order
        values = {**m.__dict__, "samples": counts[allocation_id], "first_at": m.at}
        params += [f.get_db_prep_save(values[n], connection) for n, f in zip(names, fields, strict=True)]
    one = "(" + ", ".join(["%s"] * len(names)) + ")"
    col = {n: qn(f.column) for n, f in zip(names, fields, strict=True)}
    sql = (
        f"INSERT INTO {table} ({', '.join(col.values())}) VALUES {', '.join([one] * len(latest))} "
        f"ON CONFLICT ({col['allocation_id']}) DO UPDATE SET "
        f"{col['measured_iters_per_s']} = CASE WHEN EXCLUDED.{col['at']} >= {table}.{col['at']} "
        f"THEN EXCLUDED.{col['measured_iters_per_s']} ELSE {table}.{col['measured_iters_per_s']} END, "
        f"{col['samples']} = {table}.{col['samples']} + EXCLUDED.{col['samples']}, "
        f"{col['at']} = CASE WHEN EXCLUDED.{col['at']} > {table}.{col['at']} "
        f"THEN EXCLUDED.{col['at']} ELSE {table}.{col['at']} END"
    )
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
    return len(latest)


# GENIE's feedback (PAPERS 5.6): r <- (1 - weight) r + weight x observed / predicted.
SPEED_CORRECTION_WEIGHT = 0.2
# One job's ratio is clamped to this range: a broken report must not make every estimate absurd.
SPEED_RATIO_RANGE = (0.1, 10.0)
# A job with fewer progress reports than this ran too briefly (start-up, warm-up) to say anything.
SPEED_MIN_REPORTS = 3


def job_speed_ratios(*, job_ids: Iterable[int]) -> dict[int, float]:
    """job -> measured / predicted speed over its leases (each lease weighted by its report count), in
    one query; a job measured fewer than SPEED_MIN_REPORTS times in all is left out."""
    rows = (
        SpeedObservation.objects.filter(job_id__in=list(job_ids), predicted_iters_per_s__gt=0)
        .values("job_id")
        .annotate(
            measured=Sum(F("measured_iters_per_s") * F("samples")),
            predicted=Sum(F("predicted_iters_per_s") * F("samples")),
            reports=Sum("samples"),
        )
    )
    low, high = SPEED_RATIO_RANGE
    return {
        row["job_id"]: min(high, max(low, row["measured"] / row["predicted"]))
        for row in rows
        if row["reports"] >= SPEED_MIN_REPORTS and row["predicted"] > 0
    }


def job_speed_ratio(*, job_id: int) -> float | None:
    """Measured / predicted speed over a job's leases, or None when measured too few times."""
    return job_speed_ratios(job_ids=[job_id]).get(job_id)


def speed_corrections_fold(*, jobs: Sequence[tuple[int, int]]) -> dict[int, float]:
    """Fold ended jobs' measured / predicted speeds into their workloads' EWMA corrections, in the order
    given ((job, workload) pairs), as if one after the other; returns {job: its ratio} for the jobs
    that had one (a job with no observation changes nothing).

    One read for all the jobs and one UPDATE per workload, with F() expressions, so jobs of one
    workload folded at the same time elsewhere all count: k ratios r_1..r_k in turn make
    c (1 - w)^k + sum_i w (1 - w)^(k - i) r_i.
    """
    ratios = job_speed_ratios(job_ids=[job_id for job_id, _ in jobs])
    by_workload: dict[int, list[float]] = {}
    for job_id, workload_id in jobs:
        if job_id in ratios:
            by_workload.setdefault(workload_id, []).append(ratios[job_id])
    w = SPEED_CORRECTION_WEIGHT
    for workload_id, folded in sorted(by_workload.items()):
        k = len(folded)
        added = sum(w * (1 - w) ** (k - i) * r for i, r in enumerate(folded, start=1))
        Workload.objects.filter(pk=workload_id).update(
            speed_correction=F("speed_correction") * (1 - w) ** k + added,
            speed_correction_jobs=F("speed_correction_jobs") + k,
        )
        logger.info(
            "workload %s: speed ratio %s of %d ended job(s) folded into its correction",
            workload_id,
            ", ".join(f"{r:.3f}" for r in folded),
            k,
        )
    return {job_id: ratios[job_id] for job_id, _ in jobs if job_id in ratios}


# The placement fit reads this many of a workload's latest measured leases of each kind: recent enough
# to follow a network change, enough for a median.
PLACEMENT_FIT_LEASES = 50


def _fit_leases(workload_id: int):
    """The workload's leases a placement fit reads: predicted, and measured often enough."""
    return SpeedObservation.objects.filter(
        workload_id=workload_id, predicted_iters_per_s__gt=0, samples__gte=SPEED_MIN_REPORTS
    )


def _unexplained_ratio(measured: float, predicted: float, penalty: float, factor: float) -> float:
    """Measured / predicted speed with the spread's slowdown and the interference the prediction held
    taken out again: what neither placement term explains."""
    return measured / (predicted * max(1.0, penalty) * max(1.0, factor))


def _unpenalised_ratios(workload_id: int, *, spread: bool) -> list[float]:
    """Measured / predicted-without-penalty speed of the workload's latest leases of one kind."""
    leases = _fit_leases(workload_id)
    leases = leases.filter(num_servers__gt=1) if spread else leases.filter(num_servers=1)
    rows = leases.order_by("-at").values_list(
        "measured_iters_per_s", "predicted_iters_per_s", "placement_penalty", "interference_factor"
    )[:PLACEMENT_FIT_LEASES]
    return [_unexplained_ratio(*row) for row in rows]


def placement_penalty_refit(*, workload_id: int) -> float | None:
    """Learn the workload's placement penalty from its measured leases (GENIE's cross-node cost); the
    new penalty, or None while there are too few leases of either kind (nothing changes then)."""
    single = _unpenalised_ratios(workload_id, spread=False)
    spread = _unpenalised_ratios(workload_id, spread=True)
    penalty = fit_placement_penalty(single, spread)
    if penalty is None:
        return None
    Workload.objects.filter(pk=workload_id).update(
        placement_penalty=penalty, placement_penalty_leases=len(single) + len(spread)
    )
    logger.info(
        "workload %s: placement penalty %.3f from %d one-server and %d spread leases",
        workload_id,
        penalty,
        len(single),
        len(spread),
    )
    return penalty


def interference_kappa_refit(*, workload_id: int) -> float | None:
    """Learn the workload's interference kappa (GENIE's 1 + kappa x) from its communicating jobs' latest
    measured leases, alone and next to other communicating jobs; the new kappa, or None while there are
    too few leases of either kind (nothing changes then). Ratios take out the spread's slowdown and the
    interference each prediction held, as the placement fit does."""
    # Only a communicating job is slowed by interference (core.interference).
    leases = _fit_leases(workload_id).filter(job__num_gpus__gt=1)
    rows = leases.order_by("-at").values_list(
        "measured_iters_per_s",
        "predicted_iters_per_s",
        "placement_penalty",
        "interference_factor",
        "colocated_comm_jobs",
    )[: 2 * PLACEMENT_FIT_LEASES]
    alone, together = [], []
    for *observed, colocated in rows:
        ratio = _unexplained_ratio(*observed)
        if colocated:
            together.append((ratio, colocated))
        else:
            alone.append(ratio)
    kappa = fit_interference_kappa(alone, together)
    if kappa is None:
        return None
    Workload.objects.filter(pk=workload_id).update(
        interference_kappa=kappa, interference_kappa_leases=len(alone) + len(together)
    )
    logger.info(
        "workload %s: interference kappa %.3f from %d alone and %d co-located leases",
        workload_id,
        kappa,
        len(alone),
        len(together),
    )
    return kappa


@dataclass(frozen=True)
class StartupMeasurement:
    """A lease's measured start-up (launch to first progress, in the workload's own time)."""

    workload_id: int
    startup_s: float


def workload_startups_learn(measurements: Sequence[StartupMeasurement]) -> int:
    """Fold measured start-ups into their workloads' `startup_s`: the running mean over the measured
    leases (`startup_leases` counts them; the first replaces the profile default). One atomic UPDATE per
    workload measured in the batch (a lease measures once, so batches hold few); returns the workloads
    updated."""
    sums: dict[int, list[float]] = {}
    for m in measurements:
        total = sums.setdefault(m.workload_id, [0.0, 0.0])
        total[0] += m.startup_s
        total[1] += 1
    for workload_id, (total_s, count) in sorted(sums.items()):
        # In the statement, not read-modify-write: two appliers measuring the same workload both count.
        leases = Cast(F("startup_leases"), FloatField())
        Workload.objects.filter(pk=workload_id).update(
            startup_s=(F("startup_s") * leases + Value(total_s)) / (leases + Value(count)),
            startup_leases=F("startup_leases") + int(count),
        )
    return len(sums)
