"""Thin Celery tasks: each calls one service (beat schedule in settings.CELERY_BEAT_SCHEDULE)."""

import logging

from celery import shared_task

from cluster_app.services import usage_samples_rollup
from scheduler_app.services.agents import agent_reports_prune
from scheduler_app.services.nodes import node_liveness_sweep_run
from scheduler_app.services.rounds import scheduling_round_request_clear, scheduling_round_run

logger = logging.getLogger(__name__)


@shared_task(ignore_result=True)
def scheduling_round_task(trigger: str = "beat") -> int | None:
    """One scheduling round; returns its id, or None when another round held the lock."""
    if trigger != "beat":
        # An early round is starting: let the next submission or job end queue another one.
        scheduling_round_request_clear()
    sround = scheduling_round_run(trigger=trigger)
    return sround.pk if sround is not None else None


@shared_task(ignore_result=True)
def node_liveness_sweep_task() -> dict[str, list[str]]:
    sweep = node_liveness_sweep_run()
    return {"not_responding": sweep.not_responding, "down": sweep.down}


@shared_task(ignore_result=True)
def usage_rollup_task() -> dict[str, int]:
    """Hourly: fold old raw usage samples into per-minute averages; drop stale agent reports."""
    return {"usage_rows_removed": usage_samples_rollup(), "agent_reports_removed": agent_reports_prune()}
