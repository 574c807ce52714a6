"""Tune's stable plans repeat, and its cheap hold of the running jobs gives the plan of the full walk."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import pytest

from scheduler_app.core.allocators.base import Allocator
from scheduler_app.core.allocators.proportional import ProportionalAllocator
from scheduler_app.core.allocators.tune import TuneAllocator, TuneRound
from scheduler_app.core.allocators.tune_matrix import TuneMatrixAllocator
from scheduler_app.core.restarts import RestartPolicy
from scheduler_app.core.types import ClusterSnapshot, JobView, RoundPlan
from scheduler_app.simulator import ClusterSpec, philly_derived_trace, simulate

CLUSTER = ClusterSpec(servers=4, gpus_per_server=8, cpus_per_server=24, mem_gb_per_server=500.0)


def _full_walk(
    base: type[TuneAllocator], allocator: TuneAllocator, jobs: Sequence[JobView], snapshot: ClusterSnapshot
) -> RoundPlan:
    """`base`'s plan with `hold_current` off: every job claimed and walked one by one."""
    real = TuneRound.hold_current
    TuneRound.hold_current = lambda self, order: 0  # type: ignore[method-assign]
    try:
        return base.allocate(allocator, jobs, snapshot)
    finally:
        TuneRound.hold_current = real  # type: ignore[method-assign]


def _checking(base: type[TuneAllocator]) -> TuneAllocator:
    class Checking(base):  # type: ignore[valid-type, misc]
        """Checks, at every allocation of a simulation, the two claims the simulator relies on."""

        stable = 0
        removals = 0

        def allocate(self, ordered_jobs: Sequence[JobView], snapshot: ClusterSnapshot) -> RoundPlan:
            plan = super().allocate(ordered_jobs, snapshot)
            assert plan == _full_walk(base, self, ordered_jobs, snapshot)
            if plan.stable:
                type(self).stable += 1
                where = plan.placements()
                again = [dataclasses.replace(j, current=where.get(j.job_id)) for j in ordered_jobs]
                assert super().allocate(again, snapshot) == plan
                if all(d.placement is not None for d in plan.decisions) and len(again) > 1:
                    type(self).removals += 1
                    some = again[::2]
                    kept = {j.job_id for j in some}
                    left = super().allocate(some, snapshot)
                    assert left.decisions == tuple(d for d in plan.decisions if d.job_id in kept)
            return plan

    return Checking()


@pytest.mark.parametrize("base", [TuneAllocator, TuneMatrixAllocator])
@pytest.mark.parametrize("multi_gpu", [False, True])
def test_stable_plans_repeat_and_holding_the_running_jobs_changes_nothing(
    base: type[TuneAllocator], multi_gpu: bool
) -> None:
    allocator = _checking(base)
    simulate(
        philly_derived_trace(120, jobs_per_hour=10.0, multi_gpu=multi_gpu, seed=11),
        CLUSTER,
        policy="fifo",
        allocator=allocator,
        finish_at_round_end=True,
    )
    assert type(allocator).stable > 0 and type(allocator).removals > 0


def test_stable_plans_spare_rounds() -> None:
    """On the reference trace's kind of load most rounds end as a stable plan: few are decided."""
    calls = {"n": 0}

    class Counting(TuneAllocator):
        def allocate(self, ordered_jobs: Sequence[JobView], snapshot: ClusterSnapshot) -> RoundPlan:
            calls["n"] += 1
            return super().allocate(ordered_jobs, snapshot)

    result = simulate(
        philly_derived_trace(200, jobs_per_hour=9.0, seed=3),
        ClusterSpec(servers=16, gpus_per_server=8, cpus_per_server=24, mem_gb_per_server=500.0),
        policy="fifo",
        allocator=Counting(),
        finish_at_round_end=True,
    )
    assert calls["n"] < result.rounds / 3


