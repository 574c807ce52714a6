"""Every read of the work tables; turns rows into the core's views (snapshot, jobs)."""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any
from uuid import UUID

from django.contrib.auth.models import AbstractBaseUser
from django.db.models import Case, Count, IntegerField, Prefetch, Q, QuerySet, Sum, Value, When
from django.utils import timezone

from cluster_app.models import NodeState, Server
from cluster_app.selectors import SCHEDULABLE_STATES, gpus_active
from profiles_app.selectors import (
    profiling_commands,
    profiling_holds,
    speed_observations_by_allocation,
    workload_launch,
    workload_profiles,
)
from scheduler_app.conf import scheduler_conf
from scheduler_app.core.policies import POLICIES
from scheduler_app.core.throughput import REFERENCE_SHAPE, ServerShape, cluster_shape
from scheduler_app.core.types import (
    ClusterSnapshot,
    JobView,
    Placement,
    SensitivityProfile,
    ServerShare,
    ServerView,
)
from scheduler_app.job_paths import default_output_pattern, output_path_expand
from scheduler_app.models import (
    TERMINAL_JOB_STATES,
    Allocation,
    AllocationGpu,
    Job,
    JobState,
    PendingReason,
    SchedulingRound,
    Team,
)

# Lease end reasons after which a still-running process is stopped gracefully (checkpoint) rather
# than cancelled.
PREEMPT_END_REASONS = frozenset({"preempted"})


def job_counts_by_state() -> dict[str, int]:
    """State -> number of jobs, with every state present (zero when none)."""
    counts = dict(Job.objects.values_list("state").annotate(n=Count("id")).values_list("state", "n"))
    return {state: counts.get(state, 0) for state in JobState.values}


# ---------------------------------------------------------------------------------------------------
# Leases and core views
# ---------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ActiveLease:
    """An allocation that has not ended, with the GPUs it holds (ids and indices on its server)."""

    allocation_id: int
    job_id: int
    server_id: int
    num_cpus: int
    mem_gb: float
    speedup: float
    gpu_ids: tuple[int, ...]
    gpu_indices: tuple[int, ...]
    iters_per_s: float | None = None  # the agent's last measure of the job's speed on this lease

    def share(self) -> ServerShare:
        return ServerShare(self.server_id, self.gpu_indices, self.num_cpus, self.mem_gb)


@dataclass
class RoundInputs:
    """What a round (or the queue view) decides on, plus the row lookups needed to apply its plan.

    `frozen_job_ids`: running jobs left out of the round because a lease of theirs sits on a server
    that is not schedulable (draining, not responding): they keep their resources untouched.
    """

    snapshot: ClusterSnapshot
    views: list[JobView]
    jobs: dict[int, Job]
    leases_by_job: dict[int, list[ActiveLease]]
    gpu_ids: dict[tuple[int, int], int]
    frozen_job_ids: set[int] = field(default_factory=set)


def active_leases() -> list[ActiveLease]:
    """Every active allocation with its held GPUs: two queries, whatever the cluster size."""
    gpus: dict[int, list[tuple[int, int]]] = defaultdict(list)
    for allocation_id, gpu_id, index in AllocationGpu.objects.filter(released_at__isnull=True).values_list(
        "allocation_id", "gpu_id", "gpu__index"
    ):
        gpus[allocation_id].append((index, gpu_id))
    leases = []
    for alloc_id, job_id, server_id, cpus, mem_gb, speedup, ips in Allocation.objects.filter(
        ended_at__isnull=True
    ).values_list("id", "job_id", "server_id", "num_cpus", "mem_gb", "speedup", "iters_per_s"):
        held = sorted(gpus.get(alloc_id, ()))
        leases.append(
            ActiveLease(
                allocation_id=alloc_id,
                job_id=job_id,
                server_id=server_id,
                num_cpus=cpus,
                mem_gb=mem_gb,
                speedup=speedup,
                gpu_ids=tuple(g for _, g in held),
                gpu_indices=tuple(i for i, _ in held),
                iters_per_s=ips,
            )
        )
    return leases


