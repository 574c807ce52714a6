"""Admission feedback: at submission, predict a job's start and finish and whether its QoS target holds.

The prediction plays the live queue forward with the simulator's forecast (scheduler_app/simulator/
forecast.py: the same core, policy and allocator as the live rounds, no future arrivals), stores it
as an AdmissionPrediction, and fills in what really happened when the job ends.
"""

from __future__ import annotations

import logging
import math
from datetime import datetime, timedelta

from django.core.exceptions import ValidationError
from django.utils import timezone

from cluster_app.models import Server
from cluster_app.selectors import SCHEDULABLE_STATES
from scheduler_app.conf import scheduler_conf
from scheduler_app.models import AdmissionPrediction, Job, JobState, SchedulingRound
from scheduler_app.selectors import round_inputs
from scheduler_app.simulator.forecast import forecast

logger = logging.getLogger(__name__)


class QosUnattainableError(ValidationError):
    """The job's QoS target cannot be met and the cluster is set to refuse such submissions."""


def job_deadline_at(job: Job) -> datetime | None:
    """The job's QoS target as a time: the deadline, or submission plus the maximum latency."""
    if job.qos_deadline_at is not None:
        return job.qos_deadline_at
    if job.qos_max_latency_s is not None:
        return job.submitted_at + timedelta(seconds=job.qos_max_latency_s)
    return None


def next_round_at(now: datetime, round_s: float) -> datetime:
    """When the next live round runs: one round after the last one, and not before now."""
    last = SchedulingRound.objects.order_by("-started_at").values_list("started_at", flat=True).first()
    if last is None:
        return now
    return max(now, last + timedelta(seconds=round_s))


def _at(seconds: float | None) -> datetime | None:
    if seconds is None or not math.isfinite(seconds):
        return None
    return datetime.fromtimestamp(seconds, tz=timezone.get_current_timezone())


def admission_predict(*, job: Job, now: datetime | None = None) -> AdmissionPrediction:
    """Forecast `job` (just submitted, PENDING) against the current queue and store the prediction.

    Raises QosUnattainableError, before storing anything, when the target is predicted to be missed
    and `reject_unattainable_qos` is set; the caller's transaction then drops the submission.
    """
    conf = scheduler_conf()
    now = now or timezone.now()
    servers = list(Server.objects.filter(state__in=SCHEDULABLE_STATES))
    jobs = list(Job.objects.filter(state__in=[JobState.PENDING, JobState.RUNNING]).select_related("workload"))
    if job.pk not in {j.pk for j in jobs}:
        jobs.append(job)
    inputs = round_inputs(servers=servers, jobs=jobs)
    deadline_at = job_deadline_at(job)
    prediction = AdmissionPrediction(
        job=job, created_at=now, policy=conf.policy, allocator=conf.allocator, deadline_at=deadline_at
    )
    if job.pk not in inputs.jobs:
        prediction.detail = "the job's servers are not schedulable"
    else:
        started_s = {
            j.pk: j.started_at.timestamp() for j in jobs if j.started_at is not None and j.pk in inputs.jobs
        }
        predicted = forecast(
            inputs.snapshot,
            inputs.views,
            policy=conf.policy,
            allocator=conf.allocator,
            first_round_s=next_round_at(now, conf.round_s).timestamp(),
            round_s=conf.round_s,
            started_s=started_s,
            until_finished=[job.pk],
            max_rounds=conf.forecast_max_rounds,
            time_budget_s=conf.forecast_time_budget_s,
        )[job.pk]
        prediction.predicted_start_at = _at(predicted.start_s)
        prediction.predicted_finish_at = _at(predicted.finish_s)
        if predicted.finish_s is None:
            horizon_h = conf.forecast_max_rounds * conf.round_s / 3600
            what = "started" if predicted.start_s is None else "finished"
            prediction.detail = (
                f"not {what} within the forecast's limits ({horizon_h:g} h ahead, "
                f"{conf.forecast_time_budget_s:g} s of computing)"
            )
    if deadline_at is not None:
        finish = prediction.predicted_finish_at
        prediction.attainable = finish is not None and finish <= deadline_at
        if not prediction.attainable and conf.reject_unattainable_qos:
            when = finish.isoformat() if finish is not None else prediction.detail
            raise QosUnattainableError(
                {
                    "qos_deadline_at" if job.qos_deadline_at is not None else "qos_max_latency_s": (
                        f"This QoS target cannot be met: the predicted finish is {when}, "
                        f"after the target {deadline_at.isoformat()}."
                    )
                }
            )
    prediction.save()
    logger.info(
        "job %s admission: start %s finish %s attainable %s",
        job.pk, prediction.predicted_start_at, prediction.predicted_finish_at, prediction.attainable,
    )
    return prediction


def admission_outcome_record(*, job: Job) -> None:
    """When a job ends, store what happened next to what was predicted (no-op without a prediction)."""
    deadline_at = job_deadline_at(job)
    met = None
    if deadline_at is not None and job.finished_at is not None:
        met = job.state == JobState.COMPLETED and job.finished_at <= deadline_at
    AdmissionPrediction.objects.filter(job=job).update(
        actual_start_at=job.started_at, actual_finish_at=job.finished_at, met_deadline=met
    )
