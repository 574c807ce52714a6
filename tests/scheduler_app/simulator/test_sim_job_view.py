"""SimJob.job_view builds, field for field, the JobView the dataclass's constructor builds."""

from __future__ import annotations

import dataclasses

import pytest

from profiles_app.catalog import load_catalog
from scheduler_app.core.types import JobView, Placement, ServerShare
from scheduler_app.simulator.sim_job import SimJob
from scheduler_app.simulator.trace import TraceJob


def _fields(view: JobView) -> list:
    return [getattr(view, f.name) for f in dataclasses.fields(JobView)]


def test_job_view_is_the_constructors_view() -> None:
    catalog = load_catalog()
    model = sorted(catalog)[0]
    job = SimJob(
        TraceJob(job_id=7, arrival_s=12.0, model=model, num_gpus=2, total_iters=1000.0), catalog[model]
    )
    job.done_iters = 250.5
    job.attained_gpu_s = 600.0
    job.deadline_s = 9000.0
    job.priority = 3
    job.team_id = 4
    job.cpus_per_gpu_override = 5.0
    job.current = Placement(7, (ServerShare(1, (0, 1), 6, 100.0),), 1.25)
    job.lease_started_s = 300.0
    job.set_costs(30.0, 600.0, charges_work=True, first_start_waits=False)
    view = job.job_view(owner_usage_gpu_s=42.0)
    expected = JobView(**{f.name: getattr(view, f.name) for f in dataclasses.fields(JobView)})
    assert view == expected and _fields(view) == _fields(expected)
    assert type(view) is JobView and hash(view) == hash(expected)
    assert view.done_iters == 250.5 and view.owner_usage_gpu_s == 42.0 and view.lease_started_s == 300.0
    assert view.attained_service_gpu_s == 600.0 and view.current is job.current
    with pytest.raises(dataclasses.FrozenInstanceError):
        view.done_iters = 1.0  # type: ignore[misc]
