"""Admission feedback: at submission, predict a job's start and finish and whether its QoS target holds.

The prediction plays the live queue forward with the simulator's forecast (scheduler_app/simulator/
forecast.py: the same core, policy and allocator as the live rounds, no future arrivals), stores it
as an AdmissionPrediction, and fills in what really happened when the job ends.

With a worker the request does not forecast (unless the queue has at most `admission_in_request_max_jobs`
live jobs, 0 by default: a forecast's cost follows the policy as well as the queue): it stores the
prediction as pending and asks for one coalesced forecast on the `forecasts` queue (a burst of
submissions, one forecast), which fills every pending prediction; the answer waits for it only a moment
(admission_answer_wait). Without a worker (the embedded demo), or when a QoS target may refuse the
submission, the forecast runs in the request, within `forecast_time_budget_s`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from datetime import datetime

from django.core.exceptions import ValidationError
from django.db import transaction
from django.utils import timezone

from config.redis_pool import redis_client as _redis
from infra.bulk_sql import model_rows_insert
from infra.task_send import task_send
from profiles_app.selectors import measured_iters_per_s_by_job
from scheduler_app.conf import scheduler_conf
from scheduler_app.models import (
    TERMINAL_JOB_STATES,
    AdmissionPrediction,
    Job,
    JobForecast,
    JobState,
)
from scheduler_app.services.admission_window import behind_window
from scheduler_app.services.forecasts import (
    HELD,
    OWN_COMMAND_UNKNOWN,
    Estimate,
    job_forecasts_store,
    job_positions_store,
    live_forecast,
    live_queue,
    queue_positions,
)
from scheduler_app.services.pacing import debounced_send, pace_left_s
from scheduler_app.task_names import ADMISSION_FORECAST_TASK

logger = logging.getLogger(__name__)

# A rate exactly at its target must not miss it by a floating-point rounding.
RATE_REL_TOL = 1e-9
# A prediction the forecasts worker has yet to fill (the job page, the API and `cli show` give it then).
FORECAST_PENDING = "forecast pending: computed in a moment, then shown on the job's page and by the API"
ENDED_FIRST = "the job ended before its forecast"
# Set while a coalesced admission forecast is queued and not started: a burst's requests find it taken.
QUEUED_KEY = "attune:admission-forecast"
# Lives `admission_forecast_min_interval_s` from an admission forecast's start: the next waits for it.
PACE_KEY = "attune:admission-forecast:pace"
# How long the last admission forecast took (seconds): whether an answer waiting for one can get it.
SECONDS_KEY = "attune:admission-forecast:seconds"
QUEUED_SLACK_S = 60
# Held (redis-py's Lock: released only by its holder) while a process runs an admission forecast: a
# second one at once would split the worker's CPU with it and forecast its submissions again.
RUNNING_KEY = "attune:admission-forecast:running"
# Its expiry: a worker killed mid-forecast holds the next ones back this long at most (the refresh
# after the next round answers its submissions meanwhile).
RUNNING_TTL_S = 60
# How long one task forecasts back to back while submissions keep coming before it hands over to a
# queued task (a refresh queued meanwhile on the same process then runs first).
SERVE_MAX_S = 30.0
ANSWER_POLL_S = 0.02


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
            raise _unattainable(prediction, job)
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
                _judge(prediction, job)
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
            _judge(prediction, job)
        elif worker:
            prediction.detail = FORECAST_PENDING
    if undecided and worker:
        transaction.on_commit(admission_forecast_request)


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


def admission_forecast_request() -> None:
    """Ask for one admission forecast (admission_forecasts_run), debounced: the first request of a
    burst queues it, no sooner than `admission_forecast_min_interval_s` after the last one's start
    (PACE_KEY); the others find it queued, and
    the run, which reads the queue as it starts, covers them too. A broker outage leaves the predictions
    pending: the next submission's request or the refresh after the next round fills them."""
    conf = scheduler_conf()
    try:
        client = _redis(conf.redis_url)
        countdown_s = pace_left_s(client, PACE_KEY)
        debounced_send(
            client,
            key=QUEUED_KEY,
            value="submit",
            countdown_s=countdown_s,
            slack_s=QUEUED_SLACK_S,
            send=lambda: task_send(
                ADMISSION_FORECAST_TASK, countdown_s=countdown_s, expires_s=countdown_s + QUEUED_SLACK_S
            ),
        )
    except Exception:  # the submission has committed; its forecast must not fail it
        logger.warning("could not queue an admission forecast", exc_info=True)


