"""Observed speeds: each lease's measured speed next to its prediction, and the corrections they fold into."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db import connection
from django.db.models import F, Sum

from profiles_app.models import SpeedObservation, Workload

logger = logging.getLogger(__name__)


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
