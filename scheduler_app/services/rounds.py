"""The live scheduling round: lock, snapshot, engine.schedule_round, apply the plan in one transaction."""

from __future__ import annotations

import logging
import math
import threading
import time
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timedelta
from functools import cache

from django.db import connection, transaction
from django.db.models import Q, Value
from django.db.models.functions import Coalesce
from django.utils import timezone

from cluster_app.agent_wake import agents_wake_on_commit
from cluster_app.selectors import servers_lock_all
from cluster_app.services import server_states_refresh
from scheduler_app.conf import scheduler_conf
from scheduler_app.core import reasons
from scheduler_app.core.engine import schedule_round
from scheduler_app.core.interference import colocated_comm_jobs
from scheduler_app.core.types import Decision, Outcome, Placement
from scheduler_app.models import (
    Allocation,
    AllocationGpu,
    Job,
    JobEvent,
    JobState,
    PendingReason,
    RoundDecision,
    SchedulingRound,
)
from scheduler_app.selectors import (
    ActiveLease,
    RoundInputs,
    borrowing_teams,
    round_inputs,
    server_busy_gpus,
    team_quotas_left,
)
from scheduler_app.services.forecasts import job_forecasts_refresh
from scheduler_app.services.job_control import allocations_end, job_interruption_events
from scheduler_app.services.jobs import job_dependencies_hold, job_event
from scheduler_app.services.profiling import profiling_jobs_hold, profiling_runs_dispatch

logger = logging.getLogger(__name__)

# Key of the PostgreSQL advisory lock that makes rounds single-flight ("Attune01" as an integer).
ROUND_LOCK_KEY = int.from_bytes(b"Attune01", "big") & 0x7FFF_FFFF_FFFF_FFFF
# Redis key that debounces early rounds: set while one is queued and not yet started.
EARLY_ROUND_KEY = "attune:early-round"
# SQLite (the embedded demo) has no advisory locks; one process serves it, so a process-local lock
# gives the same single-flight guarantee there.
_local_round_lock = threading.Lock()

PENDING_REASON_OF = {
    reasons.INSUFFICIENT_GPUS: PendingReason.RESOURCES,
    reasons.FRAGMENTED: PendingReason.RESOURCES,
    reasons.QOS_UNATTAINABLE: PendingReason.QOS_UNATTAINABLE,
    reasons.MIN_RATE_UNATTAINABLE: PendingReason.QOS_UNATTAINABLE,
    reasons.QOS_NEEDS_FEWER_SERVERS: PendingReason.RESOURCES,  # waits for GPUs on fewer servers
    reasons.QOS_INTERFERENCE: PendingReason.RESOURCES,  # waits for GPUs away from communicating jobs
    reasons.RESERVED_FOR_QOS: PendingReason.PRIORITY,  # held back for a QoS job ahead of it
    reasons.QUOTA_EXCEEDED: PendingReason.QUOTA,
    reasons.EXCEEDS_CLUSTER_GPUS: PendingReason.INFEASIBLE,
    reasons.EXCEEDS_SERVER_RESOURCES: PendingReason.INFEASIBLE,
    reasons.EXCEEDS_CLUSTER_NODES: PendingReason.INFEASIBLE,
    reasons.UNEVEN_NODE_SPLIT: PendingReason.INFEASIBLE,
}


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


def _same_resources(current: list[ActiveLease], placement: Placement) -> bool:
    """True when the placement holds exactly the lease's servers, GPU indices, cores and memory."""

    def key(server_id: int, indices, cpus: int, mem_gb: float) -> tuple:
        return server_id, tuple(sorted(indices)), int(cpus), round(float(mem_gb), 6)

    held = sorted(key(lease.server_id, lease.gpu_indices, lease.num_cpus, lease.mem_gb) for lease in current)
    new = sorted(key(s.server_id, s.gpu_indices, s.num_cpus, s.mem_gb) for s in placement.shares)
    return held == new


def _pending_reason(decision: Decision, blocked_ahead: bool) -> str:
    """squeue's reason: the first job that waits for resources says Resources, those behind it Priority."""
    reason = PENDING_REASON_OF.get(decision.reason, PendingReason.RESOURCES)
    if reason == PendingReason.RESOURCES and blocked_ahead:
        return PendingReason.PRIORITY
    return reason


