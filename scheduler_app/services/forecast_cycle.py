"""The refresh's forecast in parts of bounded CPU: one forecast of the live queue played over as many
refresh tasks as it takes, kept in Redis between them, each part storing the estimates it settled.

At 4,000 GPUs and 10,000 live jobs the whole forecast is some 60 core rounds, about 11 s of CPU
(docs/performance.md, "The forecast refresh at 10,000 live jobs"). One refresh that plays it whole
takes that much CPU at once; one cut at a time budget leaves most jobs without a finish. Here each
refresh task (a part) plays rounds until its CPU budget (`forecast_refresh_cpu_s`, process time) would
be overrun, stores the estimates no later round changes (the jobs that finished in the forecast), and
keeps the rest of the forecast for the next part; the last part stores everything else (jobs not
finished within the horizon, the jobs behind the window). The parts give exactly the forecast one
call gives on the same inputs (simulator/forecast.py's ForecastRun): what users are told is the whole
forecast, later by the parts' spacing, never a forecast cut short. Until a job's estimate is settled
its page shows the one stored before.

A cycle starts from the live queue as it is then; rounds committed meanwhile are not in it. They mark
ASKED_KEY (services/forecast_refresh.py), and a cycle that ends with the mark set asks for the next
one, which reads the queue again.

The cycle lives in the memory of the process that played its last part; TOKEN_KEY names the current
state (the cycle and its last part), so that a process whose copy is that state goes on from memory
with nothing unpickled or pickled (Celery's prefork gives the next part to the child that ran the
last, unless it is busy). The signed pickle in STATE_KEY is a checkpoint, written when a part starts
the cycle, when it continued one read back from Redis (the parts move between processes), and after
every CHECKPOINT_CPU_S of CPU played: a process whose copy is not the current one goes on from the
checkpoint of the same cycle, playing again the rounds played since (the same rounds: the estimates
stored again are the same, owners hear of a late finish once), or starts a new cycle when there is none.

The last part stores its estimates and records the cycle's start as the time the whole stored forecast
holds (forecast_as_of.forecast_confirm), in one transaction: what users see says as of when it holds,
and a cycle given up midway (its state expired, a worker killed, an error) confirms nothing.
"""

from __future__ import annotations

import hmac
import logging
import pickle
import time
import uuid
from dataclasses import dataclass, field
from datetime import datetime

import redis
from django.db import transaction
from django.utils import timezone
from django.utils.crypto import salted_hmac

from scheduler_app.conf import scheduler_conf
from scheduler_app.models import Job
from scheduler_app.services.forecast_as_of import forecast_confirm
from scheduler_app.services.forecast_store import Estimate, job_forecasts_store, job_positions_store
from scheduler_app.services.forecasts import (
    QueueForecast,
    live_queue,
    qos_at_risk_notify,
    queue_forecast,
    queue_positions,
)
from scheduler_app.services.gc_pause import gc_paused

logger = logging.getLogger(__name__)

# The cycle in progress (a pickle) and its token; the format's version in the name, so that a new
# release never reads an old release's pickle.
STATE_KEY = "attune:forecast-refresh:cycle:v1"
TOKEN_KEY = "attune:forecast-refresh:cycle:v1:token"
# The state is signed (HMAC-SHA256 under SECRET_KEY, this salt) before it is unpickled.
SIGNATURE_SALT = "attune.forecast-refresh.cycle"
SIGNATURE_BYTES = 32
# Set by every refresh request (a round committed): a cycle that ends with it set asks for the next.
ASKED_KEY = "attune:forecast-refresh:asked"
# Held while a part runs: a second task meanwhile (another forecasts process) leaves it alone.
LOCK_KEY = "attune:forecast-refresh:part"
# A cycle no part has continued for this long is given up (a worker down meanwhile): the next
# refresh starts from the live queue again.
STATE_TTL_S = 900
# A part that died without releasing the lock holds off the next ones this long at most.
LOCK_TTL_S = 300
# A cycle continued in memory is checkpointed to Redis after this much CPU played since the last
# checkpoint: a part moved to another process plays at most this much again, while pickling a 10,000-job
# cycle (about 0.05 s each way at 4,000 GPUs) is paid once in some five parts rather than at each.
CHECKPOINT_CPU_S = 2.0


