"""What-if runs: record one (a generated trace or a snapshot of the recorded history), run it, start it."""

from __future__ import annotations

import logging
import threading
from typing import Any

from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone

from infra.task_send import task_send
from scheduler_app.conf import scheduler_conf
from scheduler_app.dashboards.history import HistoryTrace, profiles_from_json, trace_from_rows
from scheduler_app.models import SimulationRun, SimulationStatus
from scheduler_app.services.simulations import (
    SimulationRequest,
    simulation_run_create,
    simulation_run_execute,
)
from scheduler_app.task_names import SIMULATION_RUN_TASK

logger = logging.getLogger(__name__)

TRACE_GENERATED = "generated"
TRACE_HISTORY = "history"


def whatif_run_create(
    *, request: SimulationRequest, history: HistoryTrace | None = None, created_by: Any = None
) -> SimulationRun:
    """Record a queued what-if run. A history run stores its trace and the real outcome with it, so
    that it replays (and compares against) exactly the jobs recorded when it was asked for."""
    extra: dict[str, Any] = {"trace_source": TRACE_GENERATED}
    if history is not None:
        extra = {
            "trace_source": TRACE_HISTORY,
            "history_trace": history.rows(),
            "history_skipped": history.skipped,
            "history_profiles": history.profiles_json(),
            "actual": history.actual,
        }
    request = SimulationRequest(**{**request.to_json(), "extra": extra})
    return simulation_run_create(request=request, created_by=created_by)


def whatif_run_execute(*, run_id: int) -> SimulationRun | None:
    """Run a queued what-if run; None if another worker already claimed it (a redelivered task)."""
    # A conditional update claims the run, so that a task delivered twice runs it once.
    claimed = SimulationRun.objects.filter(pk=run_id, status=SimulationStatus.QUEUED).update(
        status=SimulationStatus.RUNNING, started_at=timezone.now()
    )
    if not claimed:
        return None
    run = SimulationRun.objects.get(pk=run_id)
    extra = run.parameters.get("extra") or {}
    trace = catalog = None
    try:
        if extra.get("trace_source") == TRACE_HISTORY:
            trace = trace_from_rows(extra["history_trace"])
            # Runs stored before profiles were stored with them replay on the shipped catalog.
            catalog = profiles_from_json(extra["history_profiles"]) if extra.get("history_profiles") else None
    except (KeyError, IndexError, TypeError, ValueError) as exc:
        # A stored trace that cannot be read must not leave the run RUNNING for ever.
        SimulationRun.objects.filter(pk=run_id).update(
            status=SimulationStatus.FAILED,
            error=f"stored trace unreadable: {exc}",
            finished_at=timezone.now(),
        )
        raise
    return simulation_run_execute(run=run, trace=trace, catalog=catalog)


def _execute_in_thread(run_id: int) -> None:
    try:
        whatif_run_execute(run_id=run_id)
    except Exception:  # recorded on the run by simulation_run_execute; keep the thread quiet
        logger.exception("what-if run %s failed", run_id)
    finally:
        connection.close()


def whatif_run_dispatch(*, run: SimulationRun) -> None:
    """Start the run once the transaction that created it commits: on a Celery worker, or, in the
    embedded mode without a worker (inline rounds), on a background thread of this process."""

    def start() -> None:
        if settings.CELERY_TASK_ALWAYS_EAGER:
            task_send(SIMULATION_RUN_TASK, args=(run.pk,))  # runs it here, before this returns
        elif scheduler_conf().inline_rounds:
            threading.Thread(target=_execute_in_thread, args=(run.pk,), daemon=True).start()
        else:
            task_send(SIMULATION_RUN_TASK, args=(run.pk,))

    transaction.on_commit(start)