def _placement_data(placement: Placement, names: dict[int, str]) -> list[dict]:
    return [
        {
            "server": names.get(s.server_id, s.server_id),
            "gpus": list(s.gpu_indices),
            "cpus": s.num_cpus,
            "mem_gb": s.mem_gb,
        }
        for s in placement.shares
    ]


def scheduling_round_run(*, trigger: str = "beat") -> SchedulingRound | None:
    """Run one live scheduling round; None if another round holds the lock (single-flight).

    1. Take the round lock (see _single_flight) inside the round's one transaction.
    2. Lock every server row, then every PENDING/RUNNING job row (the shared lock order), leave out
       the jobs waiting for their workload's profile and give queued profiling runs what running
       leases leave free (services/profiling.py), and build the snapshot and job views through
       selectors (round mode: a schedulable server is all free, less what profiling runs hold).
    3. engine.schedule_round with the configured policy and allocator.
    4. Apply the plan (_apply): unchanged placements keep their lease; moved or unplaced running
       jobs are preempted (leases ended, GPUs released); new placements get Allocation rows.
    5. Store the SchedulingRound, a RoundDecision per job and a JobEvent per state change; give
       profiling runs still queued what the plan left free; refresh server states.
    6. After commit, the agents of the servers that got new leases are woken (cluster_app/agent_wake.py)
       and sync at once; those whose leases ended are woken by allocations_end.
    7. After commit, refresh every live job's forecast (services/forecasts.py).
    """
    with _single_flight() as acquired:
        if not acquired:
            logger.info("scheduling round (%s) skipped: another round is running", trigger)
            return None
        sround = _round(trigger)
    # After the round's transaction, so that its job rows are not held locked while the queue is
    # played forward: every time shown anywhere is this forecast (services/forecasts.py).
    job_forecasts_refresh()
    return sround


def _round(trigger: str) -> SchedulingRound:
    conf = scheduler_conf()
    t0 = time.perf_counter()
    now = timezone.now()
    servers = servers_lock_all()
    # of=("self",) locks only job rows; the round reads but never writes anything joined to them.
    # no_key: a foreign key check of another transaction (its rows pointing at a job) must not wait
    # for the round, for the reason given in servers_lock_all.
    jobs = list(
        Job.objects.select_for_update(of=("self",), no_key=True)
        .filter(state__in=[JobState.PENDING, JobState.RUNNING])
        .order_by("id")
    )
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
    sround = SchedulingRound.objects.create(
        started_at=now,
        policy=conf.policy,
        allocator=conf.allocator,
        trigger=trigger,
        num_runnable=len(inputs.views),
    )
    counts = _apply(
        sround,
        inputs,
        plan.decisions,
        now=now,
        names={s.id: s.name for s in servers},
        all_gpus=sum(s.num_gpus for s in servers),
    )
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
        f"infeasible, {counts['num_preempted']} preempted, {sround.duration_ms:.0f} ms"
    )
    transaction.on_commit(lambda: logger.info(summary))
    return sround


