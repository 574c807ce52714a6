"""Admission feedback: at submission, predict a job's start and finish and whether its QoS target holds.

The prediction plays the live queue forward with the simulator's forecast (scheduler_app/simulator/
forecast.py: the same core, policy and allocator as the live rounds, no future arrivals), stores it
as an AdmissionPrediction, and fills in what really happened when the job ends (admission_judge.py).

With a worker the request does not forecast (unless the queue has at most `admission_in_request_max_jobs`
live jobs, 0 by default: a forecast's cost follows the policy as well as the queue): it stores the
prediction as pending and asks for one coalesced forecast on the `forecasts` queue (a burst of
submissions, one forecast), which fills every pending prediction; the answer waits for it only a moment
(admission_answer_wait). That worker's side is admission_worker.py. Without a worker (the embedded
demo), or when a QoS target may refuse the submission, the forecast runs in the request, within
`forecast_time_budget_s`.
"""

from __future__ import annotations

import logging
from datetime import datetime

from django.db import transaction
from django.utils import timezone

from infra.bulk_sql import model_rows_insert
from scheduler_app.conf import scheduler_conf
from scheduler_app.models import AdmissionPrediction, Job, JobForecast, JobState
from scheduler_app.services.admission_judge import prediction_judge, unattainable_error
from scheduler_app.services.admission_window import behind_window
from scheduler_app.services.admission_worker import FORECAST_PENDING, admission_forecast_request
from scheduler_app.services.forecasts import (
    HELD,
    Estimate,
    job_forecasts_store,
    job_positions_store,
    live_forecast,
    live_queue,
    queue_positions,
)

logger = logging.getLogger(__name__)

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


def admission_predict_all(*, jobs: list[Job], now: datetime | None = None) -> list[AdmissionPrediction]:
    """Store a prediction for just-submitted jobs (one, or the tasks of an array) and return them.

    With a worker (and a queue past `admission_in_request_max_jobs`, 0 by default) the prediction is
    stored pending (FORECAST_PENDING) and one coalesced forecast is asked for after commit
    (admission_forecasts_run fills it): the request's work grows with neither the queue nor the policy's
    cost. Without a worker, on a queue that short, or when a QoS target may refuse the submission
    (`reject_unattainable_qos`), the queue is forecast here with `forecast_time_budget_s`, the tasks of
    an array together. Raises QosUnattainableError,
    before storing anything, when a target is predicted to be missed and `reject_unattainable_qos` is
    set; the caller's transaction then drops the submission (only a finished forecast can refuse).
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
    _predict(targets, now)
    for prediction, job in targets:
        if prediction.attainable is False and conf.reject_unattainable_qos:
            raise unattainable_error(prediction, job)
    # One statement without the ORM's preparing of each row (infra/bulk_sql.py), as bulk_create stores.
    ids = model_rows_insert(AdmissionPrediction, [vars(prediction) for prediction, _ in targets])
    for (prediction, _), pk in zip(targets, ids, strict=True):
        prediction.pk = pk
        prediction._state.adding, prediction._state.db = False, "default"
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


def _predict(targets: list[Target], now: datetime, *, fresh: bool = True) -> None:
    """Forecast in the request where it must (no worker; a target that may refuse) or where it is
    configured to (a queue of at most `admission_in_request_max_jobs`); answer at once a job queued
    behind the forecast's window (the worker's forecast would play nothing forward for it); else leave
    the predictions pending for the worker.
    `fresh`: the jobs were just submitted (not a held job released)."""
    conf = scheduler_conf()
    refusing = conf.reject_unattainable_qos and any(
        job.deadline_at is not None or job.qos_min_rate_iters_per_s is not None for _, job in targets
    )
    if not conf.inline_rounds and not refusing:
        detail = behind_window([job for _, job in targets], conf)
        if detail is not None:
            for prediction, job in targets:
                prediction.detail = detail
                prediction_judge(prediction, job)
            # Their current estimate too, as the worker's forecast would store it (the job page, the
            # API): over a stored one (a held job released), whose queue position it keeps; a new
            # job's position is the next refresh's, as for any job since the last round.
            if fresh:  # new rows, in one INSERT; the answer's job holds them as stored (no read)
                rows = [JobForecast(job=job, detail=detail, computed_at=now) for _, job in targets]
                model_rows_insert(JobForecast, [vars(row) for row in rows])
            else:
                estimates = {job.pk: Estimate(None, None, detail) for _, job in targets}
                job_forecasts_store(estimates, now=now, prune=False)
            return
    if conf.inline_rounds or refusing or _short_queue(conf.admission_in_request_max_jobs):
        _settle(targets, _forecast_into(targets, now, conf.forecast_time_budget_s))
        return
    for prediction, job in targets:
        prediction.detail = FORECAST_PENDING
        if fresh:  # known to have no estimate: the answer need not read one (job_submitted_as_stored)
            Job.forecast.related.set_cached_value(job, None)
    transaction.on_commit(admission_forecast_request)


def _short_queue(most_jobs: int) -> bool:
    """Whether at most `most_jobs` jobs are live, these just submitted included: whether there is no
    live row past the first most_jobs (a read that stops there, whatever the queue's length; cheaper to
    build than a count over a limited subquery)."""
    if most_jobs <= 0:
        return False
    live = Job.objects.filter(state__in=[JobState.PENDING, JobState.RUNNING]).order_by()
    return not live.values_list("pk", flat=True)[most_jobs : most_jobs + 1]


def _settle(targets: list[Target], undecided: set[int]) -> None:
    """Judge the decided predictions; with a worker, leave the undecided ones pending for its coalesced
    forecast, asked for after commit."""
    worker = not scheduler_conf().inline_rounds
    for prediction, job in targets:
        if job.pk not in undecided:
            prediction_judge(prediction, job)
        elif worker:
            prediction.detail = FORECAST_PENDING
    if undecided and worker:
        transaction.on_commit(admission_forecast_request)


def admission_predict_released(*, job: Job, now: datetime | None = None) -> AdmissionPrediction | None:
    """A job submitted held had no forecast; at its release it gets one, as a submission would (the
    prediction's time is the release). A job held after submission keeps the one it had."""
    now = now or timezone.now()
    prediction = AdmissionPrediction.objects.filter(job=job, detail=HELD).first()
    if prediction is None:
        return None
    prediction.created_at = now
    prediction.predicted_start_at = prediction.predicted_finish_at = prediction.attainable = None
    _predict([(prediction, job)], now, fresh=False)
    prediction.save()
    return prediction
