"""Admission feedback: at submission, predict a job's start and finish and whether its QoS target holds.

The prediction plays the live queue forward with the simulator's forecast (scheduler_app/simulator/
forecast.py: the same core, policy and allocator as the live rounds, no future arrivals), stores it
as an AdmissionPrediction, and fills in what really happened when the job ends.
"""

from __future__ import annotations

import logging
from datetime import datetime

from django.core.exceptions import ValidationError
from django.db import transaction
from django.utils import timezone

from infra.task_send import task_send
from profiles_app.selectors import measured_iters_per_s_by_job
from scheduler_app.conf import scheduler_conf
from scheduler_app.models import AdmissionPrediction, Job, JobState
from scheduler_app.services.forecasts import (
    HELD,
    OWN_COMMAND_UNKNOWN,
    job_forecasts_store,
    job_positions_store,
    live_forecast,
    live_queue,
    queue_positions,
)
from scheduler_app.task_names import ADMISSION_FORECAST_TASK

logger = logging.getLogger(__name__)

# A rate exactly at its target must not miss it by a floating-point rounding.
RATE_REL_TOL = 1e-9


class QosUnattainableError(ValidationError):
    """The job's QoS target cannot be met and the cluster is set to refuse such submissions."""


Target = tuple[AdmissionPrediction, Job]


def _forecast_into(targets: list[Target], now: datetime, budget_s: float) -> set[int]:
    """Fill each prediction's times from one forecast of the current queue (services/forecasts.py, the
    one the pages show; the tasks of an array together), store those estimates as the jobs' current
    ones, and return the ids of the jobs left undecided when it ran out of time."""
    queue = live_queue(extra_jobs=[job for _, job in targets])
    estimates = live_forecast(
        now=now,
        budget_s=budget_s,
        targets=[job.pk for _, job in targets],
        early_round=True,
        queue=queue,
    )
    for prediction, job in targets:
        estimate = estimates[job.pk]
        prediction.predicted_start_at = estimate.start_at
        prediction.predicted_finish_at = estimate.finish_at
        prediction.detail = estimate.detail
    job_forecasts_store(estimates, now=now, prune=False)
    # The new jobs take their places in the queue now, not at the next round.
    job_positions_store(queue_positions(queue, now=now))
    return {job.pk for _, job in targets if estimates[job.pk].cut_short}


def predicted_rate_iters_per_s(prediction: AdmissionPrediction, job: Job) -> float | None:
    """The average rate a forecast implies: work left / (predicted finish - predicted start); None when
    either time, or the work, is unknown."""
    start, finish = prediction.predicted_start_at, prediction.predicted_finish_at
    if start is None or finish is None or not job.total_iters:
        return None
    return (job.total_iters - job.done_iters) / max((finish - start).total_seconds(), 1e-9)


def _judge(prediction: AdmissionPrediction, job: Job) -> None:
    if prediction.detail == OWN_COMMAND_UNKNOWN:
        return  # nothing to compare a target with
    if job.qos_min_rate_iters_per_s is not None:
        # A forecast that does not finish the job says nothing of its rate: left unknown.
        rate = predicted_rate_iters_per_s(prediction, job)
        if rate is not None:
            prediction.attainable = rate >= job.qos_min_rate_iters_per_s * (1 - RATE_REL_TOL)
        return
    if prediction.deadline_at is None:
        return  # no target
    finish = prediction.predicted_finish_at
    prediction.attainable = finish is not None and finish <= prediction.deadline_at


def admission_predict_all(*, jobs: list[Job], now: datetime | None = None) -> list[AdmissionPrediction]:
    """Forecast just-submitted jobs (one, or the tasks of an array) with one run of the current queue
    and store a prediction for each.

    The forecast gets `forecast_time_budget_s` here; when that is not enough (a very long queue) the
    predictions are stored as unknown and, with a Celery worker, a task finishes each with
    `forecast_background_budget_s` (admission_forecast_complete). Raises QosUnattainableError, before
    storing anything, when a target is predicted to be missed and `reject_unattainable_qos` is set;
    the caller's transaction then drops the submission (only a finished forecast can refuse).
    """
    conf = scheduler_conf()
    now = now or timezone.now()
    targets = [
        (
            AdmissionPrediction(
                job=job,
                created_at=now,
                policy=conf.policy,
                allocator=conf.allocator,
                deadline_at=job.deadline_at,
            ),
            job,
        )
        for job in jobs
    ]
    _settle(targets, _forecast_into(targets, now, conf.forecast_time_budget_s))
    for prediction, job in targets:
        if prediction.attainable is False and conf.reject_unattainable_qos:
            raise _unattainable(prediction, job)
    AdmissionPrediction.objects.bulk_create([prediction for prediction, _ in targets])
    for prediction, job in targets:
        logger.info(
            "job %s admission: start %s finish %s attainable %s %s",
            job.pk,
            prediction.predicted_start_at,
            prediction.predicted_finish_at,
            prediction.attainable,
            prediction.detail,
        )
    return [prediction for prediction, _ in targets]


def _settle(targets: list[Target], undecided: set[int]) -> None:
    """Judge the decided predictions; with a worker, hand the undecided ones to it after commit, in one
    task (an array's tasks together: not one forecast per task)."""
    worker = not scheduler_conf().inline_rounds
    for prediction, job in targets:
        if job.pk not in undecided:
            _judge(prediction, job)
        elif worker:
            prediction.detail += "; a worker is finishing the forecast"
    if undecided and worker:
        first = min(undecided)
        transaction.on_commit(lambda: _request_completion(first))


