"""Dashboard reads: utilisation, JCT, QoS and queue series over a time window, aggregated in the database.

What-if runs are read in whatif_selectors.py.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass
from datetime import datetime
from functools import partial
from typing import Any

from django.db.models import (
    Avg,
    Count,
    DurationField,
    ExpressionWrapper,
    F,
    Max,
    OuterRef,
    Q,
    Subquery,
    Sum,
    Value,
)
from django.db.models.functions import Coalesce, TruncWeek

from cluster_app.models import ClusterUsageMinute, Server
from profiles_app.selectors import measured_iters_per_s_by_job
from scheduler_app.conf import scheduler_conf
from scheduler_app.dashboards.bucket_cache import bucket_values
from scheduler_app.dashboards.buckets import MAX_POINTS, EpochBucket, Window
from scheduler_app.models import (
    AdmissionPrediction,
    Allocation,
    Job,
    JobState,
    SchedulingRound,
    qos_deadline,
)

NO_TEAM = "(no team)"
# A rate exactly at its target must not miss it by a floating-point rounding (services/admission_judge.py).
RATE_REL_TOL = 1e-9
OWN_COMMANDS = "(own commands)"


def _pct(numerator: float | None, denominator: float | None) -> float | None:
    if numerator is None or not denominator:
        return None
    return round(100.0 * numerator / denominator, 3)


def _capacity() -> dict[str, float]:
    """Cluster totals now: GPUs, CPU cores, memory GB (the denominators of allocated shares)."""
    totals = Server.objects.aggregate(gpus=Sum("num_gpus"), cpus=Sum("num_cpus"), mem_gb=Sum("mem_gb"))
    return {key: float(value or 0) for key, value in totals.items()}


# ---------------------------------------------------------------------------------------------------
# Utilisation
# ---------------------------------------------------------------------------------------------------


def _allocated_seconds(window: Window) -> dict[str, list[float]]:
    """Per bucket, resource-seconds held by allocations: GPU-s, core-s and GB-s.

    Allocations are intervals, not samples: each one adds its overlap with every bucket it spans,
    weighted by what it holds. Only the leases overlapping the window are read (thousands, not
    millions, of rows), so this integration is done here rather than in SQL.
    """
    n = window.num_buckets
    totals = {"gpu": [0.0] * n, "cpu": [0.0] * n, "mem": [0.0] * n}
    leases = (
        Allocation.objects.filter(started_at__lt=window.end)
        .filter(Q(ended_at__isnull=True) | Q(ended_at__gt=window.start))
        .order_by()
        .values_list("started_at", "ended_at", "num_gpus", "num_cpus", "mem_gb")
    )
    base_s = window.start.timestamp()
    end_s = window.end.timestamp()
    width = window.bucket_s
    for started_at, ended_at, num_gpus, num_cpus, mem_gb in leases:
        lo = max(started_at.timestamp(), base_s)
        hi = min(ended_at.timestamp() if ended_at is not None else end_s, end_s)
        if hi <= lo:
            continue
        first, last = int((lo - base_s) // width), min(n - 1, int((hi - base_s) // width))
        for i in range(first, last + 1):
            overlap = min(hi, base_s + (i + 1) * width) - max(lo, base_s + i * width)
            if overlap > 0:
                totals["gpu"][i] += overlap * num_gpus
                totals["cpu"][i] += overlap * num_cpus
                totals["mem"][i] += overlap * mem_gb
    return totals


def _measured_by_bucket(
    bucket_s: int, start: datetime, end: datetime
) -> dict[int, tuple[float | None, float | None, float | None]]:
    """Epoch bucket index -> (GPU %, CPU %, memory %) measured in the minutes of [start, end).

    Reads the per-minute cluster sums (cluster_app's ClusterUsageMinute: a week is 10,080 rows, not
    the millions of samples) and reproduces the per-sample formulas exactly, as sums of sums:
    GPU = sum(util) / GPU samples; CPU = sum(util x cores) / sum(cores) over the server samples;
    memory = sum(used GB) / sum(the sampled servers' GB). Bucket widths are whole minutes.
    """
    rows = (
        ClusterUsageMinute.objects.filter(minute__gte=start, minute__lt=end)
        .annotate(bucket=EpochBucket("minute", bucket_s))
        .values("bucket")
        .annotate(
            gpu_samples=Sum("gpu_samples"),
            gpu_util=Sum("gpu_util_pct_sum"),
            cpu_weighted=Sum("cpu_util_pct_cores_sum"),
            cpus=Sum("cpu_cores_sum"),
            mem_used_gb=Sum("mem_used_gb_sum"),
            mem_gb=Sum("mem_capacity_gb_sum"),
        )
        .order_by("bucket")
    )
    return {
        row["bucket"]: (
            row["gpu_util"] / row["gpu_samples"] if row["gpu_samples"] else None,
            row["cpu_weighted"] / row["cpus"] if row["cpus"] else None,
            _pct(row["mem_used_gb"], row["mem_gb"]),
        )
        for row in rows
    }


def utilisation_series(*, window: Window) -> dict[str, Any]:
    """GPU, CPU and memory use per bucket, in % of the cluster: allocated and measured.

    - allocated: resource-seconds held by allocations in the bucket / (capacity x bucket seconds);
    - measured GPU: mean NVML utilisation over the GPU samples in the bucket;
    - measured CPU: core-weighted mean of the servers' CPU utilisation samples;
    - measured memory: sum of used GB over sum of the sampled servers' GB, over the bucket's samples.
    The measured values come from the per-minute cluster sums (_measured_by_bucket), not the samples.
    Buckets without samples are null (a gap in the chart, not a zero). Measured values of closed
    buckets come from the bucket cache (bucket_cache.py): a refresh reads only the newest minutes.
    """
    capacity = _capacity()
    measured = bucket_values("measured", window, partial(_measured_by_bucket, window.bucket_s))
    gpu_measured = {pos: v[0] for pos, v in measured.items()}
    cpu_measured = {pos: v[1] for pos, v in measured.items()}
    mem_measured = {pos: v[2] for pos, v in measured.items()}
    held = _allocated_seconds(window)
    n = window.num_buckets
    spans = [window.bucket_span_s(i) for i in range(n)]

    def allocated(kind: str, cap: float) -> list[float | None]:
        return [_pct(held[kind][i], cap * spans[i]) for i in range(n)]

    def rounded(values: dict[int, float | None]) -> list[float | None]:
        return [None if values.get(i) is None else round(values[i], 3) for i in range(n)]

    return {
        **window.as_json(),
        "t": [t.isoformat() for t in window.bucket_starts()],
        "capacity": capacity,
        "gpu": {"allocated_pct": allocated("gpu", capacity["gpus"]), "measured_pct": rounded(gpu_measured)},
        "cpu": {"allocated_pct": allocated("cpu", capacity["cpus"]), "measured_pct": rounded(cpu_measured)},
        "mem": {"allocated_pct": allocated("mem", capacity["mem_gb"]), "measured_pct": rounded(mem_measured)},
    }


# ---------------------------------------------------------------------------------------------------
# Job completion time
# ---------------------------------------------------------------------------------------------------

JCT = ExpressionWrapper(F("finished_at") - F("submitted_at"), output_field=DurationField())


def _completed_in(window: Window):  # type: ignore[no-untyped-def]
    return Job.objects.filter(
        state=JobState.COMPLETED, finished_at__gte=window.start, finished_at__lt=window.end
    ).order_by()


def _downsample(values: list[float], max_points: int) -> tuple[list[float], list[float]]:
    """Points (x, cumulative fraction) of the empirical CDF of sorted `values`, at most `max_points`."""
    n = len(values)
    if n <= max_points:
        picks = range(n)
    else:
        # Evenly spaced ranks, always keeping the first and the last (min and max).
        picks = sorted({round(k * (n - 1) / (max_points - 1)) for k in range(max_points)})
    return [values[i] for i in picks], [round((i + 1) / n, 6) for i in picks]


def _quantile(sorted_values: list[float], q: float) -> float | None:
    """Linear-interpolated quantile (0..1) of sorted values; None when empty."""
    if not sorted_values:
        return None
    pos = q * (len(sorted_values) - 1)
    lo, hi = math.floor(pos), math.ceil(pos)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)


def _last_round_field(field: str) -> Subquery:
    """`field` of the round that started the job's last allocation (placed by a recorded round)."""
    latest = Allocation.objects.filter(job=OuterRef("pk"), round__isnull=False).order_by("-started_at", "-id")
    return Subquery(latest.values(field)[:1])


def jct_series(*, window: Window, max_points: int = MAX_POINTS) -> dict[str, Any]:
    """The JCT (submission to completion) of the jobs COMPLETED in the window: CDF, summary, averages.

    A job's policy/allocator is that of the round that started its last allocation; jobs never
    placed by a recorded round get the configured ones.
    """
    conf = scheduler_conf()
    durations = list(_completed_in(window).annotate(jct=JCT).order_by("jct").values_list("jct", flat=True))
    jct_h = [d.total_seconds() / 3600 for d in durations]
    cdf_x, cdf_y = _downsample(jct_h, max_points)
    by_week = (
        _completed_in(window)
        .annotate(
            week=TruncWeek("finished_at"),
            policy=Coalesce(_last_round_field("round__policy"), Value(conf.policy)),
            allocator=Coalesce(_last_round_field("round__allocator"), Value(conf.allocator)),
        )
        .values("week", "policy", "allocator")
        .annotate(avg_jct=Avg(JCT), jobs=Count("id"))
        .order_by("week", "policy", "allocator")
    )
    weeks = sorted({row["week"] for row in by_week})
    series: dict[str, dict[str, Any]] = {}
    for row in by_week:
        label = f"{row['policy']}/{row['allocator']}"
        entry = series.setdefault(label, {"avg_jct_h": [None] * len(weeks), "jobs": [0] * len(weeks)})
        pos = weeks.index(row["week"])
        entry["avg_jct_h"][pos] = round(row["avg_jct"].total_seconds() / 3600, 6)
        entry["jobs"][pos] = row["jobs"]
    return {
        **window.as_json(),
        "jobs": len(jct_h),
        "avg_jct_h": round(sum(jct_h) / len(jct_h), 6) if jct_h else None,
        "p50_jct_h": _quantile(jct_h, 0.5),
        "p99_jct_h": _quantile(jct_h, 0.99),
        "cdf": {"jct_h": cdf_x, "fraction": cdf_y},
        "by_week": {"weeks": [w.date().isoformat() for w in weeks], "series": series},
    }


# ---------------------------------------------------------------------------------------------------
# QoS guarantees
# ---------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class QosOutcome:
    """A QoS job whose guarantee is decided: met or missed, when that became known, its team."""

    decided_at: datetime
    met: bool
    team: str


def _min_rate_outcomes(*, window: Window) -> list[QosOutcome]:
    """The minimum-rate jobs decided inside the window: those that COMPLETED in it, met when their
    measured rate (their leases' reports, profiles_app's measured_iters_per_s_by_job) is at least
    their target. A job that ended otherwise, or reported no speed, is left out."""
    rows = list(
        Job.objects.filter(
            qos_min_rate_iters_per_s__isnull=False,
            state=JobState.COMPLETED,
            finished_at__gte=window.start,
            finished_at__lt=window.end,
        )
        .order_by()
        .values_list("pk", "finished_at", "qos_min_rate_iters_per_s", "team__name")
    )
    rates = measured_iters_per_s_by_job(job_ids=[row[0] for row in rows])
    return [
        QosOutcome(finished_at, rates[pk] >= target * (1 - RATE_REL_TOL), team or NO_TEAM)
        for pk, finished_at, target, team in rows
        if pk in rates
    ]


def _rate_per_bucket(outcomes: list[QosOutcome], window: Window) -> dict[str, Any]:
    """Met and decided per bucket of `window`, their rate in percent, and the overall rate."""
    n = window.num_buckets
    met, total = [0] * n, [0] * n
    base_s = window.start.timestamp()
    for o in outcomes:
        i = min(n - 1, int((o.decided_at.timestamp() - base_s) // window.bucket_s))
        total[i] += 1
        met[i] += o.met
    return {
        "met": met,
        "decided": total,
        "rate_pct": [_pct(m, d) for m, d in zip(met, total, strict=True)],
        "overall_pct": _pct(sum(met), sum(total)),
    }


def _qos_outcomes(*, window: Window) -> list[QosOutcome]:
    """The QoS jobs decided inside the window.

    A job's deadline is `qos_deadline_at`, or `submitted_at + qos_max_latency_s`. It is met when it
    COMPLETED by then (decided when it finished), missed when the deadline passed first (decided at
    the deadline, whether it finished late or is still unfinished). Jobs that ended otherwise
    (failed, cancelled...) before their deadline are left out: the user or the job ended them. The
    rule branches per job, and only QoS jobs of the window are read, so it is applied here.
    """
    rows = (
        Job.objects.filter(Q(qos_deadline_at__isnull=False) | Q(qos_max_latency_s__isnull=False))
        .filter(submitted_at__lt=window.end)
        .filter(Q(finished_at__isnull=True) | Q(finished_at__gte=window.start))
        .order_by()
        .values_list(
            "submitted_at", "finished_at", "state", "qos_deadline_at", "qos_max_latency_s", "team__name"
        )
    )
    outcomes = []
    for submitted_at, finished_at, state, deadline_at, max_latency_s, team in rows:
        deadline = qos_deadline(submitted_at, deadline_at, max_latency_s)
        if finished_at is not None and finished_at <= deadline:
            if state != JobState.COMPLETED:
                continue
            decided_at, met = finished_at, True
        elif deadline < window.end:
            decided_at, met = deadline, False
        else:
            continue  # still running or queued, with time left
        if window.start <= decided_at < window.end:
            outcomes.append(QosOutcome(decided_at, met, team or NO_TEAM))
    return outcomes


def qos_series(*, window: Window) -> dict[str, Any]:
    """QoS-guarantee rate (% of decided QoS jobs that met their target) per bucket and per team, for
    the deadline kind (deadline or maximum latency); `min_rate`: the same per bucket for the
    minimum-rate kind, apart (its guarantee is a speed, not a time)."""
    outcomes = _qos_outcomes(window=window)
    teams: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for o in outcomes:
        teams[o.team][0] += o.met
        teams[o.team][1] += 1
    team_names = sorted(teams)
    return {
        **window.as_json(),
        "t": [t.isoformat() for t in window.bucket_starts()],
        **_rate_per_bucket(outcomes, window),
        "min_rate": _rate_per_bucket(_min_rate_outcomes(window=window), window),
        "teams": {
            "team": team_names,
            "met": [teams[t][0] for t in team_names],
            "decided": [teams[t][1] for t in team_names],
            "rate_pct": [_pct(teams[t][0], teams[t][1]) for t in team_names],
        },
    }


# ---------------------------------------------------------------------------------------------------
# Admission accuracy
# ---------------------------------------------------------------------------------------------------


def _hours(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds / 3600, 4)


def admission_accuracy_series(*, window: Window) -> dict[str, Any]:
    """How right the admission forecasts were, for the jobs that completed inside the window.

    Finish error = actual finish - predicted finish (positive: later than promised). Per bucket (of
    the actual finish): the median absolute error and the mean signed error, in hours; per workload
    (own commands together): the same and the workload's current speed correction. `verdicts`: of the
    QoS jobs, how often "attainable" at submission matched whether the deadline was met.
    """
    rows = (
        AdmissionPrediction.objects.filter(
            job__state=JobState.COMPLETED,
            predicted_finish_at__isnull=False,
            actual_finish_at__gte=window.start,
            actual_finish_at__lt=window.end,
        )
        .order_by()
        .values_list(
            "actual_finish_at",
            "predicted_finish_at",
            "attainable",
            "met_deadline",
            "job__workload__name",
            "job__workload__speed_correction",
            "job__workload__placement_penalty",
        )
    )
    n = window.num_buckets
    base_s = window.start.timestamp()
    by_bucket: list[list[float]] = [[] for _ in range(n)]
    by_workload: dict[str, list[float]] = defaultdict(list)
    corrections: dict[str, float | None] = {}
    penalties: dict[str, float | None] = {}
    verdicts = right = 0
    for actual, predicted, attainable, met, workload, correction, penalty in rows:
        error_s = (actual - predicted).total_seconds()
        by_bucket[min(n - 1, int((actual.timestamp() - base_s) // window.bucket_s))].append(error_s)
        name = workload or OWN_COMMANDS
        by_workload[name].append(error_s)
        corrections[name] = None if workload is None else round(correction, 4)
        penalties[name] = None if workload is None else round(penalty, 4)
        if attainable is not None and met is not None:
            verdicts += 1
            right += attainable == met

    def median_abs_h(errors: list[float]) -> float | None:
        return _hours(_quantile(sorted(abs(e) for e in errors), 0.5))

    def mean_h(errors: list[float]) -> float | None:
        return _hours(sum(errors) / len(errors)) if errors else None

    every = [e for errors in by_bucket for e in errors]
    names = sorted(by_workload)
    return {
        **window.as_json(),
        "t": [t.isoformat() for t in window.bucket_starts()],
        "jobs": [len(errors) for errors in by_bucket],
        "median_abs_error_h": [median_abs_h(errors) for errors in by_bucket],
        "mean_error_h": [mean_h(errors) for errors in by_bucket],
        "overall": {
            "jobs": len(every),
            "median_abs_error_h": median_abs_h(every),
            "p90_abs_error_h": _hours(_quantile(sorted(abs(e) for e in every), 0.9)),
            "mean_error_h": mean_h(every),
            "verdicts": verdicts,
            "verdicts_right_pct": _pct(right, verdicts),
        },
        "workloads": {
            "workload": names,
            "jobs": [len(by_workload[w]) for w in names],
            "median_abs_error_h": [median_abs_h(by_workload[w]) for w in names],
            "mean_error_h": [mean_h(by_workload[w]) for w in names],
            "speed_correction": [corrections[w] for w in names],
            "placement_penalty": [penalties[w] for w in names],
        },
    }


# ---------------------------------------------------------------------------------------------------
# Queue
# ---------------------------------------------------------------------------------------------------


def queue_series(*, window: Window) -> dict[str, Any]:
    """Jobs waiting (pending + infeasible) and running after each scheduling round, per bucket.

    The rounds are the scheduler's own record of its queue: each stores how many jobs it left
    waiting and how many it placed. Per bucket: the mean and the peak waiting, the mean running.
    """
    rows = (
        SchedulingRound.objects.filter(started_at__gte=window.start, started_at__lt=window.end)
        .annotate(
            bucket=EpochBucket("started_at", window.bucket_s), waiting=F("num_pending") + F("num_infeasible")
        )
        .values("bucket")
        .annotate(
            avg_waiting=Avg("waiting"),
            max_waiting=Max("waiting"),
            avg_running=Avg("num_placed"),
            rounds=Count("id"),
        )
        .order_by("bucket")
    )
    by_pos = {row["bucket"] - window.first_index: row for row in rows}
    n = window.num_buckets

    def column(key: str) -> list[float | None]:
        return [None if i not in by_pos else round(float(by_pos[i][key]), 3) for i in range(n)]

    return {
        **window.as_json(),
        "t": [t.isoformat() for t in window.bucket_starts()],
        "avg_waiting": column("avg_waiting"),
        "max_waiting": column("max_waiting"),
        "avg_running": column("avg_running"),
        "rounds": [by_pos[i]["rounds"] if i in by_pos else 0 for i in range(n)],
    }