def server_busy_gpus() -> dict[int, int]:
    """Server id -> GPUs held by active leases."""
    return dict(
        AllocationGpu.objects.filter(released_at__isnull=True)
        .values_list("allocation__server_id")
        .annotate(n=Count("id"))
        .values_list("allocation__server_id", "n")
    )


def proportional_profile(
    shape: ServerShape, *, name: str = "own-command", iter_time_s: float = 1.0
) -> SensitivityProfile:
    """A profile whose best case is the GPU-proportional share: for own commands not yet profiled.

    Such a job gains nothing from extra CPU or memory, so every allocator gives it exactly its
    proportional share (speed-up 1.0).
    """
    c, m = shape.cpus_per_gpu, shape.mem_gb_per_gpu
    return SensitivityProfile(
        name=name,
        workload_class="other",
        cpu_per_gpu_grid=(c,),
        mem_gb_per_gpu_grid=(m,),
        tput=((1.0,),),
        best_cpus_per_gpu=c,
        best_mem_gb_per_gpu=m,
        speedup=1.0,
        iter_time_s=iter_time_s,
    )


# What the core assumes for an own command that neither reports its speed nor has a time limit.
OWN_COMMAND_GUESS_ITER_S = 1.0
# ... and for one without an iteration count either: one nominal iteration of an hour.
OWN_COMMAND_GUESS_LENGTH_S = 3600.0


def own_command_iter_time_s(job: Job, measured_iters_per_s: Iterable[float | None] = ()) -> float | None:
    """Seconds per iteration of an own command (it has no profile), or None when nothing tells.

    Its running lease's measured speed when it reports progress; else its time limit spread over its
    iterations (the length Slurm's backfill assumes: the job may stop earlier, never later). A job
    that gave no iteration count is one nominal iteration as long as its time limit (its reported
    progress, in units of its own, says nothing of its length).
    """
    if job.total_iters is None:
        return float(job.time_limit_s) if job.time_limit_s else None
    measured = [ips for ips in measured_iters_per_s if ips]
    if measured:
        return 1.0 / max(measured)
    if job.time_limit_s:
        return job.time_limit_s / max(1, job.total_iters)
    return None


def job_num_nodes(job: Job) -> int | None:
    """How many servers the job must span (the core's JobView.num_nodes): what it asked for; an own
    command that did not ask runs on one server (its processes know of no peers); None for a catalog
    workload, which the allocator may spread."""
    if job.num_nodes is not None:
        return job.num_nodes
    return None if job.workload_id is not None else 1


def _deadline_s(job: Job) -> float | None:
    deadline = job.deadline_at
    return None if deadline is None else deadline.timestamp()


def next_round_at(now: datetime, round_s: float) -> datetime:
    """When the next live round runs: one round after the last one, and not before now."""
    last = SchedulingRound.objects.order_by("-started_at").values_list("started_at", flat=True).first()
    return now if last is None else max(now, last + timedelta(seconds=round_s))


