"""The jobs a live round decides on: every PENDING or RUNNING job read as plain rows, and the rows it
writes locked and read again before it writes them."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, fields
from datetime import datetime

from scheduler_app.models import Allocation, Job, JobState, qos_deadline
from scheduler_app.selectors.restart_facts import last_lease_startup_s


@dataclass(slots=True)
class RoundJob:
    """The columns of a job that a round reads, and the hooks before it (held, dependencies,
    profiling) may update (`pending_reason`). Duck-types the Job attributes they use.

    Why not model instances: a round reads its whole queue, and building a thousand Job instances
    (every column, Model.__init__ per row) cost more than locking and reading the rows themselves
    (docs/performance.md, "Live round"). A round writes jobs only through bulk statements by id.
    """

    id: int
    owner_id: int
    team_id: int | None
    workload_id: int | None
    num_gpus: int
    num_nodes: int | None
    cpus_per_gpu: float | None
    mem_gb_per_gpu: float | None
    total_iters: int | None
    done_iters: int
    attained_service_gpu_s: float
    qos_deadline_at: datetime | None
    qos_max_latency_s: float | None
    qos_min_rate_iters_per_s: float | None
    priority: int
    time_limit_s: int | None
    held: bool
    state: str
    pending_reason: str
    submitted_at: datetime
    checkpoint_every_s: float | None
    # The measured start-up of its latest lease that measured one (restart_facts.last_lease_startup_s);
    # not a column: a Job instance has none, and round_inputs then uses its workload's.
    last_startup_s: float | None

    @property
    def pk(self) -> int:
        return self.id

    @property
    def deadline_at(self) -> datetime | None:
        """As Job.deadline_at."""
        return qos_deadline(self.submitted_at, self.qos_deadline_at, self.qos_max_latency_s)


# A job as the round's hooks and selectors read it: a model instance (the forecast, tests) or a row.
JobLike = Job | RoundJob

_COLUMNS = tuple(f.name for f in fields(RoundJob))


def round_jobs_read() -> list[RoundJob]:
    """Every PENDING or RUNNING job, in id order, not locked.

    A round on a thousand servers computes its plan for a second or more; locking every job row for
    that long made every agent's report wait for it (docs/performance.md, "Rounds that lock only what
    they write"). The round locks the rows it is about to write instead, and reads them again
    (round_jobs_recheck), dropping the decisions of jobs that changed meanwhile.
    """
    rows = (
        Job.objects.filter(state__in=[JobState.PENDING, JobState.RUNNING])
        .annotate(last_startup_s=last_lease_startup_s())  # a subquery in the same statement
        .order_by("id")
        .values_list(*_COLUMNS)
    )
    return [RoundJob(*row) for row in rows]


@dataclass(frozen=True, slots=True)
class JobNow:
    """A job's row as it is now, locked, with the servers of its active leases."""

    state: str
    held: bool
    lease_ids: frozenset[int]
    lease_server_ids: frozenset[int]


def round_jobs_recheck(job_ids: Iterable[int]) -> dict[int, JobNow]:
    """Lock the rows of `job_ids` (id order, FOR NO KEY UPDATE) and read what a round's plan depends on:
    state, hold and active leases. A job missing from the result no longer exists.

    The lock is what keeps a concurrent cancel, finish, hold or report of a job from being lost or
    overwritten: such a change locks the job row first, so it either committed before this read (and
    the round sees it, and leaves the job alone) or waits until the round has committed (and then acts
    on what the round wrote). no_key: as in servers_lock_all, a foreign key check of another
    transaction (its rows pointing at a job) must not wait for the round.
    """
    ids = sorted(set(job_ids))
    if not ids:
        return {}
    rows = list(
        Job.objects.select_for_update(of=("self",), no_key=True)
        .filter(pk__any=ids)  # cluster_app/lookups.py: one array, not a thousand parameters
        .order_by("id")
        .values_list("id", "state", "held")
    )
    leases: dict[int, set[int]] = defaultdict(set)
    servers: dict[int, set[int]] = defaultdict(set)
    for allocation_id, job_id, server_id in Allocation.objects.filter(
        job_id__any=ids, ended_at__isnull=True
    ).values_list("id", "job_id", "server_id"):
        leases[job_id].add(allocation_id)
        servers[job_id].add(server_id)
    return {
        job_id: JobNow(state, held, frozenset(leases[job_id]), frozenset(servers[job_id]))
        for job_id, state, held in rows
    }
