"""The forecasts worker's side of admission: one coalesced forecast fills every pending prediction.

A submission's request stores its prediction pending (FORECAST_PENDING) and asks for a forecast
(admission_forecast_request, debounced: a burst of submissions, one forecast); the `forecasts` worker
runs them one process at a time (admission_forecasts_serve), and the answer waits for it only a moment
(admission_answer_wait).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence

from django.db import transaction
from django.utils import timezone

from config.redis_pool import redis_client as _redis
from infra.task_send import task_send
from scheduler_app.conf import scheduler_conf
from scheduler_app.models import TERMINAL_JOB_STATES, AdmissionPrediction, Job
from scheduler_app.services.admission_judge import prediction_judge
from scheduler_app.services.forecasts import (
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
        prediction_judge(prediction, job)
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
