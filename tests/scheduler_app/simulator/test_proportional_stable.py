"""Proportional's stable plans repeat, and its cheap hold of the running jobs gives the claims' plan."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import pytest

from scheduler_app.core.allocators import proportional
from scheduler_app.core.allocators.proportional import ProportionalAllocator
from scheduler_app.core.types import ClusterSnapshot, JobView, RoundPlan
from scheduler_app.simulator import ClusterSpec, philly_derived_trace, simulate

CLUSTER = ClusterSpec(servers=4, gpus_per_server=8, cpus_per_server=24, mem_gb_per_server=500.0)
# Shares that are not whole numbers: 20 / 6 cores and 500 / 6 GB a GPU.
ODD = ClusterSpec(servers=4, gpus_per_server=6, cpus_per_server=20, mem_gb_per_server=500.0)


def _with_claims(
    allocator: ProportionalAllocator, jobs: Sequence[JobView], snapshot: ClusterSnapshot
) -> RoundPlan:
    """The plan with `hold_current` off: every running job claimed and sent home one by one."""
    real = proportional.hold_current
    proportional.hold_current = lambda round_: 0  # type: ignore[assignment]
    try:
        return ProportionalAllocator.allocate(allocator, jobs, snapshot)
    finally:
        proportional.hold_current = real  # type: ignore[assignment]


class Checking(ProportionalAllocator):
    """Checks, at every allocation of a simulation, the two claims the simulator relies on."""

    def __init__(self, placement: str) -> None:
        super().__init__(placement)
        self.held = self.stable = self.removals = 0

    def allocate(self, ordered_jobs: Sequence[JobView], snapshot: ClusterSnapshot) -> RoundPlan:
        plan = super().allocate(ordered_jobs, snapshot)
        full = _with_claims(self, ordered_jobs, snapshot)
        assert plan == full and plan.stable == full.stable
        if ordered_jobs and ordered_jobs[0].current is not None:
            self.held += 1
        if plan.stable:
            self.stable += 1
            where = plan.placements()
            again = [dataclasses.replace(j, current=where.get(j.job_id)) for j in ordered_jobs]
            repeat = super().allocate(again, snapshot)
            assert repeat == plan and repeat.stable
            assert all(
                a.placement is b.placement
                for a, b in zip(repeat.decisions, plan.decisions, strict=True)
                if a.placement is not None
            )  # the very Placement objects: the simulator's leases continue
            assert _with_claims(self, again, snapshot) == plan
            if all(d.placement is not None for d in plan.decisions) and len(again) > 1:
                self.removals += 1
                some = again[::2]
                kept = {j.job_id for j in some}
                left = super().allocate(some, snapshot)
                assert left.decisions == tuple(d for d in plan.decisions if d.job_id in kept)
        return plan


@pytest.mark.parametrize("cluster", [CLUSTER, ODD])
@pytest.mark.parametrize("placement", ["first_fit", "packed"])
@pytest.mark.parametrize("multi_gpu", [False, True])
def test_stable_plans_repeat_and_holding_the_running_jobs_changes_nothing(
    cluster: ClusterSpec, placement: str, multi_gpu: bool
) -> None:
    allocator = Checking(placement)
    simulate(
        philly_derived_trace(120, jobs_per_hour=10.0, multi_gpu=multi_gpu, seed=11),
        cluster,
        policy="fifo",
        allocator=allocator,
        finish_at_round_end=True,
    )
    assert allocator.stable > 0 and allocator.removals > 0 and allocator.held > 0


def test_stable_plans_give_the_same_simulation() -> None:
    """A simulation under proportional is the same with its plans declared unstable (decided again)."""

    class Unstable(ProportionalAllocator):
        def allocate(self, ordered_jobs: Sequence[JobView], snapshot: ClusterSnapshot) -> RoundPlan:
            return dataclasses.replace(super().allocate(ordered_jobs, snapshot), stable=False)

    trace = philly_derived_trace(150, jobs_per_hour=12.0, multi_gpu=True, seed=4)
    for round_end in (False, True):
        a = simulate(trace, CLUSTER, policy="fifo", allocator="proportional", finish_at_round_end=round_end)
        b = simulate(trace, CLUSTER, policy="fifo", allocator=Unstable(), finish_at_round_end=round_end)
        da, db = a.to_dict(), b.to_dict()
        da.pop("wall_s"), db.pop("wall_s")
        da.pop("allocator"), db.pop("allocator")
        assert da == db
