"""Node counts in simulation: the optional `nodes=N` trace field, and the same core path as live rounds."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path

import pytest

from scheduler_app.core.allocators import ALLOCATORS, Allocator
from scheduler_app.core.types import ClusterSnapshot, JobView, RoundPlan
from scheduler_app.simulator import ClusterSpec, TraceError, TraceJob, read_trace, simulate, write_trace
from scheduler_app.simulator.forecast import forecast
from scheduler_app.simulator.trace import format_trace_line
from tests.builders import make_cluster, make_job


class RecordingAllocator(Allocator):
    """A registered allocator that remembers every view it was given and every plan it returned."""

    name = "recording"

    def __init__(self, inner: str) -> None:
        self.inner = ALLOCATORS.get(inner)()
        self.views: list[JobView] = []
        self.plans: list[RoundPlan] = []

    def allocate(self, ordered_jobs: Sequence[JobView], snapshot: ClusterSnapshot) -> RoundPlan:
        return self.allocate_at(ordered_jobs, snapshot, 0.0)

    def allocate_at(
        self, ordered_jobs: Sequence[JobView], snapshot: ClusterSnapshot, now_s: float
    ) -> RoundPlan:
        plan = self.inner.allocate_at(ordered_jobs, snapshot, now_s)
        self.views.extend(ordered_jobs)
        self.plans.append(plan)
        return plan


def test_nodes_field_round_trips(tmp_path: Path) -> None:
    jobs = [
        TraceJob(0, "alexnet", 0.0, 100, 4, num_nodes=2),
        TraceJob(1, "alexnet", 5.0, 100, 2, deadline_s=900.0, num_nodes=1),
        TraceJob(2, "alexnet", 9.0, 100, 2),
    ]
    assert format_trace_line(jobs[0]) == "0,alexnet,0,100,4,nodes=2"
    assert format_trace_line(jobs[1]) == "1,alexnet,5,100,2,900,nodes=1"
    assert format_trace_line(jobs[2]) == "2,alexnet,9,100,2"
    path = tmp_path / "trace.csv"
    write_trace(path, jobs)
    assert read_trace(path) == jobs


@pytest.mark.parametrize(
    ("row", "message"),
    [
        ("2,alexnet,5,10,4,nodes=3", "gpus (4) must split evenly over nodes (3)"),
        ("2,alexnet,5,10,4,nodes=0", "nodes must be positive"),
        ("2,alexnet,5,10,4,nodes=two", "nodes 'two' is not a number"),
        ("2,alexnet,5,10,4,nodes=2,7", "expected 5 columns"),
    ],
)
def test_bad_nodes_field_names_file_and_line(tmp_path: Path, row: str, message: str) -> None:
    path = tmp_path / "trace.csv"
    path.write_text(row + "\n")
    with pytest.raises(TraceError) as excinfo:
        read_trace(path)
    assert str(excinfo.value).startswith(f"{path}:1: ")
    assert message in str(excinfo.value)


@pytest.mark.parametrize("allocator", ["proportional", "tune", "genie"])
def test_simulated_jobs_run_on_exactly_their_node_count(allocator: str) -> None:
    trace = [
        TraceJob(0, "alexnet", 0.0, 2000, 4, num_nodes=2),
        TraceJob(1, "alexnet", 0.0, 2000, 2),
        TraceJob(2, "alexnet", 0.0, 2000, 4, num_nodes=1),
        TraceJob(3, "alexnet", 0.0, 2000, 6, num_nodes=3),  # three servers of two: never
    ]
    recorder = RecordingAllocator(allocator)
    result = simulate(trace, ClusterSpec(servers=2, gpus_per_server=4), policy="fifo", allocator=recorder)
    assert result.finished_jobs == 3 and result.infeasible_jobs == 1
    assert {v.job_id: v.num_nodes for v in recorder.views} == {0: 2, 1: None, 2: 1, 3: 3}
    for plan in recorder.plans:
        placements = plan.placements()
        if 0 in placements:
            assert [len(s.gpu_indices) for s in placements[0].shares] == [2, 2]
        if 2 in placements:
            assert [len(s.gpu_indices) for s in placements[2].shares] == [4]


def test_forecast_keeps_a_live_jobs_node_count() -> None:
    """A live job turned into a simulated one (forecast) keeps its node count."""
    job = dataclasses.replace(make_job(1, "res18", gpus=4), num_nodes=2)
    recorder = RecordingAllocator("proportional")
    forecast(make_cluster(2, gpus=4), [job], policy="fifo", allocator=recorder, first_round_s=0.0)
    assert recorder.views and all(v.num_nodes == 2 for v in recorder.views)
    placement = recorder.plans[0].placements()[1]
    assert [len(s.gpu_indices) for s in placement.shares] == [2, 2]
