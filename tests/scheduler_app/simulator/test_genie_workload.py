"""GENIE in the simulator: deadlines reach the core, QoS metrics on hand-checked traces, the generator."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from profiles_app.catalog import load_catalog
from scheduler_app.core.throughput import REFERENCE_SHAPE
from scheduler_app.simulator import (
    ClusterSpec,
    TraceJob,
    genie_trace,
    read_trace,
    simulate,
    standalone_best_s,
    write_trace,
)
from scheduler_app.simulator.metrics import JobRecord, qos_stats
from tests.scheduler_app.simulator.fakes import FifoPolicy, StickyProportionalAllocator, toy_profile

CATALOG = {"toy": toy_profile()}
ONE_GPU = ClusterSpec(servers=1, gpus_per_server=1, cpus_per_server=3, mem_gb_per_server=50.0)
TWO_GPUS = ClusterSpec(servers=1, gpus_per_server=2, cpus_per_server=6, mem_gb_per_server=100.0)


def run(trace, cluster=ONE_GPU, policy=None):
    return simulate(
        trace,
        cluster,
        policy=policy or FifoPolicy(),
        allocator=StickyProportionalAllocator(),
        catalog=CATALOG,
        round_s=100.0,
        first_round_s=0.0,
    )


# One GPU, 1 s per iteration. Job 0: 100 iterations, no deadline; job 1: 50 iterations, due at 60.
#   FIFO: job 0 runs 0-100, job 1 runs 100-150: late by 90 s.
#   EDF:  job 1 runs 0-50 (met), the GPU idles until the next round, job 0 runs 100-200.
URGENT = [TraceJob(0, "toy", 0.0, 100, 1), TraceJob(1, "toy", 0.0, 50, 1, deadline_s=60.0)]


def test_fifo_misses_the_deadline():
    data = run(URGENT).to_dict()
    assert data["qos_jobs"] == 1
    assert data["qos_pct"] == 0.0
    assert data["tardiness_h"] == pytest.approx(90.0 / 3600.0)


@pytest.mark.parametrize("policy", ["edf", "swaf"])
def test_deadline_reaches_the_policy(policy):
    result = run(URGENT, policy=policy)
    finish = {r.job_id: r.finish_s for r in result.records}
    assert finish == {0: 200.0, 1: 50.0}
    data = result.to_dict()
    assert (data["qos_jobs"], data["qos_pct"], data["tardiness_h"]) == (1, 100.0, 0.0)
    assert result.records[1].deadline_s == 60.0 and result.records[0].deadline_s is None


# Two GPUs, FIFO (see test_simulation THREE_JOBS): finishes A 150, B 250, C 320.
# Deadlines: A 200 (met), B 240 (10 s late), C 300 (20 s late); D has none and finishes at 400 + 10.
def test_three_qos_jobs_hand_checked():
    trace = [
        TraceJob(0, "toy", 0.0, 150, 1, deadline_s=200.0),
        TraceJob(1, "toy", 0.0, 250, 1, deadline_s=240.0),
        TraceJob(2, "toy", 10.0, 120, 1, deadline_s=300.0),
    ]
    data = run(trace, TWO_GPUS).to_dict()
    assert {r["job_id"]: r["finish_s"] for r in data["records"]} == {0: 150.0, 1: 250.0, 2: 320.0}
    assert data["qos_jobs"] == 3
    assert data["qos_pct"] == pytest.approx(100.0 / 3)
    assert data["tardiness_h"] == pytest.approx((0 + 10 + 20) / 3 / 3600)
    json.dumps(data)


def test_no_qos_jobs_gives_none():
    data = run([TraceJob(0, "toy", 0.0, 10, 1)]).to_dict()
    assert (data["qos_jobs"], data["qos_pct"], data["tardiness_h"]) == (0, None, None)


def test_unfinished_qos_job_counts_as_missed():
    def rec(job_id, finish_s, deadline_s):
        return JobRecord(job_id, "toy", 1, 0.0, 0.0, finish_s, finish_s, 0, deadline_s=deadline_s)

    stats = qos_stats([rec(0, 50.0, 60.0), rec(1, None, 60.0), rec(2, 7200.0, 3600.0), rec(3, 5.0, None)])
    assert (stats.jobs, stats.met, stats.unfinished) == (3, 1, 1)
    assert stats.met_pct == pytest.approx(100.0 / 3)
    assert stats.tardiness_h == pytest.approx(0.5)  # (0 + 1 h) / 2 finished QoS jobs


def test_deadline_column_round_trips(tmp_path: Path):
    path = tmp_path / "qos.csv"
    trace = [TraceJob(0, "alexnet", 5.0, 10, 1, deadline_s=100.5), TraceJob(1, "res18", 6.0, 20, 2)]
    write_trace(path, trace)
    assert path.read_text() == "0,alexnet,5,10,1,100.5\n1,res18,6,20,2\n"
    assert read_trace(path) == trace


def test_standalone_best_hand_checked():
    res18 = load_catalog()["res18"]
    # 1500 iterations x 0.64 s / best-case speed-up 2.4 = 400 s
    assert standalone_best_s(res18, 1500, 1, REFERENCE_SHAPE) == pytest.approx(400.0)


def test_genie_trace_properties():
    catalog = load_catalog()
    jobs = genie_trace(400, jobs_per_hour=10.0, seed=7)
    assert jobs == genie_trace(400, jobs_per_hour=10.0, seed=7)
    assert [j.job_id for j in jobs] == list(range(400))
    arrivals = [j.arrival_s for j in jobs]
    assert arrivals == sorted(arrivals)
    factors = [
        (j.deadline_s - j.arrival_s) / standalone_best_s(catalog[j.model], j.total_iters, j.num_gpus)
        for j in jobs
    ]
    assert all(1.05 - 1e-9 <= f <= 4.0 + 1e-9 for f in factors)
    urgent = [f for f in factors if f < 1.2]
    assert urgent, "some urgent bursts"
    assert sum(f > 1.3 for f in factors) > 300  # most jobs are regular
    image = sum(catalog[j.model].workload_class == "image" for j in jobs)
    assert image / len(jobs) > 0.7  # CNN-heavy
    assert {j.num_gpus for j in jobs} <= {1, 2, 4, 8}
    # mean gap ~ 360 s at 10 jobs/hour (bursts shorten it)
    mean_gap = (arrivals[-1] - arrivals[0]) / (len(arrivals) - 1)
    assert 250 < mean_gap < 450
    assert all(math.isfinite(j.deadline_s) for j in jobs)


@pytest.mark.parametrize("policy", ["swaf", "edf", "sjf", "fifo"])
def test_combined_mode_runs_in_the_simulator(policy):
    """SWAF (and the GENIE baselines) with Synergy's tune allocator on a GENIE workload."""
    trace = genie_trace(40, jobs_per_hour=20.0, seed=3)
    result = simulate(trace, ClusterSpec(servers=2), policy=policy, allocator="tune")
    data = result.summary()
    assert data["finished_jobs"] == 40
    assert data["qos_jobs"] == 40
    assert 0.0 <= data["qos_pct"] <= 100.0
    assert data["tardiness_h"] >= 0.0
