"""Applying a round's plan: leases ended and created, job states and reasons, events and decisions."""

from __future__ import annotations

import logging
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.db.models import Q
from django.utils import timezone

from cluster_app.agent_wake import agents_wake_on_commit
from infra.bulk_sql import model_rows_insert
from scheduler_app.conf import scheduler_conf
from scheduler_app.core import reasons
from scheduler_app.core.interference import colocated_comm_jobs
from scheduler_app.core.restarts import lost_work_s
from scheduler_app.core.types import Decision, Outcome, Placement
from scheduler_app.models import (
    Allocation,
    AllocationGpu,
    JobEvent,
    JobState,
    PendingReason,
    SchedulingRound,
)
from scheduler_app.selectors import ActiveLease, RoundInputs, round_jobs_recheck
from scheduler_app.services.job_control import allocations_end
from scheduler_app.services.job_lifecycle import (
    job_event,
    job_events_record,
    job_interruption_events,
    jobs_transition_bulk,
    transition_event,
)
from scheduler_app.services.round_writes import allocations_resize, round_decisions_insert

logger = logging.getLogger(__name__)

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


def _same_resources(current: list[ActiveLease], placement: Placement) -> bool:
    """True when the placement holds exactly the lease's servers, GPU indices, cores and memory."""

    def key(server_id: int, indices, cpus: int, mem_gb: float) -> tuple:
        return server_id, tuple(sorted(indices)), int(cpus), round(float(mem_gb), 6)

    held = sorted(key(lease.server_id, lease.gpu_indices, lease.num_cpus, lease.mem_gb) for lease in current)
    new = sorted(key(s.server_id, s.gpu_indices, s.num_cpus, s.mem_gb) for s in placement.shares)
    return held == new


def _resize_of(
    current: list[ActiveLease], placement: Placement, resizable: frozenset[int] | set[int]
) -> list[ActiveLease] | None:
    """The leases to resize in place when the placement keeps each of them on its server's same GPUs
    (other cores or memory: core/restarts.py's RESIZED) and every one of those servers' agents resizes
    live (Server.live_resize); None otherwise: a restart (a move), as for other GPUs or servers."""
    by_server = {lease.server_id: lease for lease in current}
    if len(by_server) != len(current) or len(placement.shares) != len(current):
        return None
    for share in placement.shares:
        lease = by_server.get(share.server_id)
        if lease is None or share.server_id not in resizable:
            return None
        if tuple(sorted(lease.gpu_indices)) != tuple(sorted(share.gpu_indices)):
            return None
    return current


def _resize_data(
    round_id: int | None, current: list[ActiveLease], placement: Placement, names: dict[int, str]
) -> dict[str, Any]:
    """A `resized` event's data: the job's cores and memory before and after (all parts), its parts."""
    return {
        "round": round_id,
        "from": {
            "cpus": sum(lease.num_cpus for lease in current),
            "mem_gb": sum(lease.mem_gb for lease in current),
        },
        "to": {
            "cpus": sum(s.num_cpus for s in placement.shares),
            "mem_gb": sum(s.mem_gb for s in placement.shares),
        },
        "placement": _placement_data(placement, names),
        "speedup": placement.speedup,
    }


def _pending_reason(decision: Decision, blocked_ahead: bool) -> str:
    """squeue's reason: the first job that waits for resources says Resources, those behind it Priority."""
    reason = PENDING_REASON_OF.get(decision.reason, PendingReason.RESOURCES)
    if reason == PendingReason.RESOURCES and blocked_ahead:
        return PendingReason.PRIORITY
    return reason


def _waiting_reason(decision: Decision, job, blocked_ahead: bool, all_gpus: int) -> str:
    """The pending reason of a job the plan leaves waiting."""
    if decision.reason == reasons.EXCEEDS_CLUSTER_GPUS and job.num_gpus <= all_gpus:
        # Too big for the servers in service now, but not for the whole cluster: it waits for the
        # drained or failed servers to come back rather than being called infeasible.
        return PendingReason.PRIORITY if blocked_ahead else PendingReason.RESOURCES
    return _pending_reason(decision, blocked_ahead)


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