@dataclass
class RefreshCycle:
    """One forecast of the live queue being played over several parts, and what its parts stored."""

    ready: QueueForecast
    positions: dict[int, int]  # the queue positions when it started, for rows not stored yet
    qos_job_ids: list[int]  # the jobs with a QoS target (their owners may hear of a late finish)
    token: str = ""
    stored: set[int] = field(default_factory=set)  # placeable jobs whose estimate a part stored
    parts: int = 0
    cpu_s: float = 0.0  # the parts' CPU so far (process time)
    # The CPU a part spends after its rounds (storing what it settled, keeping the cycle), as the last
    # part spent it: kept out of the rounds' share of the next part's budget.
    after_rounds_s: float = 0.0
    save_s: float = 0.0  # the last checkpoint's CPU (its pickling)
    cycle_id: str = ""  # the cycle's own id (TOKEN_KEY's first half; `token` changes with each part)
    checkpoint_cpu_s: float = 0.0  # `cpu_s` when the last checkpoint was written
    checkpoints: int = 0


@dataclass(frozen=True)
class Part:
    """What one part did: the estimates it stored; `estimates`, once the cycle is done: every
    estimate of the cycle (for the admission predictions still pending); `done`: the cycle ended;
    `asked`: a round was committed since it started (the next cycle is due); `cpu_s`: its CPU."""

    stored: dict[int, Estimate]
    estimates: dict[int, Estimate] | None
    done: bool
    asked: bool
    cpu_s: float
    started: bool  # this part read the queue and started the cycle
    rounds: int = 0  # the forecast's rounds it played (0: its budget was less than the next round's cost)


# The cycle this process played last (its next part, when it comes here, needs no unpickling).
_local: RefreshCycle | None = None


def refresh_part(
    client: redis.Redis,
    *,
    cpu_s: float,
    now: datetime | None = None,
    must_play: bool = True,
    limit_s: float | None = None,
) -> Part | None:
    """Play the refresh's next part: start a cycle from the live queue when none is in progress, play
    it until `cpu_s` of this process's CPU (counted from this call) would be overrun by the next round,
    and store what it settled. A part that continues a cycle plays its first round even when it would
    pass `cpu_s`: always with `must_play`, else when it would not pass `limit_s` (default `cpu_s`;
    what the caller can spend at most, the rest of the round interval's CPU). None when another part
    holds the lock (it will go on)."""
    cpu_start = time.process_time()
    lock = uuid.uuid4().hex
    if not client.set(LOCK_KEY, lock, nx=True, ex=LOCK_TTL_S):
        return None
    try:
        limit = cpu_start + (cpu_s if limit_s is None else max(cpu_s, limit_s))
        return _part(client, cpu_start, cpu_start + cpu_s, now, must_play=must_play, limit=limit)
    except Exception:
        # A cycle that failed once (a bug, a cycle another release left) would fail every part
        # until it expires: the next part starts from the queue instead.
        refresh_cycle_drop(client)
        raise
    finally:
        if _bytes_text(client.get(LOCK_KEY)) == lock:
            client.delete(LOCK_KEY)


def refresh_cycle_drop(client: redis.Redis) -> None:
    """Give up the cycle in progress (the next part starts one from the live queue)."""
    refresh_cycle_forget()
    client.delete(TOKEN_KEY)
    client.delete(STATE_KEY)


def refresh_cycle_forget() -> None:
    """Forget the copy of the cycle this process keeps: its next part reads the cycle back from Redis,
    as a part on the other forecasts process does (benches and tests)."""
    global _local
    _local = None


