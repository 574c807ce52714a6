"""Jobs as users see them: lists, details, dependencies, log tails and each lease's speed."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime

from django.contrib.auth.models import AbstractBaseUser
from django.db.models import (
    Case,
    Count,
    IntegerField,
    Model,
    Prefetch,
    QuerySet,
    Value,
    When,
    prefetch_related_objects,
)

from profiles_app.selectors import speed_observations_by_allocation, workload_iter_time_s
from scheduler_app.conf import scheduler_conf
from scheduler_app.models import (
    TERMINAL_JOB_STATES,
    Allocation,
    AllocationGpu,
    Job,
    JobState,
    PendingReason,
)
from scheduler_app.selectors.restarts import job_restarts_none, jobs_with_restarts

# The kind of a job's first event (services/job_lifecycle.py's NEW -> PENDING): no restart.
SUBMITTED_KIND = "submitted"


def job_counts_by_state() -> dict[str, int]:
    """State -> number of jobs, with every state present (zero when none)."""
    counts = dict(Job.objects.values_list("state").annotate(n=Count("id")).values_list("state", "n"))
    return {state: counts.get(state, 0) for state in JobState.values}


def job_list(*, user: AbstractBaseUser) -> QuerySet[Job]:
    """The jobs `user` may see, as squeue shows them: everyone's (their summaries; what a job runs and
    writes stays its owner's, see job_details_visible), or only their own when the cluster keeps jobs
    private (ATTUNE_PRIVATE_JOBS, Slurm's PrivateData=jobs). Staff see every job."""
    qs = Job.objects.select_related("owner", "team", "workload", "forecast").order_by("-submitted_at", "-id")
    if scheduler_conf().private_jobs and not user.is_staff:
        qs = qs.filter(owner=user)
    return qs


def job_manageable(*, user: AbstractBaseUser) -> QuerySet[Job]:
    """The jobs `user` may act on (cancel, hold, release, depend on): their own; staff: every job."""
    qs = Job.objects.select_related("owner", "team", "workload").order_by("-submitted_at", "-id")
    return qs if user.is_staff else qs.filter(owner=user)


def job_details_visible(job: Job, user: AbstractBaseUser) -> bool:
    """Whether `user` may read what `job` runs and writes (command, script, paths, log, event messages):
    its owner and staff, as with Slurm's scontrol show job and the job's output files."""
    return user.is_staff or job.owner_id == user.pk


def dependency_waits(*, job_ids: Iterable[int]) -> dict[int, dict[int, str]]:
    """For each of `job_ids` (PENDING jobs: only those wait for dependencies) with a dependency that
    has not COMPLETED: dependency id -> its state."""
    wanted = set(job_ids)
    if not wanted:
        return {}
    waits: dict[int, dict[int, str]] = defaultdict(dict)
    # The dependents' state rather than an IN list of every pending job: a round asks for its whole
    # queue, and a thousand-id IN costs more to build and parse than the few dependency rows it finds.
    for job_id, dep_id, state in (
        Job.depends_on.through.objects.filter(from_job__state=JobState.PENDING)
        .exclude(to_job__state=JobState.COMPLETED)
        .values_list("from_job_id", "to_job_id", "to_job__state")
    ):
        if job_id in wanted:
            waits[job_id][dep_id] = state
    return dict(waits)


def live_array_limits() -> dict[int, tuple[int, list[int]]]:
    """Each array with a limit on tasks running at once (--array 0-99%4) and a task still pending or
    running: its limit and the ids of those tasks in index order (a partial index holds just them)."""
    rows = (
        Job.objects.filter(state__in=[JobState.PENDING, JobState.RUNNING], array_task_limit__isnull=False)
        .order_by("array_job_id", "array_task_id")
        .values_list("pk", "array_job_id", "array_task_limit")
    )
    return array_limits_of(rows)


def array_limits_of(tasks: Iterable[tuple[int, int, int]]) -> dict[int, tuple[int, list[int]]]:
    """(job id, array id, limit) of an array's tasks in index order -> array id -> (limit, job ids)."""
    limits: dict[int, tuple[int, list[int]]] = {}
    for job_id, array_id, limit in tasks:
        limits.setdefault(array_id, (limit, []))[1].append(job_id)
    return limits


def dependency_pending_reason(dependency_states: Iterable[str]) -> str:
    """Dependency while every unfinished dependency may still complete; DependencyNeverSatisfied
    once one has ended otherwise (Slurm's reasons for afterok)."""
    if any(state in TERMINAL_JOB_STATES for state in dependency_states):
        return PendingReason.DEPENDENCY_NEVER_SATISFIED
    return PendingReason.DEPENDENCY


def job_detail_queryset(*, user: AbstractBaseUser) -> QuerySet[Job]:
    """job_list with each job's allocations (server, GPUs) and events prefetched, and its restarts
    (selectors/restarts.py: moves, preemptions, GPU time lost) in the job's own query."""
    return jobs_with_restarts(
        job_list(user=user)
        .select_related("admission_prediction")
        .prefetch_related(Prefetch("allocations", queryset=_job_allocations()), "events")
    )


def job_submitted_detail(*, user: AbstractBaseUser, job_id: int, dependencies: bool) -> Job:
    """A job just submitted, as job_detail_queryset reads it with its dependencies: the submission's
    answer, at a third of the CPU (bench.submit_cost). What its row and its submission say is not read
    again: a job never started has no lease (a round inserts a job's leases in the transaction that
    sets its start), one submitted with no dependencies has none (only its submission writes them),
    and one with neither a lease nor any event but `submitted` has no restart (job_restarts_none:
    no correlated subqueries to build). `dependencies`: whether the submission named any."""
    job = job_list(user=user).select_related("admission_prediction").get(pk=job_id)
    never_started = job.started_at is None
    lookups: list[str | Prefetch] = ["events"]
    if never_started:
        _known_empty(job, "allocations", Allocation)
    else:
        lookups.append(Prefetch("allocations", queryset=_job_allocations()))
    if dependencies:
        lookups.append(Prefetch("depends_on", queryset=Job.objects.only("pk")))
    else:
        _known_empty(job, "depends_on", Job)
    prefetch_related_objects([job], *lookups)
    if never_started and all(event.kind == SUBMITTED_KIND for event in job.events.all()):
        job_restarts_none(job)
    return job


def job_submitted_as_stored(*, job: Job, dependencies: bool, no_estimate_since: bool = False) -> Job | None:
    """A job just submitted, as its submission stored it, when the request holds every part of the
    answer (job_submitted_detail's read, no query): the job as created (its owner, team and workload
    as validated), its `submitted` event (services/jobs.py keeps it as the job's events), its
    admission prediction and its current estimate as stored in the request (a job answered behind
    the forecast's window: services/admission.py). None otherwise (an estimate stored by a forecast,
    a prediction the worker may be filling, dependencies): read it with job_submitted_detail. A job
    never started has no lease nor restart, and one without dependencies none; the answer is the job
    as committed (a round that places it a moment later shows on its page). `no_estimate_since`: the
    caller knows that no forecast can have stored an estimate of the job since its commit (its answer
    did not wait for the forecasts worker: services/admission_worker.py admission_answer_wait), so a job
    known to have none (left to the worker) is answered as stored too."""
    if dependencies or not (Job.forecast.is_cached(job) and Job.admission_prediction.is_cached(job)):
        return None
    if Job.forecast.related.get_cached_value(job) is None and not no_estimate_since:
        return None  # known to have none: a forecast may store one (not in hand) meanwhile
    if "events" not in getattr(job, "_prefetched_objects_cache", {}):
        return None
    _known_empty(job, "allocations", Allocation)
    _known_empty(job, "depends_on", Job)
    job_restarts_none(job)
    return job


def job_relation_known(job: Model, relation: str, rows: list[Model]) -> None:
    """Give `job` its `relation` as prefetched with `rows`, as prefetch_related_objects stores it: what
    the caller has just stored, not read again."""
    _prefetched_as(job, relation, list(rows))


def _known_empty(job: Job, relation: str, model: type[Model]) -> None:
    """Give `job` its `relation` as prefetched and empty, as prefetch_related_objects stores one that
    found nothing: the prefetch machinery costs more CPU than the rest of an empty relation's read."""
    _prefetched_as(job, relation, [])


def _prefetched_as(job: Model, relation: str, rows: list[Model]) -> None:
    # The relation's own queryset (the job's related manager), as prefetch_related keeps it: `all()`
    # gives `rows`, and a filter on it (`job.events.get(kind=...)` after a change) reads the database
    # like any prefetched relation's, rather than filtering an empty none() to nothing.
    cache = job.__dict__.setdefault("_prefetched_objects_cache", {})
    cache.pop(relation, None)  # else the manager hands back the cached queryset
    queryset = getattr(job, relation).all()
    queryset._result_cache, queryset._prefetch_done = rows, True
    cache[relation] = queryset


def _job_allocations() -> QuerySet[Allocation]:
    """A job's leases as its details show them: in start order, each with its server and GPUs."""
    holds = AllocationGpu.objects.select_related("gpu").order_by("gpu__index")
    return (
        Allocation.objects.select_related("server")
        .prefetch_related(Prefetch("gpu_holds", queryset=holds))
        .order_by("started_at", "id")
    )


def job_log_tail(*, job: Job, lines: int = 200) -> list[str]:
    """The last `lines` lines of the job's output, over all its leases in start order."""
    out: list[str] = []
    for tail in job.allocations.order_by("started_at", "id").values_list("log_tail", flat=True):
        if tail:
            out.extend(tail.splitlines())
    return out[-lines:]


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
    iter_time_s = workload_iter_time_s(job.workload, job.num_gpus) if job.workload is not None else None
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


def jobs_run_time_s(*, job_ids: Iterable[int], now: datetime) -> dict[int, float]:
    """Seconds each job has held its resources up to `now`, over all its leases (a job spanning servers
    has one lease per server for the same interval, counted once): what its time limit is charged.
    Jobs that never ran are left out."""
    intervals: dict[int, set[tuple[datetime, datetime]]] = defaultdict(set)
    rows = Allocation.objects.filter(job_id__in=list(job_ids)).values_list("job_id", "started_at", "ended_at")
    for job_id, started_at, ended_at in rows:
        intervals[job_id].add((started_at, ended_at or now))
    return {
        job_id: sum(max(0.0, (end - start).total_seconds()) for start, end in spans)
        for job_id, spans in intervals.items()
    }