def qos_at_risk_message(prediction: AdmissionPrediction | None) -> str:
    """One sentence for a submission whose QoS target is predicted to be missed; "" otherwise. The form,
    the API's clients and the CLI say the same."""
    if prediction is None or prediction.attainable is not False:
        return ""
    job = prediction.job
    if job.qos_min_rate_iters_per_s is not None:
        rate = predicted_rate_iters_per_s(prediction, job)
        return (
            f"Its QoS target is at risk: it is predicted to run at {rate or 0:.3g} iterations/s on "
            f"average, below its minimum rate of {job.qos_min_rate_iters_per_s:g}."
        )
    if prediction.deadline_at is None:
        return ""
    finish = prediction.predicted_finish_at
    when = (
        f"finish at {timezone.localtime(finish):%Y-%m-%d %H:%M}"
        if finish
        else "not finish within the forecast"
    )
    return (
        f"Its QoS target is at risk: it is predicted to {when}, after its target "
        f"{timezone.localtime(prediction.deadline_at):%Y-%m-%d %H:%M}."
    )


def _unattainable(prediction: AdmissionPrediction, job: Job) -> QosUnattainableError:
    if job.qos_min_rate_iters_per_s is not None:
        rate = predicted_rate_iters_per_s(prediction, job) or 0.0
        return QosUnattainableError(
            {
                "qos_min_rate_iters_per_s": (
                    f"This QoS target cannot be met: the predicted average rate is {rate:.3g} "
                    f"iterations/s, below the minimum {job.qos_min_rate_iters_per_s:g}."
                )
            }
        )
    finish = prediction.predicted_finish_at
    when = finish.isoformat() if finish is not None else prediction.detail
    deadline_at = prediction.deadline_at
    return QosUnattainableError(
        {
            "qos_deadline_at" if job.qos_deadline_at is not None else "qos_max_latency_s": (
                f"This QoS target cannot be met: the predicted finish is {when}, "
                f"after the target {deadline_at.isoformat() if deadline_at else ''}."
            )
        }
    )


def _request_completion(job_id: int) -> None:
    try:
        task_send(ADMISSION_FORECAST_TASK, args=(job_id,))
    except Exception:  # a broker outage leaves the prediction unknown; it must not fail the submission
        logger.warning("could not queue the forecast of job %s", job_id, exc_info=True)


def admission_forecast_complete(*, job_id: int) -> AdmissionPrediction | None:
    """Finish a prediction that ran out of time at submission, with the background budget; for a
    task of an array, every unfinished prediction of that array in the same forecast.

    Predicts from the queue as it is now (the job may have moved up). Nothing to do once a job
    has started or ended, or when its prediction is already known.
    """
    conf = scheduler_conf()
    prediction = AdmissionPrediction.objects.select_related("job").filter(job_id=job_id).first()
    if prediction is None or prediction.predicted_finish_at is not None:
        return prediction
    unfinished = AdmissionPrediction.objects.select_related("job").filter(
        predicted_finish_at__isnull=True, job__state=JobState.PENDING
    )
    array_job_id = prediction.job.array_job_id
    unfinished = (
        unfinished.filter(job__array_job_id=array_job_id)
        if array_job_id
        else unfinished.filter(pk=prediction.pk)
    )
    targets = [(p, p.job) for p in unfinished.order_by("job_id")]
    if not targets:
        return prediction
    _forecast_into(targets, timezone.now(), conf.forecast_background_budget_s)
    for target, job in targets:
        _judge(target, job)
    AdmissionPrediction.objects.bulk_update(
        [target for target, _ in targets],
        ["predicted_start_at", "predicted_finish_at", "attainable", "detail"],
    )
    return next((target for target, _ in targets if target.pk == prediction.pk), prediction)


def admission_predict_released(*, job: Job, now: datetime | None = None) -> AdmissionPrediction | None:
    """A job submitted held had no forecast; at its release it gets one, as a submission would (the
    prediction's time is the release). A job held after submission keeps the one it had."""
    conf = scheduler_conf()
    now = now or timezone.now()
    prediction = AdmissionPrediction.objects.filter(job=job, detail=HELD).first()
    if prediction is None:
        return None
    prediction.created_at = now
    targets = [(prediction, job)]
    _settle(targets, _forecast_into(targets, now, conf.forecast_time_budget_s))
    prediction.save()
    return prediction


def admission_outcome_record(*, job: Job) -> None:
    """When a job ends, store what happened next to what was predicted (no-op without a prediction).

    A deadline is met when the job COMPLETED by then. A minimum rate is met when the job COMPLETED and
    its measured rate (its leases' reports, measured_iters_per_s_by_job) is at least the target; a job
    that reported no speed (an own command without progress reports) is left unknown.
    """
    deadline_at = job.deadline_at
    met = None
    if deadline_at is not None and job.finished_at is not None:
        met = job.state == JobState.COMPLETED and job.finished_at <= deadline_at
    rate = met_rate = None
    target = job.qos_min_rate_iters_per_s
    if target is not None:
        rate = measured_iters_per_s_by_job(job_ids=[job.pk]).get(job.pk)
        if rate is not None:
            met_rate = job.state == JobState.COMPLETED and rate >= target * (1 - RATE_REL_TOL)
    AdmissionPrediction.objects.filter(job=job).update(
        actual_start_at=job.started_at,
        actual_finish_at=job.finished_at,
        met_deadline=met,
        measured_iters_per_s=rate,
        met_min_rate=met_rate,
    )
