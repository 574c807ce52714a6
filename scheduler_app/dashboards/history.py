"""The cluster's own recorded job history as a simulator trace, with what really happened to those jobs."""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass
from typing import Any

from cluster_app.models import Server
from profiles_app.catalog import load_catalog
from scheduler_app.models import Job, JobState, qos_deadline
from scheduler_app.simulator import TraceJob


@dataclass(frozen=True)
class HistoryTrace:
    """Completed jobs as a trace (arrival 0 = the first one's submission) and their real outcome.

    `skipped`: completed jobs the simulator cannot replay (their own command, or a workload that is
    not in the catalog); `actual` covers the replayed jobs only, so that both sides compare the same set.
    """

    jobs: list[TraceJob]
    skipped: int
    actual: dict[str, Any]

    def rows(self) -> list[list[Any]]:
        """JSON-ready rows: job_id, model, arrival_s, total_iters, num_gpus, deadline_s."""
        return [[j.job_id, j.model, j.arrival_s, j.total_iters, j.num_gpus, j.deadline_s] for j in self.jobs]


def trace_from_rows(rows: list[list[Any]]) -> list[TraceJob]:
    """The inverse of HistoryTrace.rows (a stored run's trace)."""
    return [TraceJob(int(r[0]), str(r[1]), float(r[2]), int(r[3]), int(r[4]), r[5]) for r in rows]


def _percentile(sorted_values: list[float], q: float) -> float | None:
    if not sorted_values:
        return None
    pos = q * (len(sorted_values) - 1)
    lo, hi = math.floor(pos), math.ceil(pos)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)


def history_trace(*, max_jobs: int) -> HistoryTrace:
    """The `max_jobs` most recently submitted COMPLETED jobs, oldest first, as a trace."""
    catalog = load_catalog()
    rows = list(
        Job.objects.filter(state=JobState.COMPLETED, finished_at__isnull=False)
        .order_by("-submitted_at", "-id")
        .values_list(
            "id",
            "workload__name",
            "submitted_at",
            "finished_at",
            "total_iters",
            "num_gpus",
            "qos_deadline_at",
            "qos_max_latency_s",
        )[:max_jobs]
    )
    replayable = [r for r in rows if r[1] in catalog]
    replayable.reverse()
    if not replayable:
        return HistoryTrace(jobs=[], skipped=len(rows), actual={"jobs": 0})
    t0 = min(r[2] for r in replayable)
    jobs = []
    for job_id, model, submitted_at, _, total_iters, num_gpus, deadline_at, max_latency_s in replayable:
        arrival_s = (submitted_at - t0).total_seconds()
        deadline = qos_deadline(submitted_at, deadline_at, max_latency_s)
        deadline_s = None if deadline is None else (deadline - t0).total_seconds()
        jobs.append(TraceJob(job_id, model, arrival_s, total_iters, num_gpus, deadline_s))
    jct_h = sorted((r[3] - r[2]).total_seconds() / 3600 for r in replayable)
    makespan_h = (max(r[3] for r in replayable) - t0).total_seconds() / 3600
    qos = [(j, r[3]) for j, r in zip(jobs, replayable, strict=True) if j.deadline_s is not None]
    met = sum((finished - t0).total_seconds() <= j.deadline_s for j, finished in qos)
    actual = {
        "jobs": len(jobs),
        "avg_jct_h": sum(jct_h) / len(jct_h),
        "median_jct_h": _percentile(jct_h, 0.5),
        "p99_jct_h": _percentile(jct_h, 0.99),
        "makespan_h": makespan_h,
        "qos_jobs": len(qos),
        "qos_pct": 100.0 * met / len(qos) if qos else None,
    }
    return HistoryTrace(jobs=jobs, skipped=len(rows) - len(replayable), actual=actual)


def live_cluster_shape() -> dict[str, float] | None:
    """The live cluster as the simulator's homogeneous ClusterSpec: server count and the commonest shape."""
    shapes = Counter(Server.objects.values_list("num_gpus", "num_cpus", "mem_gb"))
    if not shapes:
        return None
    (gpus, cpus, mem_gb), _ = shapes.most_common(1)[0]
    return {
        "servers": sum(shapes.values()),
        "gpus_per_server": gpus,
        "cpus_per_server": cpus,
        "mem_gb_per_server": mem_gb,
    }