def round_inputs(*, servers: Sequence[Server], jobs: Iterable[Job]) -> RoundInputs:
    """Build the snapshot and job views of a round from server and job rows (rows given by the caller,
    who may have locked them).

    Round mode, like the simulator: every resource of a schedulable server is free, since the round
    re-decides every job in `jobs`; only leases of jobs outside the round (frozen ones, or jobs not
    passed in) are subtracted. `current` is each running job's placement from its active leases.
    """
    schedulable = sorted((s for s in servers if s.state in SCHEDULABLE_STATES), key=lambda s: s.id)
    schedulable_ids = {s.id for s in schedulable}
    leases_by_job: dict[int, list[ActiveLease]] = defaultdict(list)
    for lease in active_leases():
        leases_by_job[lease.job_id].append(lease)

    jobs_by_id: dict[int, Job] = {}
    frozen: set[int] = set()
    for job in sorted(jobs, key=lambda j: j.id):
        if any(lease.server_id not in schedulable_ids for lease in leases_by_job.get(job.id, ())):
            frozen.add(job.id)
        else:
            jobs_by_id[job.id] = job

    reserved_gpus: dict[int, set[int]] = defaultdict(set)
    reserved_cpus: dict[int, float] = defaultdict(float)
    reserved_mem: dict[int, float] = defaultdict(float)
    for job_id, leases in leases_by_job.items():
        if job_id in jobs_by_id:
            continue
        for lease in leases:
            if lease.server_id in schedulable_ids:
                reserved_gpus[lease.server_id].update(lease.gpu_indices)
                reserved_cpus[lease.server_id] += lease.num_cpus
                reserved_mem[lease.server_id] += lease.mem_gb

    # Profiling runs hold their GPUs, cores and memory until they end (services/profiling.py).
    for hold in profiling_holds():
        if hold.server_id in schedulable_ids:
            reserved_gpus[hold.server_id].update(hold.gpu_indices)
            reserved_cpus[hold.server_id] += hold.num_cpus
            reserved_mem[hold.server_id] += hold.mem_gb

    indices: dict[int, list[int]] = defaultdict(list)
    gpu_ids: dict[tuple[int, int], int] = {}
    for gpu_id, server_id, index, _uuid in gpus_active(server_ids=schedulable_ids):
        indices[server_id].append(index)
        gpu_ids[(server_id, index)] = gpu_id
    views_s = []
    for s in schedulable:
        if not indices[s.id]:
            continue
        views_s.append(
            ServerView(
                server_id=s.id,
                name=s.name,
                num_gpus=len(indices[s.id]),
                num_cpus=s.num_cpus,
                mem_gb=s.mem_gb,
                free_gpus=tuple(i for i in indices[s.id] if i not in reserved_gpus[s.id]),
                free_cpus=max(0, math.floor(s.num_cpus - reserved_cpus[s.id])),
                free_mem_gb=max(0.0, s.mem_gb - reserved_mem[s.id]),
            )
        )
    snapshot = ClusterSnapshot(servers=tuple(views_s))

    profiles = workload_profiles(ids={j.workload_id for j in jobs_by_id.values() if j.workload_id})
    usage: dict[int, float] = defaultdict(float)  # read only for a policy that orders by it
    if POLICIES.get(scheduler_conf().policy).reads_owner_usage:
        owners = {j.owner_id for j in jobs_by_id.values()}
        usage.update(owner_usage_gpu_s(owner_ids=owners, now=timezone.now()))
    shape = cluster_shape(snapshot) or REFERENCE_SHAPE
    views = []
    for job in jobs_by_id.values():
        if job.workload_id is None:
            measured = (lease.iters_per_s for lease in leases_by_job.get(job.id, ()))
            guess_s = OWN_COMMAND_GUESS_ITER_S if job.total_iters else OWN_COMMAND_GUESS_LENGTH_S
            iter_time_s = own_command_iter_time_s(job, measured) or guess_s
            profile = proportional_profile(shape, iter_time_s=iter_time_s)
        else:
            workload, profile = profiles[job.workload_id]
            if profile is None:
                profile = proportional_profile(shape, name=workload.name, iter_time_s=workload.iter_time_s)
        leases = leases_by_job.get(job.id)
        current = None
        if leases:
            current = Placement(
                job_id=job.id,
                shares=tuple(sorted((lease.share() for lease in leases), key=lambda sh: sh.server_id)),
                speedup=min(lease.speedup for lease in leases),
            )
        views.append(
            JobView(
                job_id=job.id,
                num_gpus=job.num_gpus,
                arrival_s=job.submitted_at.timestamp(),
                profile=profile,
                total_iters=float(job.total_iters or 1),
                done_iters=float(job.done_iters if job.total_iters else 0),
                attained_service_gpu_s=job.attained_service_gpu_s,
                cpus_per_gpu_override=job.cpus_per_gpu,
                mem_gb_per_gpu_override=job.mem_gb_per_gpu,
                deadline_s=_deadline_s(job),
                priority=job.priority,
                current=current,
                num_nodes=job_num_nodes(job),
                team_id=job.team_id,
                owner_id=job.owner_id,
                owner_usage_gpu_s=usage[job.owner_id],
            )
        )
    return RoundInputs(
        snapshot=snapshot,
        views=views,
        jobs=jobs_by_id,
        leases_by_job=dict(leases_by_job),
        gpu_ids=gpu_ids,
        frozen_job_ids=frozen,
    )


