"""Rounds whose inputs repeat reuse the last plan: exactly the figures of deciding every round."""

from __future__ import annotations

import pytest

from scheduler_app.core.allocators import ALLOCATORS
from scheduler_app.core.allocators.tune import TuneAllocator
from scheduler_app.simulator import ClusterSpec, philly_derived_trace, simulate
from scheduler_app.simulator import simulation as simulation_module

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


def test_progress_ordered_policies_decide_every_round(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = {"n": 0}
    real = simulation_module.schedule_round

    def counting(*args, **kwargs):
        calls["n"] += 1
        return real(*args, **kwargs)

    monkeypatch.setattr(simulation_module, "schedule_round", counting)
    result = _figures(policy="srtf", allocator="tune")
    assert calls["n"] == result["rounds"]


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
