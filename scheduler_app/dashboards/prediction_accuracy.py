"""Prediction accuracy per workload and placement shape: predicted against measured seconds per iteration."""

from __future__ import annotations

import re
import statistics
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from datetime import datetime
from typing import Any

from django.db.models import Case, F, OuterRef, Q, QuerySet, Subquery, When

from profiles_app.models import GenieFit, SpeedObservation
from profiles_app.selectors import workload_genie_fit
from scheduler_app.dashboards.buckets import Window
from scheduler_app.models import Job

# The newest leases read per request: a dashboard refresh reads at most this many rows, whatever the window.
MAX_OBSERVATIONS = 5000
# The job page refreshes every few seconds: its workload-wide figures read fewer.
JOB_PAGE_MAX_OBSERVATIONS = 2000

Shape = tuple[int, int]  # (num_gpus in all, num_servers)
_CONFIG_KEY = re.compile(r"^n(\d+)k(\d+)b\d+$")  # genie_profiling.config_key: "n2k1b32"


def shape_label(num_gpus: int, num_servers: int) -> str:
    """The shape as users read it: "1 GPU", "4 GPUs, 1 server", "8 GPUs, 2 servers"."""
    if num_gpus == 1 and num_servers == 1:
        return "1 GPU"
    return f"{num_gpus} GPUs, {num_servers} server{'s' if num_servers != 1 else ''}"


@dataclass(frozen=True)
class ShapeAccuracy:
    """Predicted against measured seconds per iteration of one workload on one placement shape.

    `count`: the leases (live) or profiled configurations (at profiling) it rests on, each counted once
    whatever its number of reports or batch size. `predicted_iter_s`, `measured_iter_s`: the medians of
    their seconds per iteration (1 / iterations per second). `error_pct`: the median of their relative
    errors of iteration time, 100 x (measured - predicted) / predicted (positive: slower than predicted);
    `abs_error_pct`: the median of the absolute values. Medians, not means: one broken lease or sample
    must not swing the figure.
    """

    count: int
    predicted_iter_s: float
    measured_iter_s: float
    error_pct: float
    abs_error_pct: float


def summarise(pairs: list[tuple[float, float]]) -> ShapeAccuracy:
    """The ShapeAccuracy of (predicted, measured) seconds-per-iteration pairs (at least one)."""
    errors = [(measured - predicted) / predicted for predicted, measured in pairs]
    return ShapeAccuracy(
        count=len(pairs),
        predicted_iter_s=round(statistics.median(p for p, _ in pairs), 6),
        measured_iter_s=round(statistics.median(m for _, m in pairs), 6),
        error_pct=round(100 * statistics.median(errors), 1) + 0.0,  # + 0.0: never "-0.0"
        abs_error_pct=round(100 * statistics.median(abs(e) for e in errors), 1),
    )


def _with_shape(observations: QuerySet[SpeedObservation]) -> QuerySet[SpeedObservation]:
    """Leases with a usable speed, annotated with the placement's GPUs in all (`shape_gpus`).

    A job spanning servers has one lease per server, each holding its part of the GPUs: the shape of
    such a placement is the job's GPU count (a job gets all its GPUs or none); on one server it is the
    lease's own.
    """
    return observations.filter(predicted_iters_per_s__gt=0, measured_iters_per_s__gt=0).annotate(
        shape_gpus=Case(When(num_servers__gt=1, then=F("job__num_gpus")), default=F("allocation__num_gpus"))
    )


Pairs = dict[tuple[str, Shape], list[tuple[float, float]]]


def _live_rows(shaped: QuerySet[SpeedObservation], *, limit: int | None) -> list[tuple[Any, ...]]:
    """(workload name, shape GPUs, servers, predicted it/s, measured it/s) of the newest leases of
    `shaped` (from _with_shape), at most `limit`."""
    rows = shaped.order_by("-at", "-id").values_list(
        "workload__name", "shape_gpus", "num_servers", "predicted_iters_per_s", "measured_iters_per_s"
    )
    return list(rows if limit is None else rows[:limit])


def _pairs(rows: Iterable[tuple[Any, ...]], *, by_workload: bool = True) -> Pairs:
    """(workload name, or "" when not `by_workload`; shape) -> (predicted, measured) seconds per iteration."""
    pairs: Pairs = defaultdict(list)
    for workload, gpus, servers, predicted, measured in rows:
        pairs[(workload if by_workload else "", (gpus, servers))].append((1 / predicted, 1 / measured))
    return pairs


def _fit_shape(residual: Mapping[str, Any], samples: Mapping[str, Mapping[str, Any]]) -> Shape | None:
    """The placement shape of one profiled configuration: from its sample, else from its key."""
    sample = samples.get(residual.get("config", ""))
    if sample is not None:
        servers, per_server = int(sample["num_servers"]), int(sample["gpus_per_server"])
    else:
        match = _CONFIG_KEY.match(str(residual.get("config", "")))
        if match is None:
            return None
        servers, per_server = int(match[1]), int(match[2])
    return servers * per_server, servers


def profiled_accuracy(fit: GenieFit) -> dict[Shape, ShapeAccuracy]:
    """Shape -> the fit's own residuals: its predicted against measured time of each profiled
    configuration (every batch size of the shape together), at profiling time."""
    samples = {s.get("config", ""): s for s in fit.samples}
    pairs: dict[Shape, list[tuple[float, float]]] = defaultdict(list)
    for residual in fit.residuals:
        shape = _fit_shape(residual, samples)
        predicted, measured = residual.get("predicted_s"), residual.get("measured_s")
        if shape is None or not predicted or not measured or predicted <= 0 or measured <= 0:
            continue
        pairs[shape].append((float(predicted), float(measured)))
    return {shape: summarise(values) for shape, values in pairs.items()}