@dataclass
class PlanWrites:
    """What applying a plan writes, worked out without touching the database."""

    to_end: list[int] = field(default_factory=list)  # allocation ids whose lease ends (preempted)
    # allocation id -> the work its job does again (core/restarts.py), stored as the lease ends
    lost_work_s: dict[int, float] = field(default_factory=dict)
    new_placements: list[Placement] = field(default_factory=list)
    # Running jobs kept on their GPUs with other cores or memory, applied to their leases in place:
    # (allocation id, cores, memory GB, speed-up) per lease, and the placements (for the recheck).
    resizes: list[tuple[int, int, float, float]] = field(default_factory=list)
    resized_placements: list[Placement] = field(default_factory=list)
    # job id -> (state read, new state, pending reason), only for jobs whose row changes: a job whose
    # lease continues, a moved job (RUNNING before and after) and a waiting job whose reason stays are
    # not written (jobs_transition_bulk).
    job_changes: dict[int, tuple[str, str, str]] = field(default_factory=dict)
    events: list[JobEvent] = field(default_factory=list)
    round_decisions: list[tuple[int, int, str, str, float | None]] = field(default_factory=list)
    counts: dict[str, int] = field(
        default_factory=lambda: dict.fromkeys(
            ("num_placed", "num_pending", "num_infeasible", "num_preempted", "num_resized"), 0
        )
    )
    written_job_ids: set[int] = field(default_factory=set)  # jobs whose row or leases change