def owner_usage_gpu_s(*, owner_ids: Iterable[int], now: datetime) -> dict[int, float]:
    """Owner -> GPU-seconds their jobs attained, each job's weighed by 2^(-age / half-life), age being
    the time since it ended (0 while it runs or waits): fair share's recent usage, as Slurm decays it.
    Jobs that ended more than 8 half-lives ago (under 0.4 %) are not read."""
    half_life_s = scheduler_conf().fairshare_half_life_h * 3600.0
    owner_ids = list(owner_ids)
    usage: dict[int, float] = dict.fromkeys(owner_ids, 0.0)
    if not owner_ids or half_life_s <= 0:
        return usage
    since = now - timedelta(seconds=8 * half_life_s)
    rows = (
        Job.objects.filter(owner_id__in=owner_ids, attained_service_gpu_s__gt=0)
        .filter(Q(finished_at__isnull=True) | Q(finished_at__gte=since))
        .values_list("owner_id", "attained_service_gpu_s", "finished_at")
    )
    for owner_id, gpu_s, finished_at in rows:
        age_s = max(0.0, (now - finished_at).total_seconds()) if finished_at else 0.0
        usage[owner_id] += gpu_s * 0.5 ** (age_s / half_life_s)
    return usage


def team_quotas_left(*, jobs: list[Job], frozen_job_ids: set[int]) -> dict[int, int]:
    """Team id -> GPUs its jobs in this round may hold: its quota minus what its frozen jobs (leases
    on servers the round cannot touch) keep. Teams without a quota are not listed (no cap)."""
    quotas = dict(Team.objects.filter(gpu_quota__isnull=False).values_list("id", "gpu_quota"))
    for job in jobs:
        if job.pk in frozen_job_ids and job.team_id in quotas:
            quotas[job.team_id] = max(0, quotas[job.team_id] - job.num_gpus)
    return quotas


def borrowing_teams() -> frozenset[int]:
    """Ids of the teams with a quota whose jobs may borrow idle GPUs beyond it."""
    return frozenset(
        Team.objects.filter(gpu_quota__isnull=False, may_borrow=True).values_list("id", flat=True)
    )


# ---------------------------------------------------------------------------------------------------
# Jobs for users
# ---------------------------------------------------------------------------------------------------


def job_list(*, user: AbstractBaseUser) -> QuerySet[Job]:
    """The jobs `user` may see: their own, or every job for staff."""
    qs = Job.objects.select_related("owner", "team", "workload").order_by("-submitted_at", "-id")
    if not user.is_staff:
        qs = qs.filter(owner=user)
    return qs


def dependency_waits(*, job_ids: Iterable[int]) -> dict[int, dict[int, str]]:
    """For each of `job_ids` with a dependency that has not COMPLETED: dependency id -> its state."""
    waits: dict[int, dict[int, str]] = defaultdict(dict)
    for job_id, dep_id, state in (
        Job.depends_on.through.objects.filter(from_job_id__in=list(job_ids))
        .exclude(to_job__state=JobState.COMPLETED)
        .values_list("from_job_id", "to_job_id", "to_job__state")
    ):
        waits[job_id][dep_id] = state
    return dict(waits)


def dependency_pending_reason(dependency_states: Iterable[str]) -> str:
    """Dependency while every unfinished dependency may still complete; DependencyNeverSatisfied
    once one has ended otherwise (Slurm's reasons for afterok)."""
    if any(state in TERMINAL_JOB_STATES for state in dependency_states):
        return PendingReason.DEPENDENCY_NEVER_SATISFIED
    return PendingReason.DEPENDENCY


def job_detail_queryset(*, user: AbstractBaseUser) -> QuerySet[Job]:
    """job_list with each job's allocations (server, GPUs) and events prefetched."""
    holds = AllocationGpu.objects.select_related("gpu").order_by("gpu__index")
    allocations = (
        Allocation.objects.select_related("server")
        .prefetch_related(Prefetch("gpu_holds", queryset=holds))
        .order_by("started_at", "id")
    )
    return (
        job_list(user=user)
        .select_related("admission_prediction")
        .prefetch_related(Prefetch("allocations", queryset=allocations), "events")
    )


def job_log_tail(*, job: Job, lines: int = 200) -> list[str]:
    """The last `lines` lines of the job's output, over all its leases in start order."""
    out: list[str] = []
    for tail in job.allocations.order_by("started_at", "id").values_list("log_tail", flat=True):
        if tail:
            out.extend(tail.splitlines())
    return out[-lines:]


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


