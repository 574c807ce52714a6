"""What a job's end teaches and tells, once the end itself is recorded: the workload's speed correction,
placement and interference fits, the admission outcome, the owner's notification.

None of it changes what the agents or the next round are told, so with workers it waits for the
applier (`job_end_followups_run`, every ATTUNE_PROGRESS_APPLY_S) rather than run in the sync that
reported the exit: at a churn of many job ends a second those steps were a third of an exit's sync.
Without workers (the embedded demo, ATTUNE_PROGRESS_APPLY_S=0) they run within job_finish.
"""

from __future__ import annotations

from typing import Any

from django.db import connection, transaction

from notify_app.models import NotificationSettings
from notify_app.services.events import notification_job_ended
from notify_app.services.settings import notification_settings_of
from profiles_app.services.refits import interference_kappa_refit, placement_penalty_refit
from profiles_app.services.speeds import speed_corrections_fold
from scheduler_app.conf import scheduler_conf
from scheduler_app.models import Job, JobEndPending
from scheduler_app.services.admission_judge import admission_outcome_record
from scheduler_app.services.job_batches import job_batches_run

FOLLOWUPS_PER_BATCH = 200  # job ends per transaction of the applier


def job_end_followups(*, job: Job, state: str, reason: str = "", data: dict[str, Any] | None = None) -> None:
    """Run a job's end follow-ups now, or leave them to the applier (in the caller's transaction)."""
    if scheduler_conf().progress_deferred:
        _pending_insert(job_id=job.pk, state=state, reason=reason, data=data or {})
        return
    _jobs_learn([job])
    _job_tell(job=job, state=state, reason=reason, data=data)


def _pending_insert(*, job_id: int, state: str, reason: str, data: dict[str, Any]) -> None:
    """The applier's row for a job's end, once (a second end of the same job is ignored): one
    hand-written statement, as every exit's sync writes one (the ORM's bulk_create cost 0.2 ms of CPU)."""
    prep = JobEndPending._meta.get_field("data").get_db_prep_value(data, connection)
    table = connection.ops.quote_name(JobEndPending._meta.db_table)
    sql = (
        f"INSERT INTO {table} (job_id, state, reason, data) VALUES (%s, %s, %s, %s)"
        f" ON CONFLICT (job_id) DO NOTHING"
    )
    with connection.cursor() as cursor:
        cursor.execute(sql, [job_id, state, reason, prep])


def _jobs_learn(jobs: list[Job]) -> None:
    """Fold the jobs' measured speeds into their workloads' corrections, then refit the placement (and,
    for a communicating job, the interference) fits of the workloads of the jobs that were measured:
    once per workload, as the fits read the workload's latest measured leases, however many ended."""
    measured = speed_corrections_fold(jobs=[(j.pk, j.workload_id) for j in jobs if j.workload_id is not None])
    refits: dict[int, bool] = {}  # workload -> refit the interference too
    for job in jobs:
        if job.pk in measured:
            refits[job.workload_id] = refits.get(job.workload_id, False) or job.num_gpus > 1
    for workload_id, interference in sorted(refits.items()):
        placement_penalty_refit(workload_id=workload_id)
        if interference:
            interference_kappa_refit(workload_id=workload_id)


def _job_tell(
    *,
    job: Job,
    state: str,
    reason: str,
    data: dict[str, Any] | None,
    owner_settings: dict[int, NotificationSettings] | None = None,
) -> None:
    admission_outcome_record(job=job)
    notification_job_ended(job=job, state=state, reason=reason, data=data, owner_settings=owner_settings)


@transaction.atomic
def _followups_apply(job_ids: list[int]) -> int:
    """The pending follow-ups of these jobs, rows locked (others a concurrent run holds are left to
    it), run and deleted in this transaction; returns how many ran."""
    pending = list(
        JobEndPending.objects.select_for_update(skip_locked=True)
        .filter(job_id__in=job_ids)
        .order_by("job_id")
    )
    if not pending:
        return 0
    jobs = Job.objects.in_bulk([p.job_id for p in pending])
    _jobs_learn([jobs[p.job_id] for p in pending])
    owner_settings = notification_settings_of(job.owner_id for job in jobs.values())
    for p in pending:
        job = jobs[p.job_id]
        _job_tell(job=job, state=p.state, reason=p.reason, data=p.data, owner_settings=owner_settings)
    JobEndPending.objects.filter(job_id__in=[p.job_id for p in pending]).delete()
    return len(pending)


def job_end_followups_run() -> int:
    """The applier's part for ended jobs: every pending follow-up, a batch of jobs per transaction (one
    job's failure holds back only its own; logged, retried on each run). Returns the ends followed up."""
    return job_batches_run(
        next_job_ids=lambda after: list(
            JobEndPending.objects.filter(job_id__gt=after)
            .order_by("job_id")
            .values_list("job_id", flat=True)[:FOLLOWUPS_PER_BATCH]
        ),
        apply=_followups_apply,
        failure="the follow-ups of its end failed",
    )
