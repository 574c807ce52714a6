"""Refresh of every live job's forecast after rounds: one debounced Celery task on the `forecasts` queue."""

from __future__ import annotations

import logging
import math

from celery import current_app
from django.db import transaction

from config.redis_pool import redis_client as _redis
from scheduler_app.conf import scheduler_conf
from scheduler_app.services.forecasts import job_forecasts_refresh

logger = logging.getLogger(__name__)

# By name: services never import tasks (tasks import services). Routed to the `forecasts` queue
# (CELERY_TASK_ROUTES), so that a whole-queue forecast never holds up the rounds' worker.
REFRESH_TASK = "scheduler_app.tasks.forecast_refresh_task"
# Set while a refresh is queued and not yet started: the requests of a burst of rounds find it taken.
QUEUED_KEY = "attune:forecast-refresh"
# Set as a refresh starts, expiring min_interval_s later: while it lives, the next refresh waits for it.
LAST_START_KEY = "attune:forecast-refresh:last"
# How long a queued refresh may wait past its countdown before its key (and the message) is given up:
# a task lost with a dead broker must not block refreshes for long.
QUEUED_SLACK_S = 60


def job_forecasts_refresh_request(*, trigger: str) -> None:
    """Ask for a refresh of every live job's forecast (services/forecasts.py), debounced; call after the
    round's commit.

    Inline mode (embedded demo, eager Celery): there is no worker, so refresh right here, as before.
    Otherwise SET NX EX on QUEUED_KEY: the first request of a burst queues one refresh task, at once
    when none started within `forecast_refresh_min_interval_s`, else when that interval is over (the
    rest of LAST_START_KEY's life); the other requests find the key taken, and the queued task, which
    reads the queue when it starts, covers their rounds too. The task clears the key as it starts, so a
    round committed during a refresh queues the next one: no round is left out of the forecast. If
    Redis or the broker is unreachable the next round's request tries again.
    """
    conf = scheduler_conf()
    if conf.inline_rounds:
        try:
            job_forecasts_refresh()
        except Exception:  # the round has committed; a failed forecast must not fail its caller
            logger.exception("inline forecast refresh (%s) failed", trigger)
        return
    try:
        client = _redis(conf.redis_url)
        countdown_s = max(0, client.pttl(LAST_START_KEY)) / 1000.0  # -2: no key, -1: no expiry
        ttl_s = max(1, math.ceil(countdown_s) + QUEUED_SLACK_S)
        if not client.set(QUEUED_KEY, trigger, nx=True, ex=ttl_s):
            return
        current_app.send_task(REFRESH_TASK, countdown=countdown_s, expires=countdown_s + QUEUED_SLACK_S)
    except Exception:  # a broker outage must not fail the round that asked
        logger.warning(
            "could not queue a forecast refresh (%s); the next round asks again", trigger, exc_info=True
        )


def job_forecasts_refresh_request_on_commit(*, trigger: str) -> None:
    """Ask for a refresh once the current transaction commits (nothing if it rolls back)."""
    transaction.on_commit(lambda: job_forecasts_refresh_request(trigger=trigger))


def job_forecasts_refresh_started() -> None:
    """Mark a refresh as starting (its task calls this first): the next one waits min_interval_s from
    now, and a request from here on queues it."""
    conf = scheduler_conf()
    if conf.inline_rounds:
        return
    try:
        client = _redis(conf.redis_url)
        # In this order: a request between the two calls finds the key still taken, and this refresh,
        # which reads the queue after both, covers its round; the other order would let it queue a
        # second refresh at once, beside this one.
        interval_ms = int(conf.forecast_refresh_min_interval_s * 1000)
        if interval_ms > 0:
            client.set(LAST_START_KEY, "1", px=interval_ms)
        client.delete(QUEUED_KEY)
    except Exception:
        logger.warning("could not update the forecast refresh keys", exc_info=True)
