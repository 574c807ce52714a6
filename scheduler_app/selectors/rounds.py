"""A round's inputs: the snapshot and job views the core decides on, from server and job rows."""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.db.models import Q
from django.utils import timezone

from cluster_app.models import Server
from cluster_app.selectors import gpus_active, server_takes_work
from profiles_app.models import Workload
from profiles_app.selectors import (
    profiling_holds,
    workload_profiles,
)
from scheduler_app.conf import scheduler_conf
from scheduler_app.core.policies import POLICIES
from scheduler_app.core.throughput import REFERENCE_SHAPE, ServerShape, cluster_shape, job_profile
from scheduler_app.core.types import (
    ClusterSnapshot,
    JobView,
    Placement,
    SensitivityProfile,
    ServerView,
)
from scheduler_app.models import (
    Job,
    SchedulingRound,
    Team,
)
from scheduler_app.selectors.leases import ActiveLease, active_leases
from scheduler_app.selectors.restart_facts import checkpoint_every_s_of, own_seconds
from scheduler_app.selectors.round_jobs import JobLike


@dataclass
class RoundInputs:
    """What a round (or the queue view) decides on, plus the row lookups needed to apply its plan.

    `frozen_job_ids`: running jobs left out of the round because a lease of theirs sits on a server
    that is not schedulable (draining, not responding): they keep their resources untouched.
    """

    snapshot: ClusterSnapshot
    views: list[JobView]
    jobs: dict[int, JobLike]
    leases_by_job: dict[int, list[ActiveLease]]
    gpu_ids: dict[tuple[int, int], int]
    frozen_job_ids: set[int] = field(default_factory=set)
    now_s: float = 0.0  # the clock the views' lease_started_s are counted back from (own time, above)


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


def own_command_iter_time_s(job: JobLike, measured_iters_per_s: Iterable[float | None] = ()) -> float | None:
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


def job_num_nodes(job: JobLike) -> int | None:
    """How many servers the job must span (the core's JobView.num_nodes): what it asked for; an own
    command that did not ask runs on one server (its processes know of no peers); None for a catalog
    workload, which the allocator may spread."""
    if job.num_nodes is not None:
        return job.num_nodes
    return None if job.workload_id is not None else 1


def _restart_facts(
    job: JobLike,
    workload: Workload | None,
    leases: list[ActiveLease] | None,
    *,
    now_s: float,
    time_scales: dict[int, float],
) -> dict:
    """JobView's startup_s, checkpoint_every_s and lease_started_s (core/restarts.py): the start-up its
    own latest measured lease took, else its workload's (learnt, or the profile default), else the
    own-command default; the interval it declared, else its workload's; its current lease's start.

    One clock, the job's own: profiles, start-ups (the agents divide a fake node's measure by its
    scale) and checkpoint intervals are in the job's own seconds, so the lease's age is too. On a fake
    node with --time-scale 0.05 a lease 10 s old (wall) has run 200 s of the job's time; on a real
    node (scale 1) the two are the same.
    """
    measured = getattr(job, "last_startup_s", None)  # RoundJob only; a Job instance falls back
    if measured is not None:
        startup_s = measured
    elif workload is not None:
        startup_s = workload.startup_s
    else:
        startup_s = scheduler_conf().own_command_startup_s
    own_ages_s = [
        own_seconds(max(0.0, now_s - lease.run_started_at.timestamp()), time_scales.get(lease.server_id))
        for lease in leases or ()
        if lease.run_started_at is not None
    ]
    return {
        "startup_s": float(startup_s),
        "checkpoint_every_s": checkpoint_every_s_of(
            job_checkpoint_every_s=job.checkpoint_every_s,
            workload_checkpoint_every_s=workload.checkpoint_every_s if workload is not None else None,
        ),
        # A job over several servers: its earliest part's start (the most work a restart loses).
        "lease_started_s": now_s - max(own_ages_s) if own_ages_s else None,
    }


def _deadline_s(job: JobLike) -> float | None:
    deadline = job.deadline_at
    return None if deadline is None else deadline.timestamp()


def next_round_at(now: datetime, round_s: float) -> datetime:
    """When the next live round runs: one round after the last one, and not before now."""
    last = SchedulingRound.objects.order_by("-started_at").values_list("started_at", flat=True).first()
    return now if last is None else max(now, last + timedelta(seconds=round_s))


def round_inputs(
    *, servers: Sequence[Server], jobs: Iterable[JobLike], now: datetime | None = None
) -> RoundInputs:
    """Build the snapshot and job views of a round from server and job rows (rows given by the caller,
    who may have locked them).

    Round mode, like the simulator: every resource of a schedulable server is free, since the round
    re-decides every job in `jobs`; only leases of jobs outside the round (frozen ones, or jobs not
    passed in) are subtracted. `current` is each running job's placement from its active leases.
    """
    # Never a server whose agent has not registered: its GPUs are node_token's placeholders.
    schedulable = sorted((s for s in servers if server_takes_work(s)), key=lambda s: s.id)
    schedulable_ids = {s.id for s in schedulable}
    leases_by_job: dict[int, list[ActiveLease]] = defaultdict(list)
    for lease in active_leases():
        leases_by_job[lease.job_id].append(lease)

    jobs_by_id: dict[int, JobLike] = {}
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
    now_s = (now or timezone.now()).timestamp()
    time_scales = {s.id: s.time_scale for s in servers if s.time_scale and s.time_scale > 0}
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
            profile = job_profile(profile, job.num_gpus)  # a GENIE fit times k GPUs apart from 1
        leases = leases_by_job.get(job.id)
        restart = _restart_facts(
            job,
            profiles[job.workload_id][0] if job.workload_id else None,
            leases,
            now_s=now_s,
            time_scales=time_scales,
        )
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
                min_rate_iters_per_s=job.qos_min_rate_iters_per_s,
                **restart,
            )
        )
    return RoundInputs(
        snapshot=snapshot,
        views=views,
        jobs=jobs_by_id,
        leases_by_job=dict(leases_by_job),
        gpu_ids=gpu_ids,
        frozen_job_ids=frozen,
        now_s=now_s,
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


def team_quotas_left(*, jobs: Sequence[JobLike], frozen_job_ids: set[int]) -> dict[int, int]:
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
