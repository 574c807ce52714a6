"""squeue's shared line for an array's pending tasks: which tasks share it, and how it is named."""

import pytest

from cli.array_rows import array_run_id, gather_array_runs, index_ranges


def task(job_id: int, index: int, *, state="PENDING", reason="Priority", array=10, limit=None) -> dict:
    return {
        "id": job_id,
        "array_job": array,
        "array_task_id": index,
        "array_task_limit": limit,
        "state": state,
        "pending_reason": reason,
    }


@pytest.mark.parametrize(
    ("indices", "text"),
    [
        ([7], "7"),
        ([0, 1, 2], "0-2"),
        ([3, 4, 5, 7], "3-5,7"),
        ([1, 3, 5, 6], "1,3,5-6"),
        ([0, 2, 3, 9], "0,2-3,9"),
    ],
)
def test_indices_are_written_as_slurm_ranges(indices, text):
    assert index_ranges(indices) == text


def test_only_consecutive_pending_tasks_of_one_array_with_one_reason_share_a_line():
    plain = {"id": 99, "array_job": None, "state": "PENDING", "pending_reason": "Priority"}
    jobs = [
        task(10, 0, state="RUNNING", reason="None"),
        task(11, 1, reason="JobArrayTaskLimit", limit=2),
        task(12, 2, reason="JobArrayTaskLimit", limit=2),
        task(14, 4, reason="JobArrayTaskLimit", limit=2),
        task(13, 3, reason="JobHeldUser", limit=2),
        plain,
        task(15, 5, reason="JobArrayTaskLimit", limit=2),
        task(21, 0, array=21),
    ]
    runs = gather_array_runs(jobs)
    assert [[j["id"] for j in run] for run in runs] == [[10], [11, 12, 14], [13], [99], [15], [21]]
    assert array_run_id(runs[1]) == "10_[1-2,4%2]"
    assert array_run_id([task(21, 0, array=21), task(22, 1, array=21)]) == "21_[0-1]"