def _apply(
    sround: SchedulingRound,
    inputs: RoundInputs,
    decisions: tuple[Decision, ...],
    *,
    now: datetime,
    names: dict[int, str],
    all_gpus: int,
) -> dict[str, int]:
    """Write the plan: bulk statements only, so the cost does not grow with queries per job."""
    to_end: list[int] = []  # allocation ids whose lease ends (preempted)
    new_placements: list[Placement] = []
    to_running: list[int] = []
    to_pending: dict[str, list[int]] = defaultdict(list)  # reason -> running jobs sent back to queue
    reason_updates: dict[str, list[int]] = defaultdict(list)  # reason -> pending jobs whose reason changes
    events: list[JobEvent] = []
    round_decisions: list[RoundDecision] = []
    counts = dict.fromkeys(("num_placed", "num_pending", "num_infeasible", "num_preempted"), 0)
    blocked_ahead = False

    for position, decision in enumerate(decisions):
        job = inputs.jobs[decision.job_id]
        leases = inputs.leases_by_job.get(job.pk, [])
        placement = decision.placement
        round_decisions.append(
            RoundDecision(
                round=sround,
                job_id=job.pk,
                position=position,
                outcome=decision.outcome.value,
                reason=decision.reason,
                speedup=placement.speedup if placement else None,
            )
        )
        if placement is not None:
            counts["num_placed"] += 1
            if leases and _same_resources(leases, placement):
                continue  # the lease continues untouched
            data = {
                "round": sround.pk,
                "placement": _placement_data(placement, names),
                "speedup": placement.speedup,
            }
            if leases:
                counts["num_preempted"] += 1
                to_end.extend(lease.allocation_id for lease in leases)
                events += job_interruption_events(
                    job,
                    kind="preempted",
                    interrupted_state=JobState.PREEMPTED,
                    reason="moved",
                    next_kind="rescheduled",
                    next_state=JobState.RUNNING,
                    next_reason=decision.reason,
                    at=now,
                    data={"round": sround.pk},
                    next_data=data,
                )
            else:
                events.append(
                    job_event(
                        job,
                        "scheduled",
                        from_state=job.state,
                        to_state=JobState.RUNNING,
                        reason=decision.reason,
                        at=now,
                        data=data,
                    )
                )
            new_placements.append(placement)
            to_running.append(job.pk)
            continue

        counts["num_infeasible" if decision.outcome == Outcome.INFEASIBLE else "num_pending"] += 1
        reason = _pending_reason(decision, blocked_ahead)
        if decision.reason == reasons.EXCEEDS_CLUSTER_GPUS and job.num_gpus <= all_gpus:
            # Too big for the servers in service now, but not for the whole cluster: it waits for the
            # drained or failed servers to come back rather than being called infeasible.
            reason = PendingReason.PRIORITY if blocked_ahead else PendingReason.RESOURCES
        if reason in (PendingReason.RESOURCES, PendingReason.PRIORITY):
            blocked_ahead = True
        if leases:
            counts["num_preempted"] += 1
            to_end.extend(lease.allocation_id for lease in leases)
            to_pending[reason].append(job.pk)
            events += job_interruption_events(
                job,
                kind="preempted",
                interrupted_state=JobState.PREEMPTED,
                reason=decision.reason,
                next_kind="requeued",
                next_state=JobState.PENDING,
                next_reason=reason,
                at=now,
                data={"round": sround.pk},
                next_data={"round": sround.pk},
            )
        elif job.state == JobState.RUNNING:
            # Running without a lease (should not happen): back to the queue.
            to_pending[reason].append(job.pk)
            events.append(
                job_event(
                    job,
                    "requeued",
                    from_state=JobState.RUNNING,
                    to_state=JobState.PENDING,
                    reason=reason,
                    at=now,
                    data={"round": sround.pk},
                )
            )
        elif job.pending_reason != reason:
            reason_updates[reason].append(job.pk)

    # Order matters: release the old holds before inserting new ones, or the partial unique index
    # (no GPU in two active allocations) would reject a GPU that changes hands within this round.
    allocations_end(allocation_ids=to_end, reason="preempted", now=now)
    colocated = colocated_comm_jobs(d.placement for d in decisions if d.placement is not None)
    _allocations_create(sround, new_placements, inputs, colocated, now=now)
    if to_running:
        Job.objects.filter(pk__in=to_running).update(
            state=JobState.RUNNING,
            pending_reason=PendingReason.NONE,
            started_at=Coalesce("started_at", Value(now)),
        )
    for reason, ids in to_pending.items():
        Job.objects.filter(pk__in=ids).update(state=JobState.PENDING, pending_reason=reason)
    for reason, ids in reason_updates.items():
        Job.objects.filter(pk__in=ids).update(pending_reason=reason)
    JobEvent.objects.bulk_create(events, batch_size=1000)
    RoundDecision.objects.bulk_create(round_decisions, batch_size=1000)
    return counts


