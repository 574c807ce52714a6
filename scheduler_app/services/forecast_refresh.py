"""Refresh of every live job's forecast after rounds: one debounced Celery task on the `forecasts` queue."""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass

from django.db import transaction

from config.redis_pool import redis_client as _redis
from infra.task_send import task_send
from scheduler_app.conf import scheduler_conf
from scheduler_app.services.admission_worker import (
    admission_forecasts_run,
    admission_forecasts_waiting,
    admission_predictions_fill,
)
from scheduler_app.services.forecast_cycle import ASKED_KEY, STATE_TTL_S, TOKEN_KEY, refresh_part
from scheduler_app.services.forecasts import job_forecasts_refresh_estimates
from scheduler_app.services.pacing import (
    cpu_window_charged,
    cpu_window_left_s,
    debounced_send,
    pace_extend,
    pace_left_s,
    put_off_for_pace,
)
from scheduler_app.task_names import FORECAST_REFRESH_TASK

logger = logging.getLogger(__name__)

# By name: services never import tasks (tasks import services). Routed to the `forecasts` queue
# (CELERY_TASK_ROUTES), so that a whole-queue forecast never holds up the rounds' worker.
REFRESH_TASK = FORECAST_REFRESH_TASK
# Set while a refresh is queued and not yet started: the requests of a burst of rounds find it taken.
QUEUED_KEY = "attune:forecast-refresh"
# Set as a refresh starts, expiring min_interval_s later: while it lives, the next refresh waits for it.
LAST_START_KEY = "attune:forecast-refresh:last"
# How long a queued refresh may wait past its countdown before its key (and the message) is given up:
# a task lost with a dead broker must not block refreshes for long.
QUEUED_SLACK_S = 60
# How long a request's mark lives (a cycle longer than this would miss the round that set it).
ASKED_TTL_S = 3600
# The CPU the parts spent in the current round interval ("index:seconds", pacing.cpu_window_*).
CPU_WINDOW_KEY = "attune:forecast-refresh:cpu-window"
# What the last part that started a cycle cost (CPU seconds): what the next start is expected to.
START_CPU_KEY = "attune:forecast-refresh:start-cpu"


def job_forecasts_refresh_request(*, trigger: str) -> None:
    """Ask for a refresh of every live job's forecast (services/forecasts.py), debounced; call after the
    round's commit.

    Inline mode (embedded demo, eager Celery): there is no worker, so refresh right here, as before.
    Otherwise mark ASKED_KEY (a cycle in progress started before this round: the next one is due when
    it ends) and SET NX EX on QUEUED_KEY: the first request of a burst queues one refresh task, at once
    when none started within `forecast_refresh_min_interval_s`, else when that interval is over (the
    rest of LAST_START_KEY's life); the other requests find the key taken, and the queued task, which
    reads the queue when it starts a cycle, covers their rounds too. The task clears the key as it
    starts, so a round committed during a refresh queues the next one: no round is left out of the
    forecast. If Redis or the broker is unreachable the next round's request tries again.
    """
    conf = scheduler_conf()
    if conf.inline_rounds:
        try:
            _refresh()
        except Exception:  # the round has committed; a failed forecast must not fail its caller
            logger.exception("inline forecast refresh (%s) failed", trigger)
        return
    try:
        client = _redis(conf.redis_url)
        client.set(ASKED_KEY, trigger, ex=ASKED_TTL_S)
        _queue(client, trigger)
    except Exception:  # a broker outage must not fail the round that asked
        logger.warning(
            "could not queue a forecast refresh (%s); the next round asks again", trigger, exc_info=True
        )


