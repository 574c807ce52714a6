"""Node failure and maintenance as the work sees it: liveness sweep with requeue, drain and resume."""

from __future__ import annotations

import logging
from datetime import datetime, timedelta

from django.db import transaction
from django.utils import timezone

from cluster_app.agent_wake import agents_wake_on_commit
from cluster_app.conf import node_conf
from cluster_app.models import NodeState, Server
from cluster_app.selectors import server_ids_in_states, server_ids_silent_since, server_lock, servers_lock_all
from cluster_app.services import (
    LivenessSweep,
    node_liveness_sweep,
    server_drain,
    server_resume,
    server_states_refresh,
)
from scheduler_app.models import Allocation, Job, JobState
from scheduler_app.selectors import server_busy_gpu_count, server_busy_gpus
from scheduler_app.selectors.agents import NODE_FAIL_END_REASON
from scheduler_app.selectors.restart_facts import leases_lost_work_s
from scheduler_app.services.job_control import allocations_end, jobs_time_limit_enforce
from scheduler_app.services.job_lifecycle import jobs_requeue
from scheduler_app.services.round_requests import scheduling_round_request_on_commit

logger = logging.getLogger(__name__)


@transaction.atomic
def node_liveness_sweep_run(*, now: datetime | None = None) -> LivenessSweep:
    """Mark silent servers NOT_RESPONDING / DOWN, requeue the jobs of DOWN servers, refresh states.

    1. cluster_app's sweep locks every server row (the shared lock order: servers, then jobs) and
       moves silent ones to NOT_RESPONDING, and those silent for longer to DOWN.
    2. Every job with an active lease on a DOWN server -- newly down or left over from a crash --
       whose last sync is older than the fence's expiry (its processes are surely stopped there) is
       locked and goes RUNNING -> NODE_FAIL -> PENDING with its progress kept; all its leases end
       (end_reason "node_fail", GPUs released, lost_work_s: the run since the last checkpoint), so a
       job spanning servers restarts as a whole.
    3. Server states are refreshed (IDLE/MIXED/ALLOCATED; DRAINING -> DRAINED once empty).
    A NOT_RESPONDING server keeps its jobs: it may only be slow, and its agent resumes reporting.
    """
    if now is None:
        # Read once every server row is locked, as a round does: a sweep that waited for a round must
        # not end the leases that round just started at a time before their start.
        servers_lock_all()
        now = timezone.now()
    sweep = node_liveness_sweep(now=now)
    # Fencing: a DOWN server's leases end only once they are surely stopped there (the fence's expiry
    # since its last sync), whatever ATTUNE_NODE_DOWN_AFTER_S says (a system check refuses a shorter one).
    down = server_ids_silent_since(
        server_ids=server_ids_in_states(states=[NodeState.DOWN]),
        since=now - timedelta(seconds=node_conf().fence_expiry_s),
    )
    job_ids = set(
        Allocation.objects.filter(server_id__in=down, ended_at__isnull=True).values_list("job_id", flat=True)
    )
    if job_ids:
        jobs = list(Job.objects.select_for_update().filter(pk__in=job_ids).order_by("id"))
        # A restart: each lease ends with the work since its job's last checkpoint (one read, one end).
        lost = leases_lost_work_s(job_ids=job_ids, ended_at=now)
        allocations_end(allocation_ids=lost, reason=NODE_FAIL_END_REASON, now=now, lost_work_s=lost)
        requeued = [job for job in jobs if job.state == JobState.RUNNING]
        jobs_requeue(jobs=requeued, reason="node_down", now=now, via=JobState.NODE_FAIL)
        logger.warning("node failure: requeued jobs %s", [job.pk for job in requeued])
        if requeued:
            scheduling_round_request_on_commit(trigger="node_fail")
    server_states_refresh(busy_gpus=server_busy_gpus())
    return sweep


def periodic_sweep_run() -> dict[str, list]:
    """The sweep every few seconds (Celery beat's task, the embedded demo's loop): silent servers
    marked (node_liveness_sweep_run), then the jobs past their time limit ended (TIMEOUT)."""
    sweep = node_liveness_sweep_run()
    return {
        "not_responding": sweep.not_responding,
        "down": sweep.down,
        "timed_out": jobs_time_limit_enforce(),
    }


@transaction.atomic
def node_drain(*, server: Server, reason: str = "") -> Server:
    """DRAINING: running leases finish, nothing new is placed; DRAINED once the server holds none."""
    # Count its leases only under the server lock: a round holds that lock while it places work.
    server = server_lock(server=server)
    agents_wake_on_commit([server.pk])  # the agent hears of the drain at once
    return server_drain(server=server, reason=reason, busy_gpus=server_busy_gpu_count(server_id=server.pk))


@transaction.atomic
def node_resume(*, server: Server) -> Server:
    """Put a draining or drained server back into service."""
    server = server_lock(server=server)
    return server_resume(server=server, busy_gpus=server_busy_gpu_count(server_id=server.pk))
