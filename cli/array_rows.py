"""squeue's pending array tasks on one line: a run of an array's tasks that wait for the same reason
shows as `20_[3-5,7%2]` (its array's id, the tasks' indices, its limit on tasks at once)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

Job = dict[str, Any]


def gather_array_runs(jobs: Sequence[Job]) -> list[list[Job]]:
    """The jobs in their order, each alone in its list, but for each run of consecutive PENDING tasks
    of one array with the same reason, which share a list."""
    runs: list[list[Job]] = []
    for job in jobs:
        last = runs[-1][-1] if runs else None
        if last is not None and _same_run(last, job):
            runs[-1].append(job)
        else:
            runs.append([job])
    return runs


def _same_run(a: Job, b: Job) -> bool:
    return (
        a["state"] == b["state"] == "PENDING"
        and a.get("array_job") is not None
        and a.get("array_job") == b.get("array_job")
        and a["pending_reason"] == b["pending_reason"]
    )


def array_run_id(tasks: Sequence[Job]) -> str:
    """`20_[3-5,7%2]`: the tasks' array, their indices as ranges, and the array's limit if it has one."""
    first = tasks[0]
    limit = first.get("array_task_limit")
    indices = index_ranges(sorted(t["array_task_id"] for t in tasks))
    return f"{first['array_job']}_[{indices}{f'%{limit}' if limit else ''}]"


def index_ranges(indices: Sequence[int]) -> str:
    """Sorted indices as Slurm writes them: 3-5,7,9-10."""
    parts: list[str] = []
    start = prev = indices[0]
    for i in [*indices[1:], None]:
        if i is not None and i == prev + 1:
            prev = i
            continue
        parts.append(str(start) if start == prev else f"{start}-{prev}")
        if i is not None:
            start = prev = i
    return ",".join(parts)
