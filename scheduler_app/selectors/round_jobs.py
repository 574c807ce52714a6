"""The jobs a live round decides on: every PENDING or RUNNING job, locked, read as plain rows."""

from __future__ import annotations

from dataclasses import dataclass, fields
from datetime import datetime

from scheduler_app.models import Job, JobState, qos_deadline


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


def round_jobs_lock() -> list[RoundJob]:
    """Every PENDING or RUNNING job, in id order, its row locked until the round's transaction ends.

    The lock is what keeps a concurrent cancel, finish, hold or update of a job from being lost or
    overwritten: such a change locks the job row first (select_for_update), so it either commits
    before this read (and the round sees its result, or no longer sees the job) or waits until the
    round has committed (and then acts on what the round wrote). Locking every queued row costs about
    2 ms for a thousand jobs; building model instances for them was what cost.

    of=("self",) locks only job rows. no_key: a foreign key check of another transaction (its rows
    pointing at a job) must not wait for the round, for the reason given in servers_lock_all.
    """
    rows = (
        Job.objects.select_for_update(of=("self",), no_key=True)
        .filter(state__in=[JobState.PENDING, JobState.RUNNING])
        .order_by("id")
        .values_list(*_COLUMNS)
    )
    return [RoundJob(*row) for row in rows]