# ---------------------------------------------------------------------------------------------------
# Cluster overview
# ---------------------------------------------------------------------------------------------------


def cluster_overview() -> dict[str, Any]:
    """Every server with its state, capacity and what active leases use of it, plus cluster totals."""
    servers = list(Server.objects.order_by("name"))
    holders = dict(
        AllocationGpu.objects.filter(released_at__isnull=True).values_list("gpu_id", "allocation__job_id")
    )
    used = {
        row["server_id"]: row
        for row in Allocation.objects.filter(ended_at__isnull=True)
        .values("server_id")
        .annotate(cpus=Sum("num_cpus"), mem_gb=Sum("mem_gb"))
    }
    gpus_by_server: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for gpu_id, server_id, index, uuid in gpus_active(server_ids=[s.id for s in servers]):
        gpus_by_server[server_id].append(
            {"index": index, "uuid": uuid, "busy": gpu_id in holders, "job_id": holders.get(gpu_id)}
        )
    totals = dict.fromkeys(
        (
            "servers",
            "gpus",
            "cpus",
            "mem_gb",
            "gpus_in_use",
            "cpus_in_use",
            "mem_gb_in_use",
            "schedulable_gpus",
        ),
        0,
    )
    rows = []
    for s in servers:
        gpus = gpus_by_server.get(s.id, [])
        row = {
            "name": s.name,
            "hostname": s.hostname,
            "state": s.state,
            "state_reason": s.state_reason,
            "gpu_model": s.gpu_model,
            "last_heartbeat_at": s.last_heartbeat_at,
            "agent_version": s.agent_version,
            "capacity": {"gpus": len(gpus), "cpus": s.num_cpus, "mem_gb": s.mem_gb},
            "in_use": {
                "gpus": sum(1 for g in gpus if g["busy"]),
                "cpus": used.get(s.id, {}).get("cpus") or 0,
                "mem_gb": used.get(s.id, {}).get("mem_gb") or 0.0,
            },
            "gpus": gpus,
        }
        rows.append(row)
        totals["servers"] += 1
        totals["gpus"] += row["capacity"]["gpus"]
        totals["cpus"] += s.num_cpus
        totals["mem_gb"] += s.mem_gb
        totals["gpus_in_use"] += row["in_use"]["gpus"]
        totals["cpus_in_use"] += row["in_use"]["cpus"]
        totals["mem_gb_in_use"] += row["in_use"]["mem_gb"]
        if s.state in SCHEDULABLE_STATES:
            totals["schedulable_gpus"] += row["capacity"]["gpus"]
    return {"totals": totals, "servers": rows}


# ---------------------------------------------------------------------------------------------------
# Agent commands
# ---------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class JobPart:
    """One server's part of a running job, in rank order (the order its leases were created in)."""

    allocation_id: int
    server_name: str
    address: str
    num_gpus: int
    rendezvous_port: int | None


def job_parts(*, job_ids: Iterable[int]) -> dict[int, list[JobPart]]:
    """Each job's active leases as rendezvous parts, rank 0 first (one query for all the jobs)."""
    parts: dict[int, list[JobPart]] = defaultdict(list)
    rows = (
        Allocation.objects.filter(job_id__in=set(job_ids), ended_at__isnull=True)
        .annotate(num_gpus=Count("gpu_holds"))
        .order_by("job_id", "id")
        .values_list(
            "job_id",
            "id",
            "server__name",
            "server__address",
            "server__hostname",
            "num_gpus",
            "rendezvous_port",
        )
    )
    for job_id, allocation_id, name, address, hostname, num_gpus, port in rows:
        parts[job_id].append(JobPart(allocation_id, name, address or hostname or name, num_gpus, port))
    return parts