@pytest.mark.parametrize("base", [TuneAllocator, TuneMatrixAllocator])
@pytest.mark.parametrize("multi_gpu", [False, True])
def test_holding_the_running_jobs_under_the_move_guard_changes_nothing(
    base: type[TuneAllocator], multi_gpu: bool
) -> None:
    """Under the move guard every job has a node count (one server) and is seen holding its
    proportional floor: the cheap hold keeps it home beside the others' claims, or at its fallback
    on what is free there, exactly as the full walk does."""
    held = {"rounds": 0}
    real = TuneRound.hold_current

    def counting(self: TuneRound, order: list[int]) -> int:
        count = real(self, order)
        held["rounds"] += bool(count)
        return count

    class Checking(base):  # type: ignore[valid-type, misc]
        def allocate(self, ordered_jobs: Sequence[JobView], snapshot: ClusterSnapshot) -> RoundPlan:
            plan = super().allocate(ordered_jobs, snapshot)
            full = _full_walk(base, self, ordered_jobs, snapshot)
            assert plan == full and plan.stable == full.stable
            return plan

    TuneRound.hold_current = counting  # type: ignore[method-assign]
    try:
        simulate(
            philly_derived_trace(120, jobs_per_hour=10.0, multi_gpu=multi_gpu, seed=11),
            CLUSTER,
            policy="fifo",
            allocator=Checking(),
            finish_at_round_end=True,
            restarts=RestartPolicy(),
        )
    finally:
        TuneRound.hold_current = real  # type: ignore[method-assign]
    assert held["rounds"] > 0


@pytest.mark.parametrize("base", [TuneAllocator, TuneMatrixAllocator])
@pytest.mark.parametrize("multi_gpu", [False, True])
def test_throughput_bound_holds_every_plan_of_the_round(base: type[TuneAllocator], multi_gpu: bool) -> None:
    """`TuneRound.throughput_bound` is at least the throughput of each of the round's three plans
    (sticky, fresh, loose), at every allocation of simulations under the move guard, and it lets
    some rounds skip the fresh plan."""
    seen = {"bounds": 0, "tight": 0}

    class Checking(base):  # type: ignore[valid-type, misc]
        def allocate(self, ordered_jobs: Sequence[JobView], snapshot: ClusterSnapshot) -> RoundPlan:
            plan = super().allocate(ordered_jobs, snapshot)
            kwargs = {"order": self.order}
            first = self.round_class(ordered_jobs, snapshot, self.placement, **kwargs)
            sticky = first.run()
            bound = first.throughput_bound()
            if bound is None:
                return plan
            seen["bounds"] += 1
            fresh = self.round_class(
                ordered_jobs, snapshot, self.placement, sticky=False, like=first, **kwargs
            )
            loose = self.round_class(
                ordered_jobs, snapshot, self.placement, keep_homes=False, like=first, **kwargs
            )
            for other in (sticky, fresh.run(), loose.run()):
                assert other.throughput() <= bound * (1.0 + 1e-9)
            if bound < first.best_case_throughput() * (1.0 - 1e-6):
                seen["tight"] += 1
            return plan

    simulate(
        philly_derived_trace(150, jobs_per_hour=30.0, multi_gpu=multi_gpu, seed=5),
        CLUSTER,
        policy="fifo",
        allocator=Checking(),
        finish_at_round_end=True,
        restarts=RestartPolicy(),
    )
    assert seen["bounds"] > 0 and seen["tight"] > 0


@pytest.mark.parametrize("base", [TuneAllocator, TuneMatrixAllocator, ProportionalAllocator])
@pytest.mark.parametrize("multi_gpu", [False, True])
@pytest.mark.parametrize("round_end", [False, True])
def test_plans_extended_with_arrivals_are_the_decided_ones(
    base: type[Allocator], multi_gpu: bool, round_end: bool
) -> None:
    """Where the simulator extends a stable plan with arrivals (Allocator.extend) instead of deciding
    the round, the plan is the one deciding it gives, stable flag included; and the simulation's
    figures are those of deciding every such round."""
    seen = {"extended": 0}

    class Checking(base):  # type: ignore[valid-type, misc]
        def extend(
            self, previous: RoundPlan, ordered_jobs: Sequence[JobView], snapshot: ClusterSnapshot
        ) -> RoundPlan | None:
            plan = base.extend(self, previous, ordered_jobs, snapshot)
            if plan is not None:
                seen["extended"] += 1
                full = base.allocate(self, ordered_jobs, snapshot)
                assert plan == full and plan.stable == full.stable
            return plan

    class Deciding(base):  # type: ignore[valid-type, misc]
        def extend(self, *args: object) -> None:
            return None

    def figures(allocator: Allocator) -> dict:
        data = simulate(
            philly_derived_trace(150, jobs_per_hour=6.0, multi_gpu=multi_gpu, seed=11),
            CLUSTER,
            policy="fifo",
            allocator=allocator,
            finish_at_round_end=round_end,
        ).to_dict(include_records=True, include_series=True)
        data.pop("wall_s")
        return data

    assert figures(Checking()) == figures(Deciding())
    assert seen["extended"] > 0