def admission_forecasts_serve() -> int:
    """The admission task's body (the forecasts worker): admission forecasts back to back while
    predictions wait for one, each answering every one pending as it starts, in one process at a time;
    returns how many were filled. A task that finds another process forecasting leaves its
    submissions to it: that one looks for pending predictions after it lets go, so it sees every
    submission committed before this task looked. No pace between forecasts but
    `admission_forecast_min_interval_s` from one start to the next: a submission's first estimate waits
    for the forecast in progress and its own, nothing more (issue 37: within 10 s). The worker is
    niced (docker-compose.yml), each forecast bounded by its budget, and after SERVE_MAX_S the task
    hands over to a queued one, so that a refresh queued behind it on the same process gets its turn.
    """
    conf = scheduler_conf()
    deadline = time.monotonic() + SERVE_MAX_S
    filled = 0
    while True:
        started = time.monotonic()
        ran = _forecasts_run_alone()
        if ran is None:
            return filled  # another process forecasts: it answers this task's submissions too
        filled += ran
        # After letting go: a submission whose task found this run in progress is seen here (every
        # prediction a run reads is filled: one still pending came after it read them).
        if not admission_forecasts_waiting():
            return filled
        if time.monotonic() >= deadline:
            _hand_over()
            return filled
        time.sleep(max(0.0, conf.admission_forecast_min_interval_s - (time.monotonic() - started)))


def _hand_over() -> None:
    """Queue a task for the predictions still waiting, past the debounce: the key may be a task's that
    found this one forecasting and left."""
    try:
        _redis(scheduler_conf().redis_url).delete(QUEUED_KEY)
    except Exception:
        logger.warning("could not clear the admission forecast's queued key", exc_info=True)
    admission_forecast_request()


def admission_forecasts_run() -> int:
    """One coalesced admission forecast (the refresh runs one first when predictions wait): one
    forecast of the live queue for every pending prediction's job (services/forecasts.py, stored as
    their current estimates) fills them; returns how many were filled, 0 when another process is
    running one (it answers them). Submissions that came meanwhile get a task of their own: their
    requests' tasks found this one forecasting and left them to it."""
    filled = _forecasts_run_alone()
    if filled is not None and admission_forecasts_waiting():
        _hand_over()
    return filled or 0


def _forecasts_run_alone() -> int | None:
    """admission_forecasts_run under RUNNING_KEY's lock; None when another process holds it. Without
    Redis it runs anyway (a second forecast at once only costs CPU)."""
    conf = scheduler_conf()
    client = lock = None
    try:
        client = _redis(conf.redis_url)
        taken = client.lock(RUNNING_KEY, timeout=RUNNING_TTL_S, blocking=False)
        if not taken.acquire():
            # The holder answers this task's submissions after it lets go. The key goes: it may be of
            # a submission that the holder's run already read, and would keep the next ones' requests
            # from queueing a task after that run.
            client.delete(QUEUED_KEY)
            return None
        lock = taken
        interval_ms = int(conf.admission_forecast_min_interval_s * 1000)
        if interval_ms > 0:
            client.set(PACE_KEY, "1", px=interval_ms)
        client.delete(QUEUED_KEY)  # a submission from now on queues the next run
    except Exception:
        logger.warning("could not update the admission forecast keys", exc_info=True)
    try:
        start = time.perf_counter()
        pending = _pending_predictions()
        filled = admission_predictions_fill(_forecast_of(pending), pending) if pending else 0
        if client is not None:
            try:
                client.set(SECONDS_KEY, f"{time.perf_counter() - start:.3f}", ex=3600)
            except Exception:
                logger.warning("could not store the admission forecast's length", exc_info=True)
        return filled
    finally:
        if lock is not None:
            try:
                lock.release()
            except Exception:  # expired and taken by another since: theirs now
                logger.warning("could not release the admission forecast's lock", exc_info=True)


