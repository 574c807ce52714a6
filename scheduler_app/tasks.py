"""Thin Celery tasks, named in task_names.py: each calls one service (beat schedule in settings)."""

import logging

from celery import shared_task

from cluster_app.services import usage_samples_rollup
from scheduler_app.dashboards.services import whatif_run_execute
from scheduler_app.services.admission_worker import admission_forecasts_serve
from scheduler_app.services.agents import agent_reports_prune
from scheduler_app.services.forecast_refresh import job_forecasts_refresh_run
from scheduler_app.services.idempotency import idempotency_keys_prune
from scheduler_app.services.job_end import job_end_followups_run
from scheduler_app.services.nodes import periodic_sweep_run
from scheduler_app.services.profiling import profiling_run_dispatch
from scheduler_app.services.report_ingest import agent_reports_apply_run
from scheduler_app.services.round_requests import (
    scheduling_round_put_off,
    scheduling_round_request,
    scheduling_round_request_clear,
)
from scheduler_app.services.rounds import round_decisions_prune, scheduling_round_run
from scheduler_app.task_names import (
    ADMISSION_FORECAST_TASK,
    AGENT_REPORTS_APPLY_TASK,
    FORECAST_REFRESH_TASK,
    NODE_LIVENESS_SWEEP_TASK,
    SCHEDULING_ROUND_TASK,
    SIMULATION_RUN_TASK,
    USAGE_ROLLUP_TASK,
    WORKLOAD_PROFILE_TASK,
)

logger = logging.getLogger(__name__)


@shared_task(name=SCHEDULING_ROUND_TASK, ignore_result=True)
def scheduling_round_task(trigger: str = "beat") -> int | None:
    """One scheduling round; returns its id, or None when another round held the lock or an early
    round was put off until the last round's pace ends (services/round_requests.py)."""
    if trigger != "beat":
        if scheduling_round_put_off(trigger=trigger):
            return None  # queued again for the end of the last round's pace
        # An early round is starting: let the next submission or job end queue another one.
        scheduling_round_request_clear()
    sround = scheduling_round_run(trigger=trigger)
    if sround is None and trigger != "beat":
        # Another round held the lock (rounds on two worker processes): it may have read the queue
        # before the change that asked for this one committed, so ask again rather than leave that
        # change (a job's end, its freed GPUs) to the next beat round, up to ATTUNE_ROUND_S away.
        scheduling_round_request(trigger=trigger)
    return sround.pk if sround is not None else None


@shared_task(name=NODE_LIVENESS_SWEEP_TASK, ignore_result=True)
def node_liveness_sweep_task() -> dict[str, list]:
    """Every few seconds: mark silent nodes, and end jobs past their time limit (TIMEOUT)."""
    return periodic_sweep_run()


@shared_task(name=AGENT_REPORTS_APPLY_TASK, ignore_result=True)
def agent_reports_apply_task() -> int:
    """Every ATTUNE_PROGRESS_APPLY_S, and at once when a sync asks: apply the agent reports that syncs
    stored and left pending (services/report_ingest.py), then the follow-ups of the jobs that ended
    meanwhile (services/job_end.py: after the reports, so that a job's last measured speeds are in);
    returns how many reports were applied."""
    applied = agent_reports_apply_run()
    job_end_followups_run()
    return applied


@shared_task(name=USAGE_ROLLUP_TASK, ignore_result=True)
def usage_rollup_task() -> dict[str, int]:
    """Hourly: fold old raw usage samples into per-minute averages; drop stale agent reports, round
    decisions and expired idempotency keys."""
    return {
        "usage_rows_removed": usage_samples_rollup(),
        "agent_reports_removed": agent_reports_prune(),
        "round_decisions_removed": round_decisions_prune(),
        "idempotency_keys_removed": idempotency_keys_prune(),
    }


@shared_task(name=WORKLOAD_PROFILE_TASK, bind=True, ignore_result=True, max_retries=20)
def workload_profile_task(self, profiling_run_id: int) -> str:
    """Hand a queued profiling run to an agent: returns the run's status after the attempt.

    When a round holds the lock it dispatches queued runs itself at its end, but it may have started
    before this run existed: retry shortly rather than wait for the next beat round.
    """
    status = profiling_run_dispatch(run_id=profiling_run_id)
    if status == "busy":
        raise self.retry(countdown=1)
    return status


@shared_task(name=SIMULATION_RUN_TASK, ignore_result=True, acks_late=True)
def simulation_run_task(run_id: int) -> str | None:
    """Run a queued what-if simulation (dashboards); returns its final status, None if already claimed."""
    run = whatif_run_execute(run_id=run_id)
    return run.status if run is not None else None


@shared_task(name=FORECAST_REFRESH_TASK, ignore_result=True)
def forecast_refresh_task() -> int:
    """Re-forecast every live job after rounds (debounced and paced, services/forecast_refresh.py);
    returns how many estimates were stored. On the `forecasts` queue (settings.CELERY_TASK_ROUTES)."""
    return job_forecasts_refresh_run()


@shared_task(name=ADMISSION_FORECAST_TASK, ignore_result=True)
def admission_forecast_task(job_id: int | None = None) -> int:
    """Coalesced forecasts that fill every pending admission prediction, back to back while submissions
    wait, one process at a time (services/admission_worker.py); returns how many. `job_id`: ignored (messages
    queued by an older version name one job)."""
    return admission_forecasts_serve()
