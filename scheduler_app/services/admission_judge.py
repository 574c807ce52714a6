"""Whether an admission prediction keeps its job's QoS target, what the user is told, and what happened.

A prediction is judged when its forecast fills it (at submission, or by the forecasts worker:
admission_worker.py), and compared with the job's real start and finish when the job ends.
"""

from __future__ import annotations

from django.core.exceptions import ValidationError
from django.utils import timezone

from profiles_app.selectors import measured_iters_per_s_by_job
from scheduler_app.models import AdmissionPrediction, Job, JobState
from scheduler_app.services.forecasts import OWN_COMMAND_UNKNOWN

# A rate exactly at its target must not miss it by a floating-point rounding.
RATE_REL_TOL = 1e-9


class QosUnattainableError(ValidationError):
    """The job's QoS target cannot be met and the cluster is set to refuse such submissions."""


def predicted_rate_iters_per_s(prediction: AdmissionPrediction, job: Job) -> float | None:
    """The average rate a forecast implies: work left / (predicted finish - predicted start); None when
    either time, or the work, is unknown."""
    start, finish = prediction.predicted_start_at, prediction.predicted_finish_at
    if start is None or finish is None or not job.total_iters:
        return None
    return (job.total_iters - job.done_iters) / max((finish - start).total_seconds(), 1e-9)


def prediction_judge(prediction: AdmissionPrediction, job: Job) -> None:
    """Set the prediction's `attainable` from its forecast: its rate or finish against the job's target."""
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


def unattainable_error(prediction: AdmissionPrediction, job: Job) -> QosUnattainableError:
    """The refusal of a submission whose target is predicted to be missed, on the target's field."""
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