def _part(
    client: redis.Redis,
    cpu_start: float,
    deadline: float,
    now: datetime | None,
    *,
    must_play: bool,
    limit: float,
) -> Part:
    cycle, from_memory = _load(client)
    started = cycle is None
    if cycle is None:
        # Before the queue is read: a round committed from here on is not in this cycle.
        client.delete(ASKED_KEY)
        cycle = _start(now or timezone.now())
    ready, run = cycle.ready, cycle.ready.run
    k_before = run.k if run is not None else 0
    # Decided before the rounds, so that the budget keeps room for the pickling only when it is due.
    checkpoint = (
        not from_memory or cycle.cpu_s - cycle.checkpoint_cpu_s + (deadline - cpu_start) >= CHECKPOINT_CPU_S
    )
    after_s = cycle.after_rounds_s + (cycle.save_s if checkpoint else 0.0)
    deadline -= after_s
    limit -= after_s
    if run is not None and not run.done:
        first = not started  # a part that only continues moves the forecast on when it can

        def stop(round_s: float) -> bool:
            nonlocal first
            used_s = time.process_time()
            if first:
                first = False
                # A round's cost is not known before one is played (the first costs 0.6 s at 4,000
                # GPUs): only a part that must play one plays it then.
                if must_play or (round_s and used_s + round_s <= limit):
                    return False
            if not round_s:
                if not started:
                    return True  # the first round of a continued cycle, not a must: unknown cost
                round_s = used_s - cpu_start  # no round played yet: one costs about what reading its jobs did
            return used_s + round_s > deadline

        with gc_paused():  # as live_forecast's (services/forecasts.py)
            run.play(stop)
    rounds_end = time.process_time()
    done = run is None or run.done
    placeable = set(ready.placeable)
    estimates = None
    if done:
        played = _estimates(ready, ready.placeable)
        stored = {job_id: e for job_id, e in played.items() if job_id not in cycle.stored}
        stored.update(ready.behind_estimates(played))
        estimates = {**ready.known, **played, **stored}
    else:
        stored = _estimates(ready, sorted((run.settled() & placeable) - cycle.stored))
    with transaction.atomic():
        job_forecasts_store(stored, now=ready.now, new_positions=cycle.positions, live_only=True)
        if done:
            # Every estimate now is this cycle's: those it left unchanged hold as of its start too
            # (one row, not a rewrite of every row: services/forecast_as_of.py). A cycle given up
            # before its last part confirms nothing; the rows its parts changed say their own time.
            forecast_confirm(ready.now)
    cycle.stored.update(stored.keys() & placeable)
    _qos_notify(cycle, stored)
    cycle.parts += 1
    cycle.cpu_s += time.process_time() - cpu_start
    asked = False
    if done:
        asked = client.get(ASKED_KEY) is not None
        refresh_cycle_drop(client)
        logger.info(
            "forecast refresh: a cycle of %d parts, %.2f s of CPU, %d live jobs",
            cycle.parts,
            cycle.cpu_s,
            len(estimates or {}),
        )
    else:
        cycle.after_rounds_s = time.process_time() - rounds_end
        if checkpoint:
            save_start = time.process_time()
            _checkpoint(client, cycle)
            cycle.save_s = time.process_time() - save_start
        else:
            _keep(client, cycle)
    rounds = (run.k if run is not None else 0) - k_before
    return Part(stored, estimates, done, asked, time.process_time() - cpu_start, started, rounds)


def _estimates(ready: QueueForecast, job_ids: list[int]) -> dict[int, Estimate]:
    """The estimates of placeable jobs from the forecast as played (never cut short: played whole)."""
    if ready.run is None:
        return {}
    return ready.estimates(ready.run.results(job_ids), job_ids, cut_short=False, budget_s=0.0)