def rendezvous_env(job: Job, allocation: Allocation, parts: Sequence[JobPart]) -> dict[str, str]:
    """torchrun's and Slurm's variables for one part of a job: where rank 0 listens, which node this is,
    how many processes in all. Every part of a job gets the same MASTER_ADDR/MASTER_PORT."""
    ranks = [p.allocation_id for p in parts]
    node_rank = ranks.index(allocation.pk) if allocation.pk in ranks else 0
    master = parts[0] if parts else None
    local = parts[node_rank].num_gpus if parts else job.num_gpus
    env = {
        "NNODES": str(max(1, len(parts))),
        "NODE_RANK": str(node_rank),
        "WORLD_SIZE": str(sum(p.num_gpus for p in parts) or job.num_gpus),
        "LOCAL_WORLD_SIZE": str(local),
        "SLURM_JOB_ID": str(job.id),
        "SLURM_JOB_NAME": job.name,
        "SLURM_NNODES": str(max(1, len(parts))),
        "SLURM_NODEID": str(node_rank),
        "SLURM_JOB_NODELIST": ",".join(p.server_name for p in parts),
        "SLURM_GPUS_ON_NODE": str(local),
    }
    if master is not None and master.rendezvous_port is not None:
        # A job on one server rendezvouses with itself: loopback, so no firewall is in the way.
        env["MASTER_ADDR"] = master.address if len(parts) > 1 else "127.0.0.1"
        env["MASTER_PORT"] = str(master.rendezvous_port)
    return env


def _start_command(allocation: Allocation, parts: Sequence[JobPart]) -> dict[str, Any]:
    job = allocation.job
    env = {"ATTUNE_JOB_ID": str(job.id), "ATTUNE_MEM_GB": f"{allocation.mem_gb:g}"}
    if job.array_job_id is not None:
        # Slurm's names too, so that a sweep script ported from sbatch --array runs unchanged.
        for prefix in ("ATTUNE", "SLURM"):
            env[f"{prefix}_ARRAY_JOB_ID"] = str(job.array_job_id)
            env[f"{prefix}_ARRAY_TASK_ID"] = str(job.array_task_id)
    env.update(rendezvous_env(job, allocation, parts))
    command: dict[str, Any] = {
        "kind": "start",
        "lease_id": str(allocation.lease_id),
        "job_id": job.id,
        "job_name": job.name,
        "env": env,
        "gpu_uuids": [hold.gpu.uuid for hold in allocation.gpu_holds.all()],
        "num_cpus": allocation.num_cpus,
        "mem_gb": allocation.mem_gb,
        "resume_iters": job.done_iters,
        "run_as": None,
    }
    if job.workload is not None:
        argv, workload_env = workload_launch(job.workload, iters=job.total_iters)
        env.update(workload_env)
        command["argv"] = argv
        return command
    # An own command or script runs as its owner's account, in its working directory, writing the
    # files it asked for (the agent resolves relative paths against the working directory).
    pattern = job.output_path or default_output_pattern(
        array=job.array_job_id is not None, num_nodes=len(parts)
    )
    node_rank = int(env["NODE_RANK"])

    def expand(p: str) -> str:
        return output_path_expand(
            p,
            job_id=job.id,
            array_job_id=job.array_job_id,
            array_task_id=job.array_task_id,
            name=job.name,
            user=job.run_as,
            node_rank=node_rank,
            node_name=parts[node_rank].server_name if parts else allocation.server.name,
        )

    command.update(
        run_as=job.run_as,
        workdir=job.work_dir,
        stdout_path=expand(pattern),
        stderr_path=expand(job.error_path) if job.error_path else "",
    )
    if job.script:
        command.update(argv=[], script=job.script)
    else:
        command["argv"] = ["sh", "-c", job.command]
    return command