def _allocations_create(
    sround: SchedulingRound,
    placements: list[Placement],
    inputs: RoundInputs,
    colocated: dict[int, int],
    *,
    now: datetime,
) -> None:
    """One Allocation per (job, server share) and one AllocationGpu per GPU, in two bulk inserts.

    `colocated`: job id -> the other communicating jobs on its servers in this round's plan (GENIE's
    interference x, kept with the lease so that its measured speed can teach kappa).

    Every part of a placement gets the same rendezvous port (MASTER_PORT), one that no other running
    job uses on the first part's server (where rank 0 listens).
    """
    allocations: list[Allocation] = []
    gpu_lists: list[list[int]] = []
    ports = RendezvousPorts(scheduler_conf().rendezvous_ports, now=now) if placements else None
    for placement in placements:
        port = ports.take(placement.shares[0].server_id) if ports is not None else None
        for share in placement.shares:
            cpus, mem_gb = share.num_cpus, share.mem_gb
            if cpus < 1 or mem_gb <= 0:
                # The schema requires a core and some memory per lease; a share without them would be
                # an allocator bug, so it is logged and given the minimum rather than dropped.
                logger.warning(
                    "job %s: share on server %s has %s cores / %s GB; using the minimum",
                    placement.job_id,
                    share.server_id,
                    cpus,
                    mem_gb,
                )
                cpus, mem_gb = max(1, cpus), max(mem_gb, 0.1)
            allocations.append(
                Allocation(
                    job_id=placement.job_id,
                    round=sround,
                    server_id=share.server_id,
                    num_gpus=len(share.gpu_indices),
                    num_cpus=cpus,
                    mem_gb=mem_gb,
                    speedup=placement.speedup,
                    started_at=now,
                    rendezvous_port=port,
                    colocated_comm_jobs=colocated.get(placement.job_id, 0),
                )
            )
            gpu_lists.append([inputs.gpu_ids[(share.server_id, i)] for i in share.gpu_indices])
    Allocation.objects.bulk_create(allocations, batch_size=1000)  # PostgreSQL and SQLite return the ids
    agents_wake_on_commit({a.server_id for a in allocations})  # their agents start them at once
    AllocationGpu.objects.bulk_create(
        [
            AllocationGpu(allocation_id=a.pk, gpu_id=g)
            for a, gpus in zip(allocations, gpu_lists, strict=True)
            for g in gpus
        ],
        batch_size=2000,
    )


class RendezvousPorts:
    """Free rendezvous ports per server, read once per round (one query).

    A port is never given while a running lease holds it, and not soon after either: the processes of
    a job's last incarnation (a part orphaned on a node whose agent died) may still try to reach their
    rank 0 there, and must not join the next incarnation's rendezvous by mistake.
    """

    QUIET_S = 600.0  # how long an ended lease's port rests before it is given again

    def __init__(self, port_range: tuple[int, int], *, now: datetime) -> None:
        self.first, self.last = port_range
        self.active: dict[int, set[int]] = defaultdict(set)
        self.resting: dict[int, set[int]] = defaultdict(set)
        recent = Q(ended_at__isnull=True) | Q(ended_at__gte=now - timedelta(seconds=self.QUIET_S))
        for server_id, port, ended_at in Allocation.objects.filter(
            recent, rendezvous_port__isnull=False
        ).values_list("server_id", "rendezvous_port", "ended_at"):
            (self.active if ended_at is None else self.resting)[server_id].add(port)

    def take(self, server_id: int) -> int | None:
        """The lowest port neither in use nor resting on the server; else the lowest not in use; None
        when every port of the range is in use (the job then gets no MASTER_PORT)."""
        active, resting = self.active[server_id], self.resting[server_id]
        for avoid in (active | resting, active):
            for port in range(self.first, self.last + 1):
                if port not in avoid:
                    active.add(port)
                    return port
        logger.warning("server %s: every rendezvous port %s-%s is in use", server_id, self.first, self.last)
        return None


# ---------------------------------------------------------------------------------------------------
# Early rounds
# ---------------------------------------------------------------------------------------------------


@cache
def _redis(url: str):
    import redis

    return redis.Redis.from_url(url, socket_timeout=2, socket_connect_timeout=2)


def scheduling_round_request(*, trigger: str) -> None:
    """Ask for a round soon (after a submission or a job's end), debounced; call after commit.

    Inline mode (embedded demo, eager Celery): run the round right here. Otherwise SET NX EX on a
    Redis key: the first request of a burst queues one round `early_round_delay_s` later and the
    others find the key taken. The task clears the key as it starts, so a request arriving while
    that round runs queues the next one. If Redis is unreachable the beat round catches up.
    """
    conf = scheduler_conf()
    if conf.inline_rounds:
        try:
            scheduling_round_run(trigger=trigger)
        except Exception:  # the request that asked has committed already; do not fail it
            logger.exception("inline scheduling round (%s) failed", trigger)
        return
    delay = max(0.0, conf.early_round_delay_s)
    try:
        if not _redis(conf.redis_url).set(
            EARLY_ROUND_KEY, trigger, nx=True, ex=max(1, math.ceil(delay) + 60)
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
