"""The cluster's own recorded job history as a simulator trace, with what really happened to those jobs.

The jobs replay with the cluster's own profiles (profiles_app.selectors.workload_profile: profiled
user workloads too, each with its learnt speed correction), stored with the run so that it replays
the same way later.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict, dataclass, field, replace
from datetime import timedelta
from typing import Any

from cluster_app.models import Server
from profiles_app.selectors import workload_profiles
from scheduler_app.core.types import SensitivityProfile
from scheduler_app.models import Job, JobState, qos_deadline
from scheduler_app.services.forecasts import cluster_time_scale
from scheduler_app.simulator import TraceJob, jct_stats


@dataclass(frozen=True)
class HistoryTrace:
    """Completed jobs as a trace (arrival 0 = the first one's submission) and their real outcome.

    `skipped`: completed jobs the simulator cannot replay (their own command, or a workload without a
    profile); `actual` covers the replayed jobs only, so that both sides compare the same set.
    `profiles`: model name -> the profile its jobs replay with (empty: the shipped catalog's).
    """

    jobs: list[TraceJob]
    skipped: int
    actual: dict[str, Any]
    profiles: dict[str, SensitivityProfile] = field(default_factory=dict)

    def profiles_json(self) -> dict[str, dict[str, Any]]:
        """JSON-ready profiles (the inverse of profiles_from_json)."""
        return {name: asdict(profile) for name, profile in self.profiles.items()}

    def rows(self) -> list[list[Any]]:
        """JSON-ready rows: job_id, model, arrival_s, total_iters, num_gpus, deadline_s, owner_id, and
        min_rate_iters_per_s for a minimum-rate job only (other rows keep the seven columns)."""
        return [
            [j.job_id, j.model, j.arrival_s, j.total_iters, j.num_gpus, j.deadline_s, j.owner_id]
            + ([j.min_rate_iters_per_s] if j.min_rate_iters_per_s is not None else [])
            for j in self.jobs
        ]


def trace_from_rows(rows: list[list[Any]]) -> list[TraceJob]:
    """The inverse of HistoryTrace.rows (a stored run's trace)."""
    # Rows stored before owners were kept have six columns: their jobs replay without one.
    return [
        TraceJob(int(r[0]), str(r[1]), float(r[2]), int(r[3]), int(r[4]), r[5], r[6] if len(r) > 6 else None)
        if len(r) <= 7
        else TraceJob(int(r[0]), str(r[1]), float(r[2]), int(r[3]), int(r[4]), r[5], r[6], None, r[7])
        for r in rows
    ]


def profiles_from_json(data: dict[str, dict[str, Any]]) -> dict[str, SensitivityProfile]:
    """The inverse of HistoryTrace.profiles_json (a stored run's profiles)."""
    out = {}
    for name, p in data.items():
        out[name] = SensitivityProfile(
            **{
                **p,
                "cpu_per_gpu_grid": tuple(float(c) for c in p["cpu_per_gpu_grid"]),
                "mem_gb_per_gpu_grid": tuple(float(m) for m in p["mem_gb_per_gpu_grid"]),
                "tput": tuple(tuple(float(v) for v in row) for row in p["tput"]),
            }
        )
    return out


def history_trace(*, max_jobs: int) -> HistoryTrace:
    """The `max_jobs` most recently submitted COMPLETED jobs, oldest first, as a trace.

    In the jobs' own time, as the simulator plays them with their profiles: on fake nodes that run
    their jobs faster than wall time (the demo's agents, `--time-scale 0.05`: 20 times), every
    recorded time (arrivals, deadlines, what happened) is the wall time over the cluster's time
    scale, so that the replay and what happened compare; on real nodes the scale is 1."""
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
            "workload_id",
            "owner_id",
            "qos_min_rate_iters_per_s",
        )[:max_jobs]
    )
    by_id = workload_profiles(ids={r[8] for r in rows if r[8] is not None})
    profiles = {w.name: p for w, p in by_id.values() if p is not None}
    replayable = [r[:8] + r[9:] for r in rows if r[1] in profiles]
    replayable.reverse()
    if not replayable:
        return HistoryTrace(jobs=[], skipped=len(rows), actual={"jobs": 0})
    t0 = min(r[2] for r in replayable)
    scale = cluster_time_scale(list(Server.objects.all()))

    def own_s(delta: timedelta) -> float:
        return delta.total_seconds() / scale

    jobs = []
    for row in replayable:
        job_id, model, submitted_at, _, total_iters, num_gpus, deadline_at, max_latency_s, owner, rate = row
        arrival_s = own_s(submitted_at - t0)
        deadline = qos_deadline(submitted_at, deadline_at, max_latency_s)
        deadline_s = None if deadline is None else own_s(deadline - t0)
        # The owner too, so that a what-if under fair share replays who submitted what.
        job = TraceJob(job_id, model, arrival_s, total_iters, num_gpus, deadline_s, owner)
        jobs.append(replace(job, min_rate_iters_per_s=rate) if rate is not None else job)
    jct = jct_stats([own_s(r[3] - r[2]) for r in replayable])  # the simulator's own figures
    makespan_h = own_s(max(r[3] for r in replayable) - t0) / 3600
    qos = [(j, r[3]) for j, r in zip(jobs, replayable, strict=True) if j.deadline_s is not None]
    met = sum(own_s(finished - t0) <= j.deadline_s for j, finished in qos)
    actual = {
        "time_scale": scale,
        "jobs": len(jobs),
        "avg_jct_h": jct.avg_h,
        "median_jct_h": jct.median_h,
        "p99_jct_h": jct.p99_h,
        "makespan_h": makespan_h,
        "qos_jobs": len(qos),
        "qos_pct": 100.0 * met / len(qos) if qos else None,
    }
    used = {j.model for j in jobs}
    return HistoryTrace(
        jobs=jobs,
        skipped=len(rows) - len(replayable),
        actual=actual,
        profiles={name: p for name, p in profiles.items() if name in used},
    )


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