def agent_commands(*, server: Server, running: Iterable[UUID]) -> list[dict[str, Any]]:
    """The commands that bring `server` to the state the scheduler decided, from database state only.

    - start: an active lease of this server whose job is RUNNING and which the agent does not run;
    - preempt / cancel: a lease the agent runs that the service has ended (preempted by a round, or
      ended for any other reason: cancelled, finished elsewhere, node failure), or does not know;
    - drain: the server is DRAINING or DRAINED;
    - profile: a running profiling run on this server (docs/profiling.md); its lease id is live.
    Computed afresh on every poll, so a lost answer is simply repeated by the next one.
    """
    conf = scheduler_conf()
    running = set(running)
    holds = (
        AllocationGpu.objects.filter(released_at__isnull=True).select_related("gpu").order_by("gpu__index")
    )
    active = (
        Allocation.objects.filter(server=server, ended_at__isnull=True)
        .select_related("job", "job__workload")
        .prefetch_related(Prefetch("gpu_holds", queryset=holds))
        .order_by("started_at", "id")
    )
    commands: list[dict[str, Any]] = []
    live: set[UUID] = set()
    to_start: list[Allocation] = []
    for allocation in active:
        if allocation.job.state != JobState.RUNNING:
            continue
        live.add(allocation.lease_id)
        if allocation.lease_id not in running:
            to_start.append(allocation)
    if to_start:  # the rendezvous needs every part of those jobs, on whichever server
        parts = job_parts(job_ids=(a.job_id for a in to_start))
        commands += [_start_command(a, parts.get(a.job_id, [])) for a in to_start]
    for command in profiling_commands(server=server):
        live.add(UUID(command["lease_id"]))
        commands.append(command)
    stale = running - live
    if stale:
        ended = dict(
            Allocation.objects.filter(server=server, lease_id__in=stale).values_list("lease_id", "end_reason")
        )
        for lease_id in sorted(stale, key=str):
            if ended.get(lease_id) in PREEMPT_END_REASONS:
                commands.append(
                    {"kind": "preempt", "lease_id": str(lease_id), "grace_s": conf.preempt_grace_s}
                )
            else:
                commands.append({"kind": "cancel", "lease_id": str(lease_id), "grace_s": conf.cancel_grace_s})
    if server.state in (NodeState.DRAINING, NodeState.DRAINED):
        commands.append({"kind": "drain"})
    return commands


# ---------------------------------------------------------------------------------------------------
# Web pages: the queue and a job's speeds
# ---------------------------------------------------------------------------------------------------


def job_queue_page_queryset(*, user: AbstractBaseUser) -> QuerySet[Job]:
    """job_list in squeue's order (running, then pending, then finished; oldest first), each job with
    its active leases (server, GPUs) prefetched into `active_allocations`: a page costs the same few
    queries whatever its length."""
    holds = AllocationGpu.objects.select_related("gpu").order_by("gpu__index")
    active = (
        Allocation.objects.filter(ended_at__isnull=True)
        .select_related("server")
        .prefetch_related(Prefetch("gpu_holds", queryset=holds))
        .order_by("server__name", "id")
    )
    rank = Case(
        When(state=JobState.RUNNING, then=Value(0)),
        When(state=JobState.PENDING, then=Value(1)),
        default=Value(2),
        output_field=IntegerField(),
    )
    return (
        job_list(user=user)
        .prefetch_related(Prefetch("allocations", queryset=active, to_attr="active_allocations"))
        .order_by(rank, "submitted_at", "id")
    )


@dataclass(frozen=True)
class LeaseSpeed:
    """One lease of a job with its predicted and measured speed, iterations per second (None: unknown).

    Predicted: the profile's expectation for this allocation (its speed-up over the proportional share
    divided by the workload's seconds per iteration there). Measured: the agent's last report. When a
    SpeedObservation exists its pair wins, since it takes a fake node's time scale out of the measure.
    """

    allocation: Allocation
    predicted_iters_per_s: float | None
    measured_iters_per_s: float | None

    @property
    def measured_over_predicted(self) -> float | None:
        if not self.predicted_iters_per_s or self.measured_iters_per_s is None:
            return None
        return self.measured_iters_per_s / self.predicted_iters_per_s


def job_lease_speeds(*, job: Job) -> list[LeaseSpeed]:
    """Every lease of `job` (from job_detail_queryset's prefetch) with predicted and measured speed."""
    allocations = list(job.allocations.all())
    observations = speed_observations_by_allocation(allocation_ids=[a.pk for a in allocations])
    iter_time_s = job.workload.iter_time_s if job.workload is not None else None
    out = []
    for allocation in allocations:
        obs = observations.get(allocation.pk)
        if obs is not None:
            predicted, measured = obs.predicted_iters_per_s, obs.measured_iters_per_s
        else:
            predicted = allocation.speedup / iter_time_s if iter_time_s else None
            measured = allocation.iters_per_s
        out.append(LeaseSpeed(allocation, predicted, measured))
    return out
