"""A stable proportional plan reused with its decisions in the new order (permuted.py) is the round's plan."""

from __future__ import annotations

import dataclasses

import pytest

from scheduler_app.core.engine import schedule_round
from scheduler_app.simulator import ClusterSpec, philly_derived_trace, simulate
from scheduler_app.simulator import simulation as simulation_module
from scheduler_app.simulator.permuted import _exact_shares

CLUSTER = ClusterSpec(servers=4, gpus_per_server=8, cpus_per_server=24, mem_gb_per_server=500.0)
# Shares that are not whole numbers: 20 / 6 cores and 500 / 6 GB a GPU (off the grid: never permuted).
ODD = ClusterSpec(servers=4, gpus_per_server=6, cpus_per_server=20, mem_gb_per_server=500.0)


def _run(
    monkeypatch: pytest.MonkeyPatch,
    cluster: ClusterSpec,
    policy: str,
    *,
    check: bool,
    on: bool,
    allocator: str = "proportional",
    **kw,
):
    """simulate() with permuted_plan checked against schedule_round at every use (check), or off."""
    real = simulation_module.permuted_plan
    used = [0]

    def spy(plan, progress, jobs, policy_obj, allocator, snapshot, now_s, restarts):
        if not on:
            return None
        out = real(plan, progress, jobs, policy_obj, allocator, snapshot, now_s, restarts)
        if out is not None and check:
            used[0] += 1
            ref = schedule_round(
                snapshot, jobs, policy=policy_obj, allocator=allocator.inner, now_s=now_s, restarts=restarts
            )
            assert ref == out and ref.stable == out.stable
            assert all(a.placement is b.placement for a, b in zip(ref.decisions, out.decisions, strict=True))
        return out

    monkeypatch.setattr(simulation_module, "permuted_plan", spy)
    result = simulate(kw.pop("trace"), cluster, policy=policy, allocator=allocator, **kw)
    monkeypatch.setattr(simulation_module, "permuted_plan", real)
    return result, used[0]


@pytest.mark.parametrize("allocator", ["proportional", "tune"])
@pytest.mark.parametrize(
    ("policy", "multi_gpu", "round_end"),
    [
        ("las", True, False),
        ("las", True, True),
        ("srtf", True, True),
        ("sjf", True, False),
        ("srtf", False, True),
        ("las", False, False),
    ],
)
def test_permuted_plans_are_the_rounds_plans(
    monkeypatch: pytest.MonkeyPatch, allocator: str, policy: str, multi_gpu: bool, round_end: bool
) -> None:
    """Every permuted plan equals schedule_round's (the very Placements), and the simulation's every
    figure is the one without the rule."""
    trace = philly_derived_trace(120, jobs_per_hour=4.0 if multi_gpu else 9.0, multi_gpu=multi_gpu, seed=3)
    kw = {"trace": trace, "finish_at_round_end": round_end, "allocator": allocator}
    checked, used = _run(monkeypatch, CLUSTER, policy, check=True, on=True, **kw)
    off, _ = _run(monkeypatch, CLUSTER, policy, check=False, on=False, **dict(kw, trace=trace))
    if policy == "las" and multi_gpu:  # running jobs of 1 to 8 GPUs pass one another
        assert used > 0
    assert dataclasses.replace(checked, wall_s=0.0) == dataclasses.replace(off, wall_s=0.0)


def test_off_the_grid_shares_are_never_permuted(monkeypatch: pytest.MonkeyPatch) -> None:
    assert _exact_shares(CLUSTER.snapshot())
    assert not _exact_shares(ODD.snapshot())
    trace = philly_derived_trace(100, jobs_per_hour=12.0, seed=5)
    _, used = _run(monkeypatch, ODD, "srtf", check=True, on=True, trace=trace, finish_at_round_end=True)
    assert used == 0
