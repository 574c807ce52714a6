"""The live scheduling round: lock, snapshot, engine.schedule_round, apply the plan in one transaction."""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timedelta

from django.db import connection, transaction
from django.utils import timezone

from cluster_app.prepared_sql import prepared_statements
from cluster_app.selectors import servers_lock_all
from cluster_app.services import server_states_refresh
from config.redis_pool import redis_client as _redis
from scheduler_app.conf import scheduler_conf
from scheduler_app.core.engine import schedule_round
from scheduler_app.models import (
    RoundDecision,
    SchedulingRound,
)
from scheduler_app.selectors import (
    borrowing_teams,
    round_inputs,
    round_jobs_read,
    server_busy_gpus,
    team_quotas_left,
)
from scheduler_app.services.forecast_refresh import job_forecasts_refresh_request_on_commit
from scheduler_app.services.jobs import job_dependencies_hold
from scheduler_app.services.pacing import pace_extend, pace_left_s, put_off_for_pace
from scheduler_app.services.profiling import profiling_jobs_hold, profiling_runs_dispatch
from scheduler_app.services.round_apply import round_plan_apply, round_plan_recheck

logger = logging.getLogger(__name__)

# Key of the PostgreSQL advisory lock that makes rounds single-flight ("Attune01" as an integer).
ROUND_LOCK_KEY = int.from_bytes(b"Attune01", "big") & 0x7FFF_FFFF_FFFF_FFFF
# Redis key that debounces early rounds: set while one is queued and not yet started.
EARLY_ROUND_KEY = "attune:early-round"
# Redis key set as a round ends (workers' mode), expiring `round_pacing` x its duration later: an early
# round is not started before it expires (see scheduling_round_pace).
ROUND_PACE_KEY = "attune:early-round:paced"
# How long a queued early round's key outlives its countdown, in case its task is lost.
EARLY_ROUND_SLACK_S = 60
# SQLite (the embedded demo) has no advisory locks; one process serves it, so a process-local lock
# gives the same single-flight guarantee there.
_local_round_lock = threading.Lock()
# Inline mode: whether this thread is running the round that re-decides a round's skipped jobs.
_inline = threading.local()


@contextmanager
def _single_flight() -> Iterator[bool]:
    """Open the round's transaction and try to take the round lock; yields whether it was taken.

    PostgreSQL: pg_try_advisory_xact_lock, released by the database itself when the transaction ends
    (commit, rollback or a dead worker's dropped connection), so a crashed round can never wedge the
    scheduler. Elsewhere: a non-blocking process-local lock.
    """
    if connection.vendor == "postgresql":
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute("SELECT pg_try_advisory_xact_lock(%s)", [ROUND_LOCK_KEY])
            yield bool(cursor.fetchone()[0])
        return
    acquired = _local_round_lock.acquire(blocking=False)
    try:
        with transaction.atomic():
            yield acquired
    finally:
        if acquired:
            _local_round_lock.release()


def scheduling_round_run(*, trigger: str = "beat") -> SchedulingRound | None:
    """Run one live scheduling round; None if another round holds the lock (single-flight).

    1. Take the round lock (see _single_flight) inside the round's one transaction.
    2. Lock every server row, read every PENDING/RUNNING job row without locking it, leave out
       the jobs waiting for their workload's profile and give queued profiling runs what running
       leases leave free (services/profiling.py), and build the snapshot and job views through
       selectors (round mode: a schedulable server is all free, less what profiling runs hold).
    3. engine.schedule_round with the configured policy and allocator.
    4. Lock the rows of the jobs the plan writes (after the servers': the shared lock order) and read
       them again; the decisions of jobs that changed meanwhile are skipped, and so are those that
       counted on them (round_plan_recheck). Agents' reports thus wait only for the locks of the
       apply step, not for the whole round.
    5. Apply the plan (services/round_apply.py): unchanged placements keep their lease; moved or
       unplaced running jobs are preempted (leases ended, GPUs released); new placements get Allocation rows.
    6. Store the SchedulingRound, a RoundDecision per job decided and a JobEvent per state change; give
       profiling runs still queued what the plan left free; refresh server states. If decisions were
       skipped, ask for an early round for them.
    7. After commit, the agents of the servers that got new leases are woken (cluster_app/agent_wake.py)
       and sync at once; those whose leases ended are woken by allocations_end.
    8. After commit, ask for a refresh of every live job's forecast (services/forecast_refresh.py).
    """
    with _single_flight() as acquired:
        if not acquired:
            logger.info("scheduling round (%s) skipped: another round is running", trigger)
            return None
        with prepared_statements():
            sround = _round(trigger)
        duration_s = sround.duration_ms / 1000.0
        transaction.on_commit(lambda: scheduling_round_pace(duration_s))
        # Not here but on the `forecasts` queue, debounced: playing a whole queue forward costs many
        # rounds, and a burst of rounds must not wait behind forecasts on the rounds' worker. After
        # commit, so that the forecast reads what this round decided.
        job_forecasts_refresh_request_on_commit(trigger=trigger)
    return sround


