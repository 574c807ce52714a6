"""Simulation services: record a SimulationRun and execute it (the comparison itself: simulator.compare)."""

from __future__ import annotations

from collections.abc import Mapping

from django.db import transaction
from django.utils import timezone

from scheduler_app.core.types import SensitivityProfile
from scheduler_app.models import SimulationRun, SimulationStatus
from scheduler_app.simulator import TraceJob

# The comparison is framework-free (python -m scheduler_app.simulator runs it without Django); these
# names stay importable from here for the web, the dashboards and the management command.
from scheduler_app.simulator.compare import (  # noqa: F401
    BASELINE_ALLOCATOR,
    WORKLOADS,
    SimulationRequest,
    SimulationRequestError,
    simulation_compare,
    simulation_request_validate,
    simulation_trace_build,
)


def simulation_run_create(*, request: SimulationRequest, created_by=None) -> SimulationRun:
    """Record a queued simulation (validated first, so a stored run can always be executed)."""
    simulation_request_validate(request)
    return SimulationRun.objects.create(created_by=created_by, parameters=request.to_json())


def simulation_run_execute(
    *,
    run: SimulationRun,
    trace: list[TraceJob] | None = None,
    catalog: Mapping[str, SensitivityProfile] | None = None,
) -> SimulationRun:
    """Run a stored simulation, saving progress as it goes and the results (or the error) at the end."""
    params = dict(run.parameters)
    for key in ("policies", "allocators", "class_split"):
        if params.get(key) is not None:
            params[key] = tuple(params[key])
    if params.get("measured_job_ids") is not None:
        params["measured_job_ids"] = tuple(params["measured_job_ids"])
    request = SimulationRequest(**params)
    SimulationRun.objects.filter(pk=run.pk).update(status=SimulationStatus.RUNNING, started_at=timezone.now())
    combos = len(request.policies) * len(request.allocators)
    # Each run's fraction: the runs may run at once (simulation_compare's worker processes), so the
    # whole is their sum, not the finished runs plus the current one's.
    fractions: dict[tuple[str, str], float] = {}
    last_saved = [0.0]

    def on_progress(policy: str, allocator: str, fraction: float) -> None:
        fractions[(policy, allocator)] = fraction
        overall = min(1.0, sum(fractions.values()) / combos)
        # Called up to once per finished job: save only every whole percent to spare the database.
        if overall - last_saved[0] >= 0.01:
            last_saved[0] = overall
            SimulationRun.objects.filter(pk=run.pk).update(progress=overall)

    try:
        runs = simulation_compare(request, trace=trace, catalog=catalog, progress=on_progress)
    except Exception as exc:  # the run records any failure; nothing is lost silently
        with transaction.atomic():
            SimulationRun.objects.filter(pk=run.pk).update(
                status=SimulationStatus.FAILED, error=str(exc), finished_at=timezone.now()
            )
        raise
    SimulationRun.objects.filter(pk=run.pk).update(
        status=SimulationStatus.SUCCEEDED, progress=1.0, results={"runs": runs}, finished_at=timezone.now()
    )
    run.refresh_from_db()
    return run
