"""Admission feedback: at submission, predict a job's start and finish and whether its QoS target holds.

The prediction plays the live queue forward with the simulator's forecast (scheduler_app/simulator/
forecast.py: the same core, policy and allocator as the live rounds, no future arrivals), stores it
as an AdmissionPrediction, and fills in what really happened when the job ends.
"""

from __future__ import annotations

import logging
import math
import time
from datetime import datetime, timedelta

from django.core.exceptions import ValidationError
from django.db import transaction
from django.utils import timezone

from cluster_app.models import Server
from cluster_app.selectors import SCHEDULABLE_STATES
from scheduler_app.conf import scheduler_conf
from scheduler_app.models import AdmissionPrediction, Job, JobState, PendingReason
from scheduler_app.selectors import (
    dependency_pending_reason,
    dependency_waits,
    next_round_at,
    round_inputs,
    team_quotas_left,
)
from scheduler_app.simulator.forecast import forecast

logger = logging.getLogger(__name__)

OWN_COMMAND_UNKNOWN = "own command without a time limit: its finish cannot be predicted"
NEVER_STARTS = "a job it depends on ended without completing: it will not start"
HELD = "held: it starts only once released"


class QosUnattainableError(ValidationError):
    """The job's QoS target cannot be met and the cluster is set to refuse such submissions."""


def _at(seconds: float | None) -> datetime | None:
    if seconds is None or not math.isfinite(seconds):
        return None
    return datetime.fromtimestamp(seconds, tz=timezone.get_current_timezone())


def _forecast_into(prediction: AdmissionPrediction, job: Job, now: datetime, budget_s: float) -> bool:
    """Fill the prediction's times from a forecast of the current queue; False if out of time."""
    conf = scheduler_conf()
    servers = list(Server.objects.filter(state__in=SCHEDULABLE_STATES))
    if job.held:
        prediction.detail = HELD
        return True
    # Held jobs do not run until released: not in the forecast.
    live = Job.objects.filter(state__in=[JobState.PENDING, JobState.RUNNING], held=False)
    jobs = list(live.select_related("workload"))
    if job.pk not in {j.pk for j in jobs}:
        jobs.append(job)
    # Jobs after others (afterok) join the forecast's queue when those finish in it; a job after one
    # that ended without completing never runs, so it is left out.
    waits = dependency_waits(job_ids=[j.pk for j in jobs if j.state == JobState.PENDING])
    never = {
        job_id
        for job_id, deps in waits.items()
        if dependency_pending_reason(deps.values()) == PendingReason.DEPENDENCY_NEVER_SATISFIED
    }
    if job.pk in never:
        prediction.detail = NEVER_STARTS
        return True
    jobs = [j for j in jobs if j.pk not in never]
    inputs = round_inputs(servers=servers, jobs=jobs)
    if job.pk not in inputs.jobs:
        prediction.detail = "the job's servers are not schedulable"
        return True
    started_s = {
        j.pk: j.started_at.timestamp() for j in jobs if j.started_at is not None and j.pk in inputs.jobs
    }
    wall_start = time.perf_counter()
    predicted = forecast(
        inputs.snapshot,
        inputs.views,
        policy=conf.policy,
        allocator=conf.allocator,
        first_round_s=next_round_at(now, conf.round_s).timestamp(),
        round_s=conf.round_s,
        started_s=started_s,
        until_finished=[job.pk],
        max_rounds=max(1, math.ceil(conf.forecast_horizon_h * 3600 / conf.round_s)),
        time_budget_s=budget_s,
        team_quota_gpus=team_quotas_left(jobs=jobs, frozen_job_ids=inputs.frozen_job_ids),
        after={job_id: deps.keys() for job_id, deps in waits.items() if job_id not in never},
    )[job.pk]
    prediction.predicted_start_at = _at(predicted.start_s)
    prediction.predicted_finish_at = _at(predicted.finish_s)
    prediction.detail = ""
    start = prediction.predicted_start_at
    if job.workload_id is None and start is not None:
        # An own command has no profile, so its length is unknown; a time limit bounds it (what
        # Slurm's backfill assumes too). The forecast only placed it with a guessed speed.
        if job.time_limit_s:
            prediction.predicted_finish_at = start + timedelta(seconds=job.time_limit_s)
            prediction.detail = "own command: finish = start + its time limit"
        else:
            prediction.predicted_finish_at = None
            prediction.detail = OWN_COMMAND_UNKNOWN
        return True
    if predicted.finish_s is not None:
        return True
    what = "started" if predicted.start_s is None else "finished"
    if time.perf_counter() - wall_start >= budget_s:
        prediction.detail = f"not {what} within {budget_s:g} s of forecasting"
        return False
    prediction.detail = f"not {what} within the forecast's {conf.forecast_horizon_h:g} h"
    return True