def _plan_writes(
    round_id: int | None,
    inputs: RoundInputs,
    decisions: tuple[Decision, ...],
    *,
    now: datetime,
    names: dict[int, str],
    all_gpus: int,
    skipped: frozenset[int] | set[int] = frozenset(),
    resizable: frozenset[int] | set[int] = frozenset(),
) -> PlanWrites:
    """The plan's writes. A `skipped` job's decision writes nothing (not even its RoundDecision), but
    still counts as a job waiting ahead for the pending reasons of the jobs behind it, so that skipping
    it changes no other job's writes. A running job kept on its GPUs with other cores or memory is
    resized in place where every server of it is in `resizable` (its agent resizes live), and moved
    (a restart) otherwise."""
    w = PlanWrites()
    blocked_ahead = False
    views = {view.job_id: view for view in inputs.views}
    now_s = now.timestamp()

    def end_leases(job_id: int, leases: list[ActiveLease]) -> None:
        # A move or a preemption is a restart: each lease ends with the run since its last checkpoint.
        lost = lost_work_s(views[job_id], now_s) if job_id in views else None
        for lease in leases:
            w.to_end.append(lease.allocation_id)
            if lost is not None:
                w.lost_work_s[lease.allocation_id] = lost

    for position, decision in enumerate(decisions):
        job = inputs.jobs[decision.job_id]
        leases = inputs.leases_by_job.get(job.pk, [])
        placement = decision.placement
        if job.pk in skipped:
            if placement is None and _waiting_reason(decision, job, blocked_ahead, all_gpus) in (
                PendingReason.RESOURCES,
                PendingReason.PRIORITY,
            ):
                blocked_ahead = True
            continue
        speedup = placement.speedup if placement else None
        w.round_decisions.append((job.pk, position, decision.outcome.value, decision.reason, speedup))
        if placement is not None:
            w.counts["num_placed"] += 1
            if leases and _same_resources(leases, placement):
                continue  # the lease continues untouched
            w.written_job_ids.add(job.pk)
            resized = _resize_of(leases, placement, resizable) if leases else None
            if resized is not None:
                # The same process, other cores or memory: its leases are updated and its agent applies
                # them at its next sync (selectors/agents.py resize_commands); no restart, no new lease.
                w.counts["num_resized"] += 1
                by_server = {share.server_id: share for share in placement.shares}
                w.resizes += [
                    (
                        lease.allocation_id,
                        by_server[lease.server_id].num_cpus,
                        by_server[lease.server_id].mem_gb,
                        placement.speedup,
                    )
                    for lease in resized
                ]
                w.resized_placements.append(placement)
                w.events.append(
                    job_event(
                        job,
                        "resized",
                        reason=decision.reason,
                        at=now,
                        data=_resize_data(round_id, leases, placement, names),
                    )
                )
                continue
            data = {
                "round": round_id,
                "placement": _placement_data(placement, names),
                "speedup": placement.speedup,
            }
            if leases:
                w.counts["num_preempted"] += 1
                end_leases(job.pk, leases)
                w.events += job_interruption_events(
                    job,
                    via=JobState.PREEMPTED,
                    to_state=JobState.RUNNING,
                    reason="moved",
                    next_reason=decision.reason,
                    at=now,
                    data={"round": round_id},
                    next_data=data,
                )
            elif job.state == JobState.RUNNING:
                # Running without a lease (should not happen), given one: its state stays.
                w.events.append(job_event(job, "scheduled", reason=decision.reason, at=now, data=data))
            else:
                w.events.append(
                    transition_event(
                        job, job.state, JobState.RUNNING, reason=decision.reason, at=now, data=data
                    )
                )
            w.new_placements.append(placement)
            if (job.state, job.pending_reason) != (JobState.RUNNING, PendingReason.NONE):
                w.job_changes[job.pk] = (job.state, JobState.RUNNING, PendingReason.NONE)
            continue

        w.counts["num_infeasible" if decision.outcome == Outcome.INFEASIBLE else "num_pending"] += 1
        reason = _waiting_reason(decision, job, blocked_ahead, all_gpus)
        if reason in (PendingReason.RESOURCES, PendingReason.PRIORITY):
            blocked_ahead = True
        if leases:
            w.counts["num_preempted"] += 1
            end_leases(job.pk, leases)
            w.job_changes[job.pk] = (job.state, JobState.PENDING, reason)
            w.events += job_interruption_events(
                job,
                via=JobState.PREEMPTED,
                to_state=JobState.PENDING,
                reason=decision.reason,
                next_reason=reason,
                at=now,
                data={"round": round_id},
                next_data={"round": round_id},
            )
        elif job.state == JobState.RUNNING:
            # Running without a lease (should not happen): back to the queue.
            w.job_changes[job.pk] = (job.state, JobState.PENDING, reason)
            w.events.append(
                transition_event(
                    job, JobState.RUNNING, JobState.PENDING, reason=reason, at=now, data={"round": round_id}
                )
            )
        elif job.pending_reason != reason:
            w.job_changes[job.pk] = (job.state, JobState.PENDING, reason)
    w.written_job_ids |= set(w.job_changes)
    return w