def _queue(client, trigger: str) -> None:
    """Queue one refresh task when the pace allows, unless one is queued already (QUEUED_KEY)."""
    countdown_s = pace_left_s(client, LAST_START_KEY)
    debounced_send(
        client,
        key=QUEUED_KEY,
        value=trigger,
        countdown_s=countdown_s,
        slack_s=QUEUED_SLACK_S,
        send=lambda: task_send(REFRESH_TASK, countdown_s=countdown_s, expires_s=countdown_s + QUEUED_SLACK_S),
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


def job_forecasts_refresh_run() -> int:
    """The refresh task's body: the refresh's next part (services/forecast_cycle.py), unless the last
    one's pace puts it off; returns how many estimates were stored (0 when put off).

    Paced: once a part of d seconds ends, the next starts no sooner than `forecast_refresh_pacing` x d
    later (a part that starts a cycle also no sooner than the minimum interval after its start, as
    before). A part on a loaded host takes seconds of wall time for its CPU, and at a fixed interval
    the refresh would take a share of the CPU that grows with the load, from the syncs and rounds that
    need it most; paced, it takes at most 1 / (1 + pacing) of one process's time, and the times shown
    lag a little more on a busy cluster. A task queued during a part (its countdown read from the
    start's mark) is put off again when the pace set at that part's end runs longer, keeping
    QUEUED_KEY, so that requests meanwhile still find it queued. A part that leaves the cycle
    unfinished queues the next at its pace; a cycle that ends after a round was committed (ASKED_KEY)
    queues the next cycle the same way.

    Bounded per round interval (refresh_part_budget): the parts spend at most
    `forecast_refresh_cpu_per_round_s` of CPU per `round_s` together, so a deep queue's cycle spans
    several rounds (its estimates are as old as the cycle's start), while a cycle that costs less
    still follows every round.
    """
    if _put_off():
        return 0
    conf = scheduler_conf()
    budget = PartBudget(conf.forecast_refresh_cpu_s, True, conf.forecast_refresh_cpu_s, 0.0)
    if not conf.inline_rounds:
        client = _redis(conf.redis_url)
        budget = refresh_part_budget(client, now_s=time.time())
        if budget.wait_s > 0:  # the round interval's CPU is spent: the part waits for the next interval
            pace_extend(client, LAST_START_KEY, budget.wait_s)
            if _put_off():
                return 0
            # The next interval is a moment away (within the pace's slack): its budget.
            budget = refresh_part_budget(client, now_s=time.time() + budget.wait_s)
    job_forecasts_refresh_started()
    # Submissions waiting for their first estimate go first: the refresh would fill them too, but
    # only at its end, seconds later on a deep queue (its budget is the longer one), while the
    # admission forecast queued for them waits behind it on this worker.
    if admission_forecasts_waiting():
        admission_forecasts_run()
    if conf.inline_rounds:  # an eager task without a worker: the whole refresh, as inline
        return _refresh()
    t0, started_s = time.perf_counter(), time.time()
    part = refresh_part(client, cpu_s=budget.cpu_s, must_play=budget.must_play, limit_s=budget.limit_s)
    if part is None:
        return 0  # another part is playing; it queues what follows
    if part.done:
        admission_predictions_fill(part.estimates or {})
    _pace(time.perf_counter() - t0, continued=not part.started)
    try:
        wait_s = refresh_cpu_charge(
            client,
            started_s=started_s,
            cpu_s=part.cpu_s,
            now_s=time.time(),
            rest_of_interval=not (part.done or part.started or part.rounds),
            cycle_start=part.started,
        )
        if wait_s > 0:  # the next part waits for the next interval (the countdown _queue reads)
            pace_extend(client, LAST_START_KEY, wait_s)
    except Exception:
        logger.warning("could not count the forecast refresh's CPU", exc_info=True)
    if not part.done or part.asked:
        try:
            _queue(client, "continue" if not part.done else "asked")
        except Exception:
            logger.warning("could not queue the forecast refresh's next part", exc_info=True)
    return len(part.stored)


@dataclass(frozen=True)
class PartBudget:
    """The next part's CPU budget, whether it must play a round and what it may spend at most (as
    refresh_part's `cpu_s`, `must_play`, `limit_s`), or how long it must wait (`wait_s` > 0)."""

    cpu_s: float
    must_play: bool
    limit_s: float
    wait_s: float


def refresh_part_budget(client, *, now_s: float) -> PartBudget:
    """The next part's budget in the round interval's CPU (`forecast_refresh_cpu_per_round_s` per
    `round_s`): a part plays rounds within `forecast_refresh_cpu_s` and what is left of the interval,
    its first round also past `forecast_refresh_cpu_s` if it fits what is left (a round costs up to
    0.6 s at 4,000 GPUs: a part must be able to play it) and always in an interval's first part (so
    the forecast moves on however costly its rounds); with less than half a part's budget left, or the
    interval spent, the part waits for the next interval, as Slurm's backfill resumes its pass after
    bf_max_time."""
    conf = scheduler_conf()
    cpu_s, cap_s = conf.forecast_refresh_cpu_s, conf.forecast_refresh_cpu_per_round_s
    if cap_s <= 0:
        return PartBudget(cpu_s, True, cpu_s, 0.0)
    left_s, next_s = cpu_window_left_s(
        client.get(CPU_WINDOW_KEY), now_s=now_s, cap_s=cap_s, window_s=conf.round_s
    )
    if left_s >= cap_s:  # the interval's first part: a round at least, whatever it costs
        return PartBudget(min(cpu_s, cap_s), True, cap_s, 0.0)
    # A later part keeps half a part's budget in reserve: where many jobs finish at once a round
    # costs more than the costliest of the last 8 (up to 0.6 s against 0.2 at 4,000 GPUs,
    # docs/performance.md), and what it passes its prediction by must not pass the cap.
    limit_s = left_s - min(cpu_s, cap_s) / 2
    if limit_s < min(cpu_s, cap_s) / 2:
        return PartBudget(0.0, False, 0.0, next_s)
    if client.get(TOKEN_KEY) is None:
        # The part starts a cycle: it reads the live queue whatever its budget (0.3 to 0.5 s at
        # 10,000 live jobs), so it starts only where what the last start cost fits what is left.
        start_cpu_s = float(client.get(START_CPU_KEY) or cpu_s)
        if start_cpu_s > limit_s:
            return PartBudget(0.0, False, 0.0, next_s)
    return PartBudget(min(cpu_s, limit_s), False, limit_s, 0.0)


def refresh_cpu_charge(
    client,
    *,
    started_s: float,
    cpu_s: float,
    now_s: float,
    rest_of_interval: bool = False,
    cycle_start: bool = False,
) -> float:
    """Count a part's CPU in the round interval it started in; returns how long the next part must wait
    for the next interval (0: it may go on in this one). `rest_of_interval`: the part played no round
    (what was left is less than the next round's cost), so the next waits for the next interval
    rather than trying again on what is left. `cycle_start`: the part started a cycle (its CPU is
    what the next start is expected to cost)."""
    conf = scheduler_conf()
    cap_s, window_s = conf.forecast_refresh_cpu_per_round_s, conf.round_s
    if cap_s <= 0:
        return 0.0
    if cycle_start:
        client.set(START_CPU_KEY, f"{cpu_s:.6f}", ex=STATE_TTL_S)
    stored = client.get(CPU_WINDOW_KEY)
    if rest_of_interval:
        left_s, _ = cpu_window_left_s(stored, now_s=started_s, cap_s=cap_s, window_s=window_s)
        cpu_s = max(cpu_s, left_s)  # the interval counted as spent (nothing carried past the cap)
    charged = cpu_window_charged(stored, now_s=started_s, cap_s=cap_s, window_s=window_s, cpu_s=cpu_s)
    client.set(CPU_WINDOW_KEY, charged, ex=max(1, math.ceil(2 * window_s)))
    return refresh_part_budget(client, now_s=now_s).wait_s


def _refresh() -> int:
    """Re-forecast the live queue whole (the inline refresh); the same forecast fills any admission
    prediction still pending."""
    estimates = job_forecasts_refresh_estimates()
    admission_predictions_fill(estimates)
    return len(estimates)


def _put_off() -> bool:
    conf = scheduler_conf()
    if conf.inline_rounds:
        return False
    try:
        return put_off_for_pace(
            _redis(conf.redis_url),
            pace_key=LAST_START_KEY,
            queued_key=QUEUED_KEY,
            queued_value="paced",
            queued_slack_s=QUEUED_SLACK_S,
            requeue=lambda wait_s: task_send(
                REFRESH_TASK, countdown_s=wait_s, expires_s=wait_s + QUEUED_SLACK_S
            ),
        )
    except Exception:  # Redis or the broker unreachable: refresh now rather than not at all
        logger.warning("could not put off a paced forecast refresh; refreshing now", exc_info=True)
        return False


def _pace(duration_s: float, *, continued: bool = False) -> None:
    conf = scheduler_conf()
    if conf.inline_rounds or conf.forecast_refresh_pacing <= 0:
        return
    try:
        client = _redis(conf.redis_url)
        pace_s = conf.forecast_refresh_pacing * duration_s
        if continued:
            # A part that went on with a cycle: the next waits for its pace alone, not for the
            # minimum interval since its start (which spaces out the cycles' starts, the queue reads).
            client.set(LAST_START_KEY, "1", px=max(1, int(pace_s * 1000)))
        else:
            # The longer of the two: the minimum interval since this refresh's start, the pace from its end.
            pace_extend(client, LAST_START_KEY, pace_s)
    except Exception:
        logger.warning("could not pace the next forecast refresh", exc_info=True)
