"""Rounds whose inputs repeat reuse the last plan: exactly the figures of deciding every round."""

from __future__ import annotations

import pytest

from scheduler_app.core.allocators import ALLOCATORS
from scheduler_app.core.allocators.genie import GenieAllocator
from scheduler_app.core.allocators.proportional import ProportionalAllocator
from scheduler_app.core.allocators.tune import TuneAllocator
from scheduler_app.core.policies.aging import Aging
from scheduler_app.core.policies.sjf import SjfPolicy
from scheduler_app.core.policies.swaf import SwafPolicy
from scheduler_app.core.restarts import RestartPolicy
from scheduler_app.simulator import ClusterSpec, philly_derived_trace, simulate
from scheduler_app.simulator import simulation as simulation_module
from scheduler_app.simulator.restart_costs import RestartCosts
from scheduler_app.simulator.workloads import genie_trace

CLUSTER = ClusterSpec(servers=4, gpus_per_server=8, cpus_per_server=24, mem_gb_per_server=500.0)


class DecideEveryRound(TuneAllocator):
    """tune, declared progress-reading: the simulator then decides every round afresh."""

    reads_progress = True


def _figures(**kwargs) -> dict:
    data = simulate(
        philly_derived_trace(150, jobs_per_hour=12.0, multi_gpu=True, seed=7), CLUSTER, **kwargs
    ).to_dict(include_records=True, include_series=True)
    data.pop("wall_s")
    data.pop("allocator")
    return data


@pytest.mark.parametrize("round_end", [False, True])
def test_reused_plans_give_the_same_figures(monkeypatch: pytest.MonkeyPatch, round_end: bool) -> None:
    calls = {"n": 0}
    real = simulation_module.schedule_round

    def counting(*args, **kwargs):
        calls["n"] += 1
        return real(*args, **kwargs)

    monkeypatch.setattr(simulation_module, "schedule_round", counting)
    every = _figures(policy="fifo", allocator=DecideEveryRound(), finish_at_round_end=round_end)
    decided_every = calls["n"]
    calls["n"] = 0
    reused = _figures(policy="fifo", allocator=TuneAllocator(), finish_at_round_end=round_end)
    assert decided_every == every["rounds"]
    assert calls["n"] < decided_every / 2  # most rounds repeat the last plan
    assert reused == every


class ProportionalDecidingEveryRound(ProportionalAllocator):
    """proportional, declared progress-reading: the simulator then decides every round afresh."""

    reads_progress = True


class GenieDecidingEveryRound(GenieAllocator):
    """genie without its keyed allocations: every round and allocation decided afresh."""

    allocate_keyed = None  # type: ignore[assignment]


@pytest.mark.parametrize(
    ("policy", "allocator", "every", "extra"),
    [
        ("srtf", TuneAllocator, DecideEveryRound, {}),
        # Stable plans (which started jobs) reused while the order holds.
        ("las", ProportionalAllocator, ProportionalDecidingEveryRound, {"finish_at_round_end": True}),
        # Shortest first with aging (a low threshold: jobs age within the trace), genie, with and without
        # the move guard and restart costs.
        (SjfPolicy(aging=Aging(factor=1.0, floor_s=0.0)), TuneAllocator, DecideEveryRound, {}),
        (SwafPolicy(aging=Aging(factor=1.0, floor_s=0.0)), GenieAllocator, GenieDecidingEveryRound, {}),
        (
            SwafPolicy(aging=Aging(factor=1.0, floor_s=0.0)),
            GenieAllocator,
            GenieDecidingEveryRound,
            {
                "restarts": RestartPolicy(),
                "restart_costs": RestartCosts(startup_s=120.0, checkpoint_every_s=600.0),
            },
        ),
        (SwafPolicy(), GenieAllocator, GenieDecidingEveryRound, {"mode": "events"}),
    ],
    ids=[
        "srtf+tune",
        "las+proportional",
        "sjf-aging+tune",
        "swaf-aging+genie",
        "swaf-aging+genie+guard",
        "swaf+genie-events",
    ],
)
def test_progress_ordered_policies_reuse_rounds_exactly(
    monkeypatch: pytest.MonkeyPatch, policy, allocator, every, extra
) -> None:
    """Under orders by progress and the clock, rounds are reused only where deciding them gives the same
    plan (simulator/reuse.py): every figure is the one of deciding every round."""
    calls = {"n": 0}
    real = simulation_module.schedule_round

    def counting(*args, **kwargs):
        calls["n"] += 1
        return real(*args, **kwargs)

    monkeypatch.setattr(simulation_module, "schedule_round", counting)
    decided = _figures(policy=policy, allocator=every(), **extra)
    assert calls["n"] == decided["rounds"]
    calls["n"] = 0
    reused = _figures(policy=policy, allocator=allocator(), **extra)
    assert calls["n"] < decided["rounds"] * 0.8  # rounds were reused
    assert reused == decided


def test_genie_trace_with_deadlines_reuses_rounds_exactly(monkeypatch: pytest.MonkeyPatch) -> None:
    """GENIE's workload (every job has a QoS target): genie's keyed allocations (a deadline job's need
    only through which of its points meet it) give the figures of deciding every round."""
    trace = genie_trace(60, seed=3)
    decided = simulate(trace, CLUSTER, policy="swaf", allocator=GenieDecidingEveryRound()).to_dict(
        include_records=True, include_series=True
    )
    reused = simulate(trace, CLUSTER, policy="swaf", allocator=GenieAllocator()).to_dict(
        include_records=True, include_series=True
    )
    for data in (decided, reused):
        data.pop("wall_s")
        data.pop("allocator")
    assert reused == decided


@pytest.mark.parametrize("allocator", ["tune", "proportional"])
def test_arrivals_queued_behind_a_full_cluster_keep_the_plan(
    monkeypatch: pytest.MonkeyPatch, allocator: str
) -> None:
    """A steady plan takes arrivals that GPU admission leaves out as pending (waits_unadmitted):
    fewer rounds decided, the same figures as deciding those rounds."""
    calls = {"n": 0}
    real = simulation_module.schedule_round

    def counting(*args, **kwargs):
        calls["n"] += 1
        return real(*args, **kwargs)

    monkeypatch.setattr(simulation_module, "schedule_round", counting)
    extended = _figures(policy="fifo", allocator=allocator)
    decided_extended = calls["n"]
    calls["n"] = 0
    cls = type(ALLOCATORS.get(allocator)())
    monkeypatch.setattr(cls, "waits_unadmitted", False)
    decided = _figures(policy="fifo", allocator=allocator)
    assert calls["n"] - decided_extended >= 20  # the cluster is full for much of the trace
    assert extended == decided
