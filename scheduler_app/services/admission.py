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
    borrowing_teams,
    dependency_pending_reason,
    dependency_waits,
    next_round_at,
    round_inputs,
    team_quotas_left,
)
from scheduler_app.simulator.forecast import JobForecast, forecast

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


Target = tuple[AdmissionPrediction, Job]


def _forecast_into(targets: list[Target], now: datetime, budget_s: float) -> set[int]:
    """Fill each prediction's times from one forecast of the current queue (the tasks of an array
    together); the ids of the jobs left undecided when it ran out of time."""
    conf = scheduler_conf()
    pending: list[Target] = []
    for prediction, job in targets:
        if job.held:
            prediction.detail = HELD
        else:
            pending.append((prediction, job))
    if not pending:
        return set()
    servers = list(Server.objects.filter(state__in=SCHEDULABLE_STATES))
    # Held jobs do not run until released: not in the forecast.
    live = Job.objects.filter(state__in=[JobState.PENDING, JobState.RUNNING], held=False)
    jobs = list(live.select_related("workload"))
    known = {j.pk for j in jobs}
    jobs += [job for _, job in pending if job.pk not in known]
    # Jobs after others (afterok) join the forecast's queue when those finish in it; a job after one
    # that ended without completing never runs, so it is left out.
    waits = dependency_waits(job_ids=[j.pk for j in jobs if j.state == JobState.PENDING])
    never = {
        job_id
        for job_id, deps in waits.items()
        if dependency_pending_reason(deps.values()) == PendingReason.DEPENDENCY_NEVER_SATISFIED
    }
    jobs = [j for j in jobs if j.pk not in never]
    inputs = round_inputs(servers=servers, jobs=jobs)
    placeable: list[Target] = []
    for prediction, job in pending:
        if job.pk in never:
            prediction.detail = NEVER_STARTS
        elif job.pk not in inputs.jobs:
            prediction.detail = "the job's servers are not schedulable"
        else:
            placeable.append((prediction, job))
    if not placeable:
        return set()
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
        until_finished=[job.pk for _, job in placeable],
        max_rounds=max(1, math.ceil(conf.forecast_horizon_h * 3600 / conf.round_s)),
        time_budget_s=budget_s,
        team_quota_gpus=team_quotas_left(jobs=jobs, frozen_job_ids=inputs.frozen_job_ids),
        borrowing_teams=borrowing_teams(),
        after={job_id: deps.keys() for job_id, deps in waits.items() if job_id not in never},
    )
    # Why a target has no finish: the time budget ran out, or the horizon was reached.
    cut_short = (
        f"within {budget_s:g} s of forecasting" if time.perf_counter() - wall_start >= budget_s else None
    )
    horizon = f"within the forecast's {conf.forecast_horizon_h:g} h"
    return {
        job.pk
        for prediction, job in placeable
        if not _fill(prediction, job, predicted[job.pk], cut_short, horizon)
    }


def _fill(
    prediction: AdmissionPrediction, job: Job, predicted: JobForecast, cut_short: str | None, horizon: str
) -> bool:
    """One target's prediction from the forecast; False when it was cut short by the time budget."""
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
    prediction.detail = f"not {what} {cut_short or horizon}"
    return cut_short is None


def _judge(prediction: AdmissionPrediction) -> None:
    if prediction.deadline_at is None or prediction.detail == OWN_COMMAND_UNKNOWN:
        return  # no target, or nothing to compare it with
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
            _judge(prediction)
        elif worker:
            prediction.detail += "; a worker is finishing the forecast"
    if undecided and worker:
        first = min(undecided)
        transaction.on_commit(lambda: _request_completion(first))


def _unattainable(prediction: AdmissionPrediction, job: Job) -> QosUnattainableError:
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
    from scheduler_app.tasks import admission_forecast_task

    try:
        admission_forecast_task.delay(job_id)
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
    for target, _ in targets:
        _judge(target)
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
    """When a job ends, store what happened next to what was predicted (no-op without a prediction)."""
    deadline_at = job.deadline_at
    met = None
    if deadline_at is not None and job.finished_at is not None:
        met = job.state == JobState.COMPLETED and job.finished_at <= deadline_at
    AdmissionPrediction.objects.filter(job=job).update(
        actual_start_at=job.started_at, actual_finish_at=job.finished_at, met_deadline=met
    )
