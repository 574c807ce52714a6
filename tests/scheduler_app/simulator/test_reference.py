"""Agreement with the reference simulator's conventions on its own traces (docs/reference-synergy.md).

For single-GPU jobs under FIFO at the GPU-proportional share nothing is ever preempted, so the
reference's result can be worked out independently: list scheduling on the GPUs, each job taking
ceil(total_iters / floor(round_s / iter_time_s)) whole rounds and finishing at the end of its last one.
"""

from __future__ import annotations

import heapq
import math

import pytest

from profiles_app.catalog import load_catalog
from scheduler_app.core.allocators import ALLOCATORS
from scheduler_app.core.policies import POLICIES
from scheduler_app.simulator import ClusterSpec, TraceJob, read_trace, simulate
from tests.reference_data import SYNERGY_TRACES
from tests.scheduler_app.simulator.fakes import FifoPolicy, StickyProportionalAllocator

CATALOG = load_catalog()
PHYSICAL = ClusterSpec(servers=4, gpus_per_server=8, cpus_per_server=24, mem_gb_per_server=500.0)
ROUND_S = 300.0


def reference_fifo_fair_finish_s(trace: list[TraceJob], gpus: int, first_round_s: float) -> dict[int, float]:
    """Finish times under the reference's conventions (single-GPU jobs, all arrived by the first round)."""
    free_at_round = [0] * gpus  # round index at which each GPU frees up
    heapq.heapify(free_at_round)
    finish: dict[int, float] = {}
    for job in sorted(trace, key=lambda j: (j.arrival_s, j.job_id)):
        iter_time_s = CATALOG[job.model].iter_time_s
        rounds = math.ceil(job.total_iters / math.floor(ROUND_S / iter_time_s))
        start = heapq.heappop(free_at_round)
        heapq.heappush(free_at_round, start + rounds)
        finish[job.job_id] = first_round_s + (start + rounds) * ROUND_S
    return finish


def exact_fifo_fair_finish_s(trace: list[TraceJob], gpus: int, first_round_s: float) -> dict[int, float]:
    """Same, but a job ends at its exact time and its GPU is reused from the next round on."""
    free_at = [first_round_s] * gpus
    heapq.heapify(free_at)
    finish: dict[int, float] = {}
    for job in sorted(trace, key=lambda j: (j.arrival_s, j.job_id)):
        start = heapq.heappop(free_at)
        start = first_round_s + math.ceil((start - first_round_s) / ROUND_S - 1e-9) * ROUND_S
        end = start + job.total_iters * CATALOG[job.model].iter_time_s
        finish[job.job_id] = end
        heapq.heappush(free_at, end)
    return finish


def allocators_to_check() -> list[tuple[object, object]]:
    """The local stand-ins always; the registered fifo + proportional once they exist."""
    pairs: list[tuple[object, object]] = [(FifoPolicy(), StickyProportionalAllocator())]
    if "fifo" in POLICIES.names() and "proportional" in ALLOCATORS.names():
        pairs.append(("fifo", "proportional"))
    return pairs


def round_end_cases() -> list[tuple[str, object, object]]:
    pairs = allocators_to_check()
    return [("static_100job.csv", *pair) for pair in pairs] + [("philly1gpu_static_n500_s42.csv", *pairs[-1])]


@pytest.mark.parametrize(("trace_name", "policy", "allocator"), round_end_cases())
def test_static_fifo_proportional_round_end_matches_reference(trace_name, policy, allocator) -> None:
    trace = read_trace(SYNERGY_TRACES / trace_name)
    cluster = PHYSICAL if trace_name.startswith("static_100") else ClusterSpec()
    result = simulate(trace, cluster, policy=policy, allocator=allocator, finish_at_round_end=True)
    expected = reference_fifo_fair_finish_s(trace, cluster.total_gpus, first_round_s=1.0)
    assert {r.job_id: r.finish_s for r in result.records} == pytest.approx(expected)
    assert result.makespan_s == pytest.approx(max(expected.values()))


@pytest.mark.parametrize(("policy", "allocator"), allocators_to_check())
def test_static_fifo_proportional_exact(policy, allocator) -> None:
    trace = read_trace(SYNERGY_TRACES / "static_100job.csv")
    result = simulate(trace, PHYSICAL, policy=policy, allocator=allocator)
    expected = exact_fifo_fair_finish_s(trace, PHYSICAL.total_gpus, first_round_s=1.0)
    assert {r.job_id: r.finish_s for r in result.records} == pytest.approx(expected)


@pytest.mark.parametrize("finish_at_round_end", [False, True])
def test_static_trace_tune_makespan_at_least_1_35x_shorter_than_proportional(finish_at_round_end) -> None:
    # Issue 3's acceptance (the paper reports 1.4x on its testbed); FIFO, 300 s rounds, 4 x 8 GPUs.
    trace = read_trace(SYNERGY_TRACES / "static_100job.csv")
    makespan_h = {
        name: simulate(
            trace, PHYSICAL, policy="fifo", allocator=name, finish_at_round_end=finish_at_round_end
        ).makespan_h
        for name in ("proportional", "tune")
    }
    assert makespan_h["proportional"] / makespan_h["tune"] >= 1.35