def _round(trigger: str) -> SchedulingRound:
    conf = scheduler_conf()
    t0 = time.perf_counter()
    servers = servers_lock_all()
    jobs = round_jobs_read()  # rows, not model instances; not locked: see round_jobs_read
    now = timezone.now()
    # Jobs whose workload is being profiled wait out of the round. Synergy profiles on arrival, so
    # queued runs take what running leases leave free before this round places anything new.
    # Held jobs (scontrol hold) are out, their reason set when they were held; so are jobs waiting
    # for their dependencies (afterok), whose workloads are profiled meanwhile.
    jobs = [job for job in jobs if not job.held]
    waiting = job_dependencies_hold(jobs=jobs, now=now)
    held = waiting | profiling_jobs_hold(jobs=jobs, servers=servers, now=now, held_otherwise=waiting)
    jobs = [job for job in jobs if job.pk not in held]
    profiling_runs_dispatch(now=now, genie=False)  # GENIE's runs gate no job: leftovers only, below
    inputs = round_inputs(servers=servers, jobs=jobs)
    plan = schedule_round(
        inputs.snapshot,
        inputs.views,
        policy=conf.policy,
        allocator=conf.allocator,
        now_s=now.timestamp(),
        team_quota_gpus=team_quotas_left(jobs=jobs, frozen_job_ids=inputs.frozen_job_ids),
        borrowing_teams=borrowing_teams(),
    )
    all_gpus = sum(s.num_gpus for s in servers)
    skipped = round_plan_recheck(inputs, plan.decisions, all_gpus=all_gpus)
    started_at = now
    # The writes are dated once the round holds the rows it writes: a job that finished while the round
    # computed released its GPUs at the finish's own time, and a lease on those GPUs must not start
    # before it (the fault tests check that no two holds of a GPU overlap in time).
    now = timezone.now()
    sround = SchedulingRound.objects.create(
        started_at=started_at,
        policy=conf.policy,
        allocator=conf.allocator,
        trigger=trigger,
        num_runnable=len(inputs.views),
    )
    counts = round_plan_apply(
        sround,
        inputs,
        plan.decisions,
        now=now,
        names={s.id: s.name for s in servers},
        all_gpus=all_gpus,
        skipped=skipped,
    )
    if skipped:
        # Their jobs changed while the plan was computed (mostly: they ended); the next round decides them.
        scheduling_round_request_on_commit(trigger="skipped")
    # Runs still queued get what the plan left free (preempted or moved jobs), under this round's lock.
    profiling_runs_dispatch(now=now)
    server_states_refresh(busy_gpus=server_busy_gpus())
    sround.duration_ms = (time.perf_counter() - t0) * 1000.0
    for name, value in counts.items():
        setattr(sround, name, value)
    sround.save(update_fields=["duration_ms", *counts])
    summary = (
        f"round {sround.pk} ({trigger}, {conf.policy}/{conf.allocator}): {len(inputs.views)} runnable, "
        f"{counts['num_placed']} placed, {counts['num_pending']} pending, {counts['num_infeasible']} "
        f"infeasible, {counts['num_preempted']} preempted, {len(skipped)} skipped, "
        f"{sround.duration_ms:.0f} ms"
    )
    transaction.on_commit(lambda: logger.info(summary))
    return sround


# ---------------------------------------------------------------------------------------------------
# Early rounds
# ---------------------------------------------------------------------------------------------------


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
        outer = getattr(_inline, "skipped_round", False)
        if trigger == "skipped" and outer:
            return  # this thread already re-runs skipped decisions: no chain of inline rounds
        _inline.skipped_round = outer or trigger == "skipped"
        try:
            scheduling_round_run(trigger=trigger)
        except Exception:  # the request that asked has committed already; do not fail it
            logger.exception("inline scheduling round (%s) failed", trigger)
        finally:
            _inline.skipped_round = outer
        return
    try:
        client = _redis(conf.redis_url)
        delay = max(conf.early_round_delay_s, pace_left_s(client, ROUND_PACE_KEY))
        if not client.set(
            EARLY_ROUND_KEY, trigger, nx=True, ex=max(1, math.ceil(delay) + EARLY_ROUND_SLACK_S)
        ):
            return
        from scheduler_app.tasks import scheduling_round_task

        scheduling_round_task.apply_async(kwargs={"trigger": trigger}, countdown=delay)
    except Exception:  # a broker outage must not fail the request that asked for the round
        logger.warning(
            "could not queue an early round (%s); the next beat round will run", trigger, exc_info=True
        )


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
    from scheduler_app.tasks import scheduling_round_task

    try:
        return put_off_for_pace(
            _redis(conf.redis_url),
            pace_key=ROUND_PACE_KEY,
            queued_key=EARLY_ROUND_KEY,
            queued_value=trigger,
            queued_slack_s=EARLY_ROUND_SLACK_S,
            requeue=lambda wait_s: scheduling_round_task.apply_async(
                kwargs={"trigger": trigger}, countdown=wait_s
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


def round_decisions_prune(*, now: datetime | None = None) -> int:
    """Delete the per-job decisions of rounds older than the retention period; returns how many.

    The rounds themselves (counts, policy, allocator, timings) are kept for the dashboards; what a
    job holds is in its allocations and its history in its events, both kept.
    """
    now = now or timezone.now()
    before = now - timedelta(days=scheduler_conf().round_decision_retention_days)
    deleted, _ = RoundDecision.objects.filter(round__started_at__lt=before).delete()
    return deleted