def round_plan_recheck(
    inputs: RoundInputs,
    decisions: tuple[Decision, ...],
    *,
    all_gpus: int,
    resizable: frozenset[int] | set[int] = frozenset(),
) -> set[int]:
    """Lock the rows of the jobs the plan writes, read them again, and return the ids of the jobs whose
    decisions must be skipped: the plan was computed on rows read without locks, and a report, cancel
    or hold may have changed them since.

    Skipped: every written job whose state, hold or set of active leases is not what the plan read;
    then, until nothing changes, every new placement on a server where a skipped job still holds a
    lease (the plan may have counted on that lease's end, or on the cores a resize in place would have
    freed), which in turn keeps that job's own leases. A job that ended meanwhile released its GPUs,
    which the plan did not give to anyone else. Leases are created only by rounds (single-flight), so
    nothing else can have taken what the plan counts as free. Skipped jobs are decided by the next round.
    """
    writes = _plan_writes(
        None, inputs, decisions, now=timezone.now(), names={}, all_gpus=all_gpus, resizable=resizable
    )
    current = round_jobs_recheck(writes.written_job_ids)
    skipped: set[int] = set()
    contested: set[int] = set()  # servers where a skipped job keeps a lease
    for job_id in writes.written_job_ids:
        job = inputs.jobs[job_id]
        read_leases = frozenset(lease.allocation_id for lease in inputs.leases_by_job.get(job_id, []))
        now_row = current.get(job_id)
        if now_row is None or (now_row.state, now_row.held, now_row.lease_ids) != (
            job.state,
            job.held,
            read_leases,
        ):
            skipped.add(job_id)
            if now_row is not None:
                contested |= now_row.lease_server_ids
    placed_on = {
        p.job_id: {share.server_id for share in p.shares}
        for p in (*writes.new_placements, *writes.resized_placements)  # a resize may grow into freed cores
    }
    while contested:
        newly = {
            job_id for job_id, servers in placed_on.items() if job_id not in skipped and servers & contested
        }
        if not newly:
            break
        skipped |= newly
        contested |= {lease.server_id for job_id in newly for lease in inputs.leases_by_job.get(job_id, [])}
    return skipped


def round_plan_apply(
    sround: SchedulingRound,
    inputs: RoundInputs,
    decisions: tuple[Decision, ...],
    *,
    now: datetime,
    names: dict[int, str],
    all_gpus: int,
    skipped: set[int] | frozenset[int] = frozenset(),
    resizable: frozenset[int] | set[int] = frozenset(),
) -> dict[str, int]:
    """Write the plan, less the `skipped` jobs' decisions (round_plan_recheck, which must have locked
    the rows first, with the same `resizable`): bulk statements only, so the cost does not grow with
    queries per job."""
    w = _plan_writes(
        sround.pk,
        inputs,
        decisions,
        now=now,
        names=names,
        all_gpus=all_gpus,
        skipped=skipped,
        resizable=resizable,
    )
    # Order matters: release the old holds before inserting new ones, or the partial unique index
    # (no GPU in two active allocations) would reject a GPU that changes hands within this round.
    allocations_end(allocation_ids=w.to_end, reason="preempted", now=now, lost_work_s=w.lost_work_s)
    if w.resizes:
        allocations_resize(w.resizes)
        # Their agents learn the new sizes at their next sync (resize_commands): woken to sync now.
        agents_wake_on_commit(
            {lease.server_id for p in w.resized_placements for lease in inputs.leases_by_job[p.job_id]}
        )
    colocated = colocated_comm_jobs(
        d.placement for d in decisions if d.placement is not None and d.job_id not in skipped
    )
    _allocations_create(sround, w.new_placements, inputs, colocated, now=now)
    jobs_transition_bulk(w.job_changes, now=now)
    job_events_record(w.events)
    round_decisions_insert(sround.pk, w.round_decisions)
    return w.counts


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
    allocations: list[dict[str, Any]] = []  # Allocation rows (model_rows_insert: no instances)
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
                {
                    "job_id": placement.job_id,
                    "round_id": sround.pk,
                    "server_id": share.server_id,
                    "num_gpus": len(share.gpu_indices),
                    "num_cpus": cpus,
                    "mem_gb": mem_gb,
                    "speedup": placement.speedup,
                    "started_at": now,
                    "rendezvous_port": port,
                    "colocated_comm_jobs": colocated.get(placement.job_id, 0),
                }
            )
            gpu_lists.append([inputs.gpu_ids[(share.server_id, i)] for i in share.gpu_indices])
    ids = model_rows_insert(Allocation, allocations)
    agents_wake_on_commit({a["server_id"] for a in allocations})  # their agents start them at once
    model_rows_insert(
        AllocationGpu,
        [
            {"allocation_id": allocation_id, "gpu_id": g}
            for allocation_id, gpus in zip(ids, gpu_lists, strict=True)
            for g in gpus
        ],
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
