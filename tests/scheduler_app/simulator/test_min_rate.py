"""The minimum-rate QoS kind in the simulator: trace column, generator share, its guarantee rate apart."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from profiles_app.catalog import load_catalog
from scheduler_app.simulator import (
    ClusterSpec,
    TraceError,
    TraceJob,
    format_trace_line,
    genie_trace,
    parse_trace,
    read_trace,
    simulate,
    standalone_best_s,
    write_trace,
)
from scheduler_app.simulator.metrics import JobRecord, min_rate_stats
from tests.scheduler_app.simulator.fakes import FifoPolicy, StickyProportionalAllocator, toy_profile

CATALOG = {"toy": toy_profile()}  # 1 s per iteration at the proportional share: 1 iteration/s
ONE_GPU = ClusterSpec(servers=1, gpus_per_server=1, cpus_per_server=3, mem_gb_per_server=50.0)


def run(trace, policy=None, cluster=ONE_GPU):
    return simulate(
        trace,
        cluster,
        policy=policy or FifoPolicy(),
        allocator=StickyProportionalAllocator(),
        catalog=CATALOG,
        round_s=100.0,
        first_round_s=0.0,
    )


def test_min_rate_column_round_trips(tmp_path: Path):
    path = tmp_path / "rate.csv"
    trace = [
        TraceJob(0, "alexnet", 5.0, 10, 1, min_rate_iters_per_s=2.5),
        TraceJob(1, "res18", 6.0, 20, 2, deadline_s=100.5),
        TraceJob(2, "res18", 7.0, 20, 2, min_rate_iters_per_s=3.0, num_nodes=2),
        TraceJob(3, "res18", 8.0, 20, 1),
    ]
    write_trace(path, trace)
    assert path.read_text() == (
        "0,alexnet,5,10,1,min_rate=2.5\n1,res18,6,20,2,100.5\n2,res18,7,20,2,min_rate=3,nodes=2\n3,res18,8,20,1\n"
    )
    assert read_trace(path) == trace


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("0,res18,0,10,1,min_rate=0", "positive"),
        ("0,res18,0,10,1,min_rate=-2", "positive"),
        ("0,res18,0,10,1,min_rate=fast", "not a number"),
        ("0,res18,0,10,1,min_rate=inf", "positive"),
    ],
)
def test_bad_min_rates_are_refused(line, message):
    with pytest.raises(TraceError, match=message):
        parse_trace([line])


def test_a_line_holds_one_target():
    with pytest.raises(TraceError, match="one QoS target"):
        format_trace_line(TraceJob(0, "res18", 0.0, 10, 1, deadline_s=5.0, min_rate_iters_per_s=1.0))


def test_the_default_genie_trace_is_unchanged_byte_for_byte():
    default = genie_trace(300, jobs_per_hour=10.0, seed=7)
    explicit = genie_trace(300, jobs_per_hour=10.0, seed=7, min_rate_share=0.0)
    assert [format_trace_line(j) for j in explicit] == [format_trace_line(j) for j in default]
    assert all(j.min_rate_iters_per_s is None and j.deadline_s is not None for j in default)


def test_a_min_rate_share_turns_that_share_of_the_same_jobs_into_rate_jobs():
    catalog = load_catalog()
    default = genie_trace(400, jobs_per_hour=10.0, seed=7)
    mixed = genie_trace(400, jobs_per_hour=10.0, seed=7, min_rate_share=0.3)
    rate_jobs = [j for j in mixed if j.min_rate_iters_per_s is not None]
    assert 80 <= len(rate_jobs) <= 160  # ~30 % of 400
    for before, after in zip(default, mixed, strict=True):
        # Same job; a rate job has no deadline and the rate finishing it within the same latency.
        assert replace(after, deadline_s=before.deadline_s, min_rate_iters_per_s=None) == before
        if after.min_rate_iters_per_s is not None:
            assert after.deadline_s is None
            latency_s = before.deadline_s - before.arrival_s
            assert after.min_rate_iters_per_s == pytest.approx(after.total_iters / latency_s)
            best_rate = after.total_iters / standalone_best_s(
                catalog[after.model], after.total_iters, after.num_gpus
            )
            assert best_rate / 4.0 - 1e-9 <= after.min_rate_iters_per_s <= best_rate / 1.05 + 1e-9
    assert genie_trace(400, jobs_per_hour=10.0, seed=7, min_rate_share=1.0)[0].deadline_s is None
    with pytest.raises(ValueError, match="min_rate_share"):
        genie_trace(10, min_rate_share=1.5)


def test_min_rate_stats_hand_checked():
    def rec(job_id, start_s, finish_s, rate, avg):
        return JobRecord(
            job_id,
            "toy",
            1,
            0.0,
            start_s,
            finish_s,
            finish_s,
            0,
            min_rate_iters_per_s=rate,
            avg_rate_iters_per_s=avg,
        )

    stats = min_rate_stats(
        [
            rec(0, 0.0, 100.0, 1.0, 1.0),  # exactly at its target: met
            rec(1, 0.0, 200.0, 1.0, 0.5),  # half its target: missed
            rec(2, 0.0, None, 1.0, None),  # unfinished: missed
            rec(3, 0.0, 10.0, None, None),  # no rate target: not counted
            rec(4, 0.0, 10.0, 0.2, 0.3),  # met
        ]
    )
    assert (stats.jobs, stats.met, stats.unfinished) == (4, 2, 1)
    assert stats.met_pct == pytest.approx(50.0)
    assert min_rate_stats([]).met_pct != min_rate_stats([]).met_pct  # NaN without such jobs


# One GPU, 1 iteration/s. Job 0: 100 iterations, no target; job 1: 50 iterations, at least 0.5 it/s.
#   FIFO: job 1 waits until 100 then runs 100-150 at 1 it/s: its rate (50 / 50 s) is met although it
#   waited, since the rate counts from its first start; a deadline at 60 would have been missed.
#   Job 2 asks for 2 it/s, more than the GPU gives: missed (50 iterations in 50 s = 1 it/s).
def test_rate_is_measured_from_first_start_to_finish_and_reported_apart():
    trace = [
        TraceJob(0, "toy", 0.0, 100, 1),
        TraceJob(1, "toy", 0.0, 50, 1, min_rate_iters_per_s=0.5),
        TraceJob(2, "toy", 0.0, 50, 1, min_rate_iters_per_s=2.0),
        TraceJob(3, "toy", 0.0, 10, 1, deadline_s=5.0),
    ]
    result = run(trace)
    records = {r.job_id: r for r in result.records}
    assert (records[1].start_s, records[1].finish_s) == (100.0, 150.0)
    assert records[1].avg_rate_iters_per_s == pytest.approx(1.0)
    assert records[2].avg_rate_iters_per_s == pytest.approx(1.0)
    data = result.to_dict()
    assert (data["min_rate_jobs"], data["min_rate_pct"]) == (2, 50.0)
    assert (data["qos_jobs"], data["qos_pct"]) == (1, 0.0)  # the deadline kind alone
    json.dumps(data)


def test_no_rate_jobs_gives_none():
    data = run([TraceJob(0, "toy", 0.0, 10, 1, deadline_s=50.0)]).to_dict()
    assert (data["min_rate_jobs"], data["min_rate_pct"]) == (0, None)


def test_the_rate_reaches_the_core():
    # Under EDF a rate job goes ahead of a job without a target (both arrive together).
    trace = [TraceJob(0, "toy", 0.0, 100, 1), TraceJob(1, "toy", 0.0, 50, 1, min_rate_iters_per_s=0.5)]
    finish = {r.job_id: r.finish_s for r in run(trace, policy="edf").records}
    assert finish[1] == 50.0
