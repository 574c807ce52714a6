"""The live scheduling round: lock, snapshot, engine.schedule_round, apply the plan in one transaction."""

from __future__ import annotations

import logging
import time
from datetime import datetime, timedelta

from django.db import transaction
from django.utils import timezone

from cluster_app.selectors import servers_lock_all
from cluster_app.services import server_states_refresh
from infra.prepared_sql import prepared_statements
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
from scheduler_app.services.array_limits import array_limits_hold
from scheduler_app.services.forecast_refresh import job_forecasts_refresh_request_on_commit
from scheduler_app.services.gc_pause import gc_paused
from scheduler_app.services.jobs import job_dependencies_hold
from scheduler_app.services.live_queue import live_restarts
from scheduler_app.services.profiling import profiling_jobs_hold, profiling_runs_dispatch
from scheduler_app.services.round_apply import round_plan_apply, round_plan_recheck
from scheduler_app.services.round_lock import round_lock_single_flight
from scheduler_app.services.round_requests import scheduling_round_pace, scheduling_round_request_on_commit

logger = logging.getLogger(__name__)


def scheduling_round_run(*, trigger: str = "beat") -> SchedulingRound | None:
    """Run one live scheduling round; None if another round holds the lock (single-flight).

    1. Take the round lock (services/round_lock.py) inside the round's one transaction.
    2. Lock every server row, read every PENDING/RUNNING job row without locking it, leave out
       the jobs waiting for their workload's profile and give queued profiling runs what running
       leases leave free (services/profiling.py), and build the snapshot and job views through
       selectors (round mode: a schedulable server is all free, less what profiling runs hold).
    3. engine.schedule_round with the configured policy and allocator.
    4. Lock the rows of the jobs the plan writes (after the servers': the shared lock order) and read
       them again; the decisions of jobs that changed meanwhile are skipped, and so are those that
       counted on them (round_plan_recheck). Agents' reports thus wait only for the locks of the
       apply step, not for the whole round.
    5. Apply the plan (services/round_apply.py): unchanged placements keep their lease; a running job
       kept on its GPUs with other cores or memory is resized in place where its agents can (its leases
       updated, a `resized` event), moved otherwise; moved or unplaced running jobs are preempted
       (leases ended, GPUs released); new placements get Allocation rows.
    6. Store the SchedulingRound, a RoundDecision per job decided and a JobEvent per state change; give
       profiling runs still queued what the plan left free; refresh server states. If decisions were
       skipped, ask for an early round for them.
    7. After commit, the agents of the servers that got new leases are woken (cluster_app/agent_wake.py)
       and sync at once; those whose leases ended are woken by allocations_end.
    8. After commit, ask for a refresh of every live job's forecast (services/forecast_refresh.py).
    """
    with round_lock_single_flight() as acquired:
        if not acquired:
            logger.info("scheduling round (%s) skipped: another round is running", trigger)
            return None
        # Without the collector's passes over the round's own objects (services/gc_pause.py): about a
        # tenth of a round's CPU at a thousand servers.
        with prepared_statements(), gc_paused():
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
    # for their dependencies (afterok), whose workloads are profiled meanwhile, and an array's tasks
    # past its limit on tasks running at once (--array 0-99%4).
    jobs = [job for job in jobs if not job.held]
    waiting = job_dependencies_hold(jobs=jobs, now=now)
    waiting |= array_limits_hold(jobs=jobs, held_otherwise=waiting)
    held = waiting | profiling_jobs_hold(jobs=jobs, servers=servers, now=now, held_otherwise=waiting)
    jobs = [job for job in jobs if job.pk not in held]
    profiling_runs_dispatch(now=now, genie=False)  # GENIE's runs gate no job: leftovers only, below
    inputs = round_inputs(servers=servers, jobs=jobs, now=now)
    # Servers whose agents apply a change of cores or memory to running jobs in place; a job resized
    # elsewhere is restarted (round_apply._resize_of), and the restart costs price it so.
    resizable = frozenset(s.id for s in servers if s.live_resize)
    restarts = live_restarts(servers)  # the forecasts decide with the same (services/live_queue.py)
    plan = schedule_round(
        inputs.snapshot,
        inputs.views,
        policy=conf.policy_obj(),
        allocator=conf.allocator,
        now_s=now.timestamp(),
        team_quota_gpus=team_quotas_left(jobs=jobs, frozen_job_ids=inputs.frozen_job_ids),
        borrowing_teams=borrowing_teams(),
        restarts=restarts,
    )
    all_gpus = sum(s.num_gpus for s in servers)
    skipped = round_plan_recheck(inputs, plan.decisions, all_gpus=all_gpus, resizable=resizable)
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
        resizable=resizable,
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
        f"infeasible, {counts['num_preempted']} preempted, {counts['num_resized']} resized, "
        f"{len(skipped)} skipped, "
        f"{sround.duration_ms:.0f} ms"
    )
    transaction.on_commit(lambda: logger.info(summary))
    return sround


def round_decisions_prune(*, now: datetime | None = None) -> int:
    """Delete the per-job decisions of rounds older than the retention period; returns how many.

    The rounds themselves (counts, policy, allocator, timings) are kept for the dashboards; what a
    job holds is in its allocations and its history in its events, both kept.
    """
    now = now or timezone.now()
    before = now - timedelta(days=scheduler_conf().round_decision_retention_days)
    deleted, _ = RoundDecision.objects.filter(round__started_at__lt=before).delete()
    return deleted
