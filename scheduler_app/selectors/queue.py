"""The queue's rough estimates: each pending job's position and estimated start."""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.utils import timezone

from cluster_app.models import Server
from cluster_app.selectors import SCHEDULABLE_STATES
from scheduler_app.conf import scheduler_conf
from scheduler_app.core.policies import POLICIES
from scheduler_app.models import (
    Allocation,
    Job,
    JobState,
    PendingReason,
)
from scheduler_app.selectors.jobs import dependency_waits
from scheduler_app.selectors.rounds import next_round_at, own_command_iter_time_s, round_inputs


@dataclass(frozen=True)
class QueueEntry:
    """A pending job's 1-based place in the policy's order and its estimated start (None: unknown)."""

    position: int
    estimated_start_at: datetime | None


def job_queue(*, now: datetime | None = None) -> dict[int, QueueEntry]:
    """Queue position and estimated start of every PENDING job.

    Position: the current policy's order (conf.policy, the core's own ordering) over the pending jobs.
    Estimated start, a deliberately simple estimate: walk the queue in that order adding up the GPUs
    that the jobs ahead and this one need; if the GPUs free now cover it, the job starts at the next
    round; otherwise running jobs are assumed to finish at their predicted time (remaining iterations
    at their measured or profiled speed) in finishing order, and the job starts at the first round
    after enough GPUs are freed. It ignores preemption, arrivals and CPU/memory fit; None when the
    job is infeasible, held, waits for its dependencies (the admission forecast follows those) or the
    running jobs never free enough GPUs (e.g. own commands that report no progress and no time limit).
    """
    conf = scheduler_conf()
    now = now or timezone.now()
    pending = list(Job.objects.filter(state=JobState.PENDING))
    if not pending:
        return {}
    servers = list(Server.objects.filter(state__in=SCHEDULABLE_STATES))
    inputs = round_inputs(servers=servers, jobs=pending)
    policy = POLICIES.get(conf.policy)()
    ordered = policy.order(inputs.views, inputs.snapshot, now.timestamp())

    round_td = timedelta(seconds=conf.round_s)
    next_round = next_round_at(now, conf.round_s)

    def align(t: datetime) -> datetime:
        if t <= next_round:
            return next_round
        return next_round + math.ceil((t - next_round) / round_td) * round_td

    finishes = sorted(_running_finish_times(now=now))
    waiting = dependency_waits(job_ids=inputs.jobs)
    free = inputs.snapshot.free_gpu_count
    need = freed = k = 0
    last_finish: datetime | None = None
    result: dict[int, QueueEntry] = {}
    for pos, view in enumerate(ordered, start=1):
        job = inputs.jobs[view.job_id]
        if (
            job.pending_reason == PendingReason.INFEASIBLE
            or view.num_gpus > inputs.snapshot.total_gpus
            or job.id in waiting  # it starts after its dependencies, which this estimate does not follow
            or job.held
        ):
            result[job.id] = QueueEntry(pos, None)
            continue
        need += view.num_gpus
        while free + freed < need and k < len(finishes):
            last_finish, gpus = finishes[k]
            freed += gpus
            k += 1
        if free + freed < need:
            result[job.id] = QueueEntry(pos, None)
        else:
            result[job.id] = QueueEntry(pos, next_round if last_finish is None else align(last_finish))
    return result


def _running_finish_times(*, now: datetime) -> list[tuple[datetime, int]]:
    """(predicted end, GPUs) of each running job with a known length: remaining iterations at its
    measured speed, else its profiled speed with the learnt correction (catalog workloads) or
    own_command_iter_time_s."""
    speeds: dict[int, list[tuple[float, float | None]]] = defaultdict(list)
    for job_id, speedup, ips in Allocation.objects.filter(
        ended_at__isnull=True, job__state=JobState.RUNNING
    ).values_list("job_id", "speedup", "iters_per_s"):
        speeds[job_id].append((speedup, ips))
    out = []
    for job in (
        Job.objects.filter(state=JobState.RUNNING)
        .select_related("workload")
        .only(
            "id",
            "num_gpus",
            "total_iters",
            "done_iters",
            "time_limit_s",
            "workload__iter_time_s",
            "workload__speed_correction",
        )
    ):
        leases = speeds.get(job.pk)
        if not leases:
            continue
        measured = [ips for _, ips in leases if ips] if job.total_iters else []
        if measured:
            rate = max(measured)
        elif job.workload is not None:
            rate = min(s for s, _ in leases) / job.workload.estimated_iter_time_s
        else:
            iter_time_s = own_command_iter_time_s(job)
            if iter_time_s is None:
                continue  # an own command of unknown length
            rate = 1.0 / iter_time_s
        if rate <= 0:
            continue
        remaining = max(0, job.total_iters - job.done_iters) if job.total_iters else 1
        out.append((now + timedelta(seconds=remaining / rate), job.num_gpus))
    return out