def _latest_fits() -> list[GenieFit]:
    """Each workload's latest GENIE fit, in one query (one row per fitted workload)."""
    latest = GenieFit.objects.filter(workload=OuterRef("workload")).order_by("-created_at", "-id")
    return list(
        GenieFit.objects.filter(id=Subquery(latest.values("id")[:1]))
        .select_related("workload")
        .only("workload__name", "samples", "residuals", "created_at")
        .order_by()
    )


def _as_json(accuracy: ShapeAccuracy | None) -> dict[str, Any] | None:
    return None if accuracy is None else asdict(accuracy)


def prediction_accuracy_series(*, window: Window, max_observations: int = MAX_OBSERVATIONS) -> dict[str, Any]:
    """Per workload and placement shape, predicted against measured seconds per iteration (ShapeAccuracy).

    `live`: the leases that reported inside the window (last report at or after its start, first before
    its end), the newest `max_observations` of them (`capped` says when there were more); the prediction
    is the one made when the lease was placed. `profiled`: the residuals of the workload's latest GENIE
    fit (docs/genie.md), whatever the window: how well the fit matched its own samples when profiled.
    Rows are sorted by workload, then servers, then GPUs; a row has `live`, `profiled` or both.
    """
    observations = SpeedObservation.objects.filter(at__gte=window.start, first_at__lt=window.end)
    rows = _live_rows(_with_shape(observations), limit=max_observations + 1)
    capped = len(rows) > max_observations
    rows = rows[:max_observations]  # the extra, oldest row only told that there were more
    live = {key: summarise(pairs) for key, pairs in _pairs(rows).items()}
    profiled: dict[tuple[str, Shape], ShapeAccuracy] = {}
    fitted_at: dict[str, datetime] = {}
    for fit in _latest_fits():
        fitted_at[fit.workload.name] = fit.created_at
        for shape, accuracy in profiled_accuracy(fit).items():
            profiled[(fit.workload.name, shape)] = accuracy
    keys = sorted(set(live) | set(profiled), key=lambda k: (k[0], k[1][1], k[1][0]))
    return {
        **window.as_json(),
        "leases": len(rows),
        "capped": capped,
        "max_observations": max_observations,
        "fitted_at": {name: at.isoformat() for name, at in sorted(fitted_at.items())},
        "rows": [
            {
                "workload": name,
                "shape": shape_label(*shape),
                "num_gpus": shape[0],
                "num_servers": shape[1],
                "live": _as_json(live.get((name, shape))),
                "profiled": _as_json(profiled.get((name, shape))),
            }
            for name, shape in keys
        ],
    }


# ---------------------------------------------------------------------------------------------------
# The job page
# ---------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class JobShapeAccuracy:
    """One placement shape the job ran on: its own leases, the workload's, and at profiling."""

    shape: str
    num_gpus: int
    num_servers: int
    job: ShapeAccuracy
    workload: ShapeAccuracy | None
    profiled: ShapeAccuracy | None


@dataclass(frozen=True)
class JobPredictionAccuracy:
    """The job page's accuracy section: one row per shape of the job's reported leases (none: say so)."""

    rows: list[JobShapeAccuracy]
    workload_leases: int  # the workload's leases read for its figures (at most JOB_PAGE_MAX_OBSERVATIONS)
    max_observations: int
    fitted_at: datetime | None  # the GENIE fit whose residuals fill `profiled`; None without one


def _shape_filter(shapes: Iterable[Shape]) -> Q:
    q = Q(pk__in=[])
    for gpus, servers in shapes:
        q |= Q(shape_gpus=gpus, num_servers=servers)
    return q


def job_prediction_accuracy(
    *, job: Job, max_observations: int = JOB_PAGE_MAX_OBSERVATIONS
) -> JobPredictionAccuracy | None:
    """For a catalog job, per shape of its own reported leases: its figures, its workload's over the
    workload's newest `max_observations` leases on those shapes (this job's included), and the residuals
    of the workload's latest GENIE fit on the shape. None for a job that runs its own command."""
    if job.workload_id is None:
        return None
    own = _pairs(
        _live_rows(_with_shape(SpeedObservation.objects.filter(job_id=job.pk)), limit=None), by_workload=False
    )
    shapes = sorted((shape for _, shape in own), key=lambda s: (s[1], s[0]))
    if not shapes:
        return JobPredictionAccuracy(
            rows=[], workload_leases=0, max_observations=max_observations, fitted_at=None
        )
    of_workload = _with_shape(SpeedObservation.objects.filter(workload_id=job.workload_id)).filter(
        _shape_filter(shapes)
    )
    workload_rows = _live_rows(of_workload, limit=max_observations)
    overall = _pairs(workload_rows, by_workload=False)
    fit = workload_genie_fit(job.workload)
    profiled = profiled_accuracy(fit) if fit is not None else {}
    rows = [
        JobShapeAccuracy(
            shape=shape_label(*shape),
            num_gpus=shape[0],
            num_servers=shape[1],
            job=summarise(own[("", shape)]),
            # Absent only when the workload's newest leases are all on its other shapes.
            workload=summarise(overall[("", shape)]) if ("", shape) in overall else None,
            profiled=profiled.get(shape),
        )
        for shape in shapes
    ]
    return JobPredictionAccuracy(
        rows=rows,
        workload_leases=len(workload_rows),
        max_observations=max_observations,
        fitted_at=fit.created_at if fit is not None else None,
    )