def _judge(prediction: AdmissionPrediction) -> None:
    if prediction.deadline_at is None or prediction.detail == OWN_COMMAND_UNKNOWN:
        return  # no target, or nothing to compare it with
    finish = prediction.predicted_finish_at
    prediction.attainable = finish is not None and finish <= prediction.deadline_at


def admission_predict(*, job: Job, now: datetime | None = None) -> AdmissionPrediction:
    """Forecast `job` (just submitted, PENDING) against the current queue and store the prediction.

    The forecast gets `forecast_time_budget_s` here; when that is not enough (a very long queue) the
    prediction is stored as unknown and, with a Celery worker, a task finishes it with
    `forecast_background_budget_s` (admission_forecast_complete). Raises QosUnattainableError, before
    storing anything, when the target is predicted to be missed and `reject_unattainable_qos` is set;
    the caller's transaction then drops the submission (only a finished forecast can refuse).
    """
    conf = scheduler_conf()
    now = now or timezone.now()
    deadline_at = job.deadline_at
    prediction = AdmissionPrediction(
        job=job, created_at=now, policy=conf.policy, allocator=conf.allocator, deadline_at=deadline_at
    )
    finished = _forecast_into(prediction, job, now, conf.forecast_time_budget_s)
    if finished:
        _judge(prediction)
    elif not conf.inline_rounds:
        prediction.detail += "; a worker is finishing the forecast"
        transaction.on_commit(lambda: _request_completion(job.pk))
    if prediction.attainable is False and conf.reject_unattainable_qos:
        finish = prediction.predicted_finish_at
        when = finish.isoformat() if finish is not None else prediction.detail
        raise QosUnattainableError(
            {
                "qos_deadline_at" if job.qos_deadline_at is not None else "qos_max_latency_s": (
                    f"This QoS target cannot be met: the predicted finish is {when}, "
                    f"after the target {deadline_at.isoformat() if deadline_at else ''}."
                )
            }
        )
    prediction.save()
    logger.info(
        "job %s admission: start %s finish %s attainable %s %s",
        job.pk,
        prediction.predicted_start_at,
        prediction.predicted_finish_at,
        prediction.attainable,
        prediction.detail,
    )
    return prediction


def _request_completion(job_id: int) -> None:
    from scheduler_app.tasks import admission_forecast_task

    try:
        admission_forecast_task.delay(job_id)
    except Exception:  # a broker outage leaves the prediction unknown; it must not fail the submission
        logger.warning("could not queue the forecast of job %s", job_id, exc_info=True)


def admission_forecast_complete(*, job_id: int) -> AdmissionPrediction | None:
    """Finish a prediction that ran out of time at submission, with the background budget.

    Predicts from the queue as it is now (the job may have moved up). Nothing to do once the job
    has started or ended, or when its prediction is already known.
    """
    conf = scheduler_conf()
    prediction = AdmissionPrediction.objects.select_related("job").filter(job_id=job_id).first()
    if prediction is None or prediction.predicted_finish_at is not None:
        return prediction
    job = prediction.job
    if job.state != JobState.PENDING:
        return prediction
    _forecast_into(prediction, job, timezone.now(), conf.forecast_background_budget_s)
    _judge(prediction)
    prediction.save(update_fields=["predicted_start_at", "predicted_finish_at", "attainable", "detail"])
    return prediction


def admission_predict_released(*, job: Job, now: datetime | None = None) -> AdmissionPrediction | None:
    """A job submitted held had no forecast; at its release it gets one, as a submission would (the
    prediction's time is the release). A job held after submission keeps the one it had."""
    conf = scheduler_conf()
    now = now or timezone.now()
    prediction = AdmissionPrediction.objects.filter(job=job, detail=HELD).first()
    if prediction is None:
        return None
    prediction.created_at = now
    if _forecast_into(prediction, job, now, conf.forecast_time_budget_s):
        _judge(prediction)
    elif not conf.inline_rounds:
        prediction.detail += "; a worker is finishing the forecast"
        transaction.on_commit(lambda: _request_completion(job.pk))
    prediction.save()
    return prediction


def admission_outcome_record(*, job: Job) -> None:
    """When a job ends, store what happened next to what was predicted (no-op without a prediction)."""
    deadline_at = job.deadline_at
    met = None
    if deadline_at is not None and job.finished_at is not None:
        met = job.state == JobState.COMPLETED and job.finished_at <= deadline_at
    AdmissionPrediction.objects.filter(job=job).update(
        actual_start_at=job.started_at, actual_finish_at=job.finished_at, met_deadline=met
    )
