"""The queue page's rows: an array's pending tasks waiting for the same reason share one, as in squeue."""

from __future__ import annotations

from dataclasses import dataclass

from django.db.models import QuerySet

from cli.array_rows import array_run_id, gather_array_runs
from scheduler_app.models import Job

# What the grouping reads of each job, named as the API's fields (cli.array_rows reads those).
_KEY_COLUMNS = ("id", "state", "array_job_id", "pending_reason", "array_task_id", "array_task_limit")
_KEY_NAMES = ("id", "state", "array_job", "pending_reason", "array_task_id", "array_task_limit")


@dataclass(frozen=True)
class QueueRow:
    """One row of the page: a job, or a run of an array's pending tasks (`label`, e.g. `35_[2-9%2]`)."""

    job_ids: tuple[int, ...]  # the first is the job the row shows
    label: str = ""  # empty for a row of one job

    @property
    def task_count(self) -> int:
        return len(self.job_ids)


def queue_rows(jobs: QuerySet[Job], *, each_task: bool) -> list[QueueRow]:
    """The rows of `jobs` in their order; with `each_task` (squeue -r), one row per job. Reads a few
    columns of every matching job (not whole rows), so that a page of rows can hold any number of tasks."""
    keys = [
        dict(zip(_KEY_NAMES, row, strict=True))
        for row in jobs.prefetch_related(None).values_list(*_KEY_COLUMNS)
    ]
    runs = [[key] for key in keys] if each_task else gather_array_runs(keys)
    return [
        QueueRow(tuple(key["id"] for key in run), array_run_id(run) if len(run) > 1 else "") for run in runs
    ]
