"""Placement terms learnt from observed speeds: each workload's placement penalty and interference kappa."""

from __future__ import annotations

import logging

from profiles_app.models import SpeedObservation, Workload
from profiles_app.services.speeds import SPEED_MIN_REPORTS
from scheduler_app.core.predictor import fit_interference_kappa, fit_placement_penalty

logger = logging.getLogger(__name__)

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