def admission_forecasts_waiting() -> bool:
    """Whether a prediction waits for the forecasts worker (one read that stops at the first)."""
    return AdmissionPrediction.objects.filter(detail=FORECAST_PENDING).exists()


def _pending_predictions() -> list[AdmissionPrediction]:
    return list(AdmissionPrediction.objects.select_related("job").filter(detail=FORECAST_PENDING))


def _forecast_of(pending: list[AdmissionPrediction]) -> dict[int, Estimate]:
    """One forecast of the live queue for these predictions' jobs, stored as their current estimates
    with every pending job's queue position. Bounded like the refresh (`forecast_window_jobs`): jobs
    behind the window are answered from the order alone, nothing played forward for them."""
    conf = scheduler_conf()
    now = timezone.now()
    queue = live_queue()
    estimates = live_forecast(
        now=now,
        # The in-request forecast's budget, not the refresh's: a submission's first estimate must come
        # within seconds (issue 37), and one cut short says so ("not started within 2 s of
        # forecasting"); the refresh after the next round plays further.
        budget_s=min(conf.forecast_time_budget_s, conf.forecast_refresh_budget_s),
        targets=[p.job_id for p in pending],
        early_round=True,
        queue=queue,
        window_jobs=conf.forecast_window_jobs,
    )
    positions = queue_positions(queue, now=now)
    job_forecasts_store(estimates, now=now, prune=False, positions=positions)
    job_positions_store(positions)  # a new job moves those behind it down (not under FIFO)
    return estimates


def admission_predictions_fill(
    estimates: dict[int, Estimate], pending: list[AdmissionPrediction] | None = None
) -> int:
    """Fill the pending predictions (default: all) from a forecast of the live queue (the refresh
    after a round does too); returns how many were filled. A job submitted after that forecast read the
    queue stays pending and asks for the next one; a job that ended first is said to have."""
    if pending is None:
        pending = _pending_predictions()
    done: list[AdmissionPrediction] = []
    later = False
    for prediction in pending:
        job = prediction.job
        estimate = estimates.get(job.pk)
        if job.state in TERMINAL_JOB_STATES:
            prediction.detail = ENDED_FIRST
            done.append(prediction)
            continue
        if estimate is None:
            later = True
            continue
        prediction.predicted_start_at = estimate.start_at
        prediction.predicted_finish_at = estimate.finish_at
        prediction.detail = estimate.detail
        _judge(prediction, job)
        done.append(prediction)
    AdmissionPrediction.objects.bulk_update(
        done, ["predicted_start_at", "predicted_finish_at", "attainable", "detail"], batch_size=500
    )
    if later:
        admission_forecast_request()
    return len(done)


def admission_pending(job: Job) -> bool:
    """Whether the prediction this request stored for `job` (just submitted) waits for the worker: no
    query, the prediction is the one admission_predict_all gave it."""
    if not Job.admission_prediction.is_cached(job):
        return True  # not this request's: the answer's wait finds out
    return job.admission_prediction.detail == FORECAST_PENDING


def admission_answer_wait(*, job_ids: Sequence[int]) -> bool:
    """Give the forecasts worker up to `admission_answer_wait_s` to fill these jobs' pending
    predictions, so that a quick forecast reaches the submission's answer; return at once when the last
    one (and the pace before the next) would not fit, or without a worker. Call after commit. Returns
    whether it waited: when not, no forecast can have stored anything of these jobs since their commit
    (one that covers them reads the queue after it, and reading it alone takes longer than this
    request), so their answer is what the request stored."""
    conf = scheduler_conf()
    budget_s = conf.admission_answer_wait_s
    if conf.inline_rounds or budget_s <= 0 or transaction.get_connection().in_atomic_block:
        return False
    try:
        client = _redis(conf.redis_url)
        expected_s = pace_left_s(client, PACE_KEY) + float(client.get(SECONDS_KEY) or 0.0)
    except Exception:
        return False
    if expected_s > budget_s:
        return False  # a deep queue: the answer would only wait, the job page shows it moments later
    deadline = time.monotonic() + budget_s
    waiting = AdmissionPrediction.objects.filter(job_id__in=list(job_ids), detail=FORECAST_PENDING)
    while waiting.exists() and time.monotonic() < deadline:
        time.sleep(ANSWER_POLL_S)
    return True


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
