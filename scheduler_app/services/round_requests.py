"""Requests for an early scheduling round: debounced, paced after the last round, sent by task name."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from django.db import transaction

from config.redis_pool import redis_client as _redis
from infra.task_send import task_send
from scheduler_app.conf import scheduler_conf
from scheduler_app.services.pacing import debounced_send_after_pace, pace_extend, put_off_for_pace
from scheduler_app.task_names import SCHEDULING_ROUND_TASK

logger = logging.getLogger(__name__)

# Redis key that debounces early rounds: set while one is queued and not yet started.
EARLY_ROUND_KEY = "attune:early-round"
# Redis key set as a round ends (workers' mode), expiring `round_pacing` x its duration later: an early
# round is not started before it expires (see scheduling_round_pace).
ROUND_PACE_KEY = "attune:early-round:paced"
# How long a queued early round's key outlives its countdown, in case its task is lost.
EARLY_ROUND_SLACK_S = 60
# Inline mode: whether this thread is running the round that re-decides a round's skipped jobs.
_inline = threading.local()
# Inline mode runs the round in the requester's process: the round (services/rounds.py) sits above this
# module, so it is handed in at start-up (SchedulerAppConfig.ready) rather than imported from here.
_inline_round_run: Callable[..., object] | None = None


def inline_round_runner_set(run: Callable[..., object]) -> None:
    """Set the function that runs a round in inline mode (`run(trigger=...)`); the app does at start-up."""
    global _inline_round_run
    _inline_round_run = run


def scheduling_round_request(*, trigger: str) -> None:
    """Ask for a round soon (after a submission or a job's end), debounced; call after commit.

    Inline mode (embedded demo, eager Celery): run the round right here. Otherwise SET NX EX on a
    Redis key: the first request of a burst queues one round `early_round_delay_s` later, or when the
    last round's pace ends if that is later (scheduling_round_pace), and the others find the key
    taken. The task clears the key as it starts, so a request arriving while that round runs queues
    the next one (put off, if need be, by that round's pace). If Redis is unreachable the beat round
    catches up.
    """
    conf = scheduler_conf()
    if conf.inline_rounds:
        _inline_round(trigger)
        return
    try:
        debounced_send_after_pace(
            _redis(conf.redis_url),
            key=EARLY_ROUND_KEY,
            value=trigger,
            pace_key=ROUND_PACE_KEY,
            min_countdown_s=conf.early_round_delay_s,
            slack_s=EARLY_ROUND_SLACK_S,
            send=lambda delay_s: task_send(
                SCHEDULING_ROUND_TASK, kwargs={"trigger": trigger}, countdown_s=delay_s
            ),
        )
    except Exception:  # a broker outage must not fail the request that asked for the round
        logger.warning(
            "could not queue an early round (%s); the next beat round will run", trigger, exc_info=True
        )


def _inline_round(trigger: str) -> None:
    if _inline_round_run is None:
        logger.warning("inline scheduling round (%s) asked before the app was ready; skipped", trigger)
        return
    outer = getattr(_inline, "skipped_round", False)
    if trigger == "skipped" and outer:
        return  # this thread already re-runs skipped decisions: no chain of inline rounds
    _inline.skipped_round = outer or trigger == "skipped"
    try:
        _inline_round_run(trigger=trigger)
    except Exception:  # the request that asked has committed already; do not fail it
        logger.exception("inline scheduling round (%s) failed", trigger)
    finally:
        _inline.skipped_round = outer


def scheduling_round_request_on_commit(*, trigger: str) -> None:
    """Ask for an early round once the current transaction commits (nothing if it rolls back)."""
    transaction.on_commit(lambda: scheduling_round_request(trigger=trigger))


def scheduling_round_pace(duration_s: float) -> None:
    """Hold the next early round until `round_pacing` x `duration_s` from now; a round calls this after
    its commit. Under churn a job ends every second or so, each end asks for an early round, and a
    round on a thousand-node cluster takes seconds: unpaced, rounds would run back to back and take a
    core's worth of CPU from the agents' syncs. Paced, they take at most 1 / (1 + round_pacing) of the
    time, while a short round (a quiet cluster) leaves the next one to the usual debounce. Beat rounds
    keep their schedule. Inline mode: no pacing (the round runs in its caller's request)."""
    conf = scheduler_conf()
    if conf.inline_rounds or conf.round_pacing <= 0:
        return
    try:
        pace_extend(_redis(conf.redis_url), ROUND_PACE_KEY, conf.round_pacing * duration_s)
    except Exception:  # the round has committed; without the key the next round is not paced
        logger.warning("could not pace the next early round", exc_info=True)


def scheduling_round_put_off(*, trigger: str) -> bool:
    """Whether this early round's task must wait for the pace of a round that ended after it was queued
    (asked for while that round ran); if so it is queued again for the pace's end, its request key kept
    so that the requests meanwhile still find it queued. The task calls this first."""
    conf = scheduler_conf()
    if conf.inline_rounds:
        return False
    try:
        return put_off_for_pace(
            _redis(conf.redis_url),
            pace_key=ROUND_PACE_KEY,
            queued_key=EARLY_ROUND_KEY,
            queued_value=trigger,
            queued_slack_s=EARLY_ROUND_SLACK_S,
            requeue=lambda wait_s: task_send(
                SCHEDULING_ROUND_TASK, kwargs={"trigger": trigger}, countdown_s=wait_s
            ),
        )
    except Exception:  # Redis or the broker unreachable: run the round now rather than lose it
        logger.warning("could not put off a paced early round (%s); running it now", trigger, exc_info=True)
        return False


def scheduling_round_request_clear() -> None:
    """Forget the queued early round (its task is starting), so the next request queues another."""
    conf = scheduler_conf()
    if conf.inline_rounds:
        return
    try:
        _redis(conf.redis_url).delete(EARLY_ROUND_KEY)
    except Exception:
        logger.warning("could not clear the early-round key", exc_info=True)