def _start(now: datetime) -> RefreshCycle:
    """A cycle from the live queue: the forecast made ready, the estimates known without playing it
    and the queue positions stored at once."""
    conf = scheduler_conf()
    queue = live_queue()
    ready = queue_forecast(now=now, window_jobs=conf.forecast_window_jobs, queue=queue)
    positions = queue_positions(queue, now=now)
    job_forecasts_store(ready.known, now=now, positions=positions)  # and the ended jobs' rows dropped
    job_positions_store(positions)
    qos = [j.pk for j in queue.jobs if j.qos_deadline_at is not None or j.qos_max_latency_s is not None]
    return RefreshCycle(ready=ready, positions=positions, qos_job_ids=qos)


def _qos_notify(cycle: RefreshCycle, stored: dict[int, Estimate]) -> None:
    ids = [job_id for job_id in cycle.qos_job_ids if job_id in stored]
    if ids:  # the jobs read again: one may have ended since the cycle read the queue
        qos_at_risk_notify(list(Job.objects.filter(pk__in=ids)), stored)


def _load(client: redis.Redis) -> tuple[RefreshCycle | None, bool]:
    """The cycle in progress and whether it is this process's copy (False: read back from the
    checkpoint); (None, False) when there is none to go on with."""
    global _local
    token = _bytes_text(client.get(TOKEN_KEY))
    if token is None:
        return None, False
    if _local is not None and _local.token == token:
        return _local, True
    _local = None  # another process played on: this copy is behind
    payload = _verified(client.get(STATE_KEY))
    try:
        cycle = pickle.loads(payload) if payload is not None else None
    except Exception:  # written by another release, or cut: start again from the queue
        logger.warning("could not read the forecast refresh's cycle; starting a new one", exc_info=True)
        cycle = None
    # The checkpoint of the current cycle (the token's first half), maybe some parts behind it.
    if not isinstance(cycle, RefreshCycle) or not cycle.cycle_id or token.split(":")[0] != cycle.cycle_id:
        return None, False
    _local = cycle
    return cycle, False


def _keep(client: redis.Redis, cycle: RefreshCycle) -> None:
    """Name this process's copy as the current state (a new token); nothing pickled."""
    global _local
    if not cycle.cycle_id:
        cycle.cycle_id = uuid.uuid4().hex
    cycle.token = f"{cycle.cycle_id}:{uuid.uuid4().hex}"
    client.set(TOKEN_KEY, cycle.token, ex=STATE_TTL_S)
    client.expire(STATE_KEY, STATE_TTL_S)  # the checkpoint lives as long as the cycle goes on
    _local = cycle


def _checkpoint(client: redis.Redis, cycle: RefreshCycle) -> None:
    """Keep the cycle (as _keep) and write it, signed, to STATE_KEY for another process to go on with."""
    global _local
    if not cycle.cycle_id:
        cycle.cycle_id = uuid.uuid4().hex
    cycle.token = f"{cycle.cycle_id}:{uuid.uuid4().hex}"
    cycle.checkpoint_cpu_s = cycle.cpu_s
    cycle.checkpoints += 1
    payload = pickle.dumps(cycle, protocol=pickle.HIGHEST_PROTOCOL)
    client.set(STATE_KEY, _signature(payload) + payload, ex=STATE_TTL_S)
    client.set(TOKEN_KEY, cycle.token, ex=STATE_TTL_S)  # after the state: a token always has its state
    _local = cycle


def _signature(payload: bytes) -> bytes:
    """The payload's HMAC under the project's SECRET_KEY: only the service's own processes can write a
    state this module unpickles (Redis may be reachable by more than them; pickle runs code)."""
    return salted_hmac(SIGNATURE_SALT, payload, algorithm="sha256").digest()


def _verified(blob: bytes | None) -> bytes | None:
    """The pickle in a stored state, None where its signature does not match (tampered, cut, or written
    under another SECRET_KEY)."""
    if blob is None:
        return None
    signature, payload = blob[:SIGNATURE_BYTES], blob[SIGNATURE_BYTES:]
    if hmac.compare_digest(signature, _signature(payload)):
        return payload
    logger.warning("the forecast refresh's stored cycle is not signed by this service; starting a new one")
    return None


def _bytes_text(value: bytes | str | None) -> str | None:
    return value.decode() if isinstance(value, bytes) else value
