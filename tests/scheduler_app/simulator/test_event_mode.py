"""Event-driven mode: decisions at arrivals and completions, checked by hand on one GPU."""

from __future__ import annotations

import pytest

from profiles_app.catalog import load_catalog
from scheduler_app.simulator import ClusterSpec, TraceJob, genie_trace, simulate

ONE_GPU = ClusterSpec(servers=1, gpus_per_server=1, cpus_per_server=3, mem_gb_per_server=62.5)
RES18_ITER_S = load_catalog()["res18"].iter_time_s


def job(job_id: int, arrival_s: float, work_s: float, deadline_s: float | None = None) -> TraceJob:
    return TraceJob(job_id, "res18", arrival_s, round(work_s / RES18_ITER_S), 1, deadline_s)


def finishes(result) -> dict[int, float]:
    return {r.job_id: r.finish_s for r in result.records}


def test_the_next_job_starts_the_moment_the_gpu_frees_up():
    # Round mode: job 2 waits for the next 300 s tick after job 1 ends at 100 s. Events: it starts at 100.
    trace = [job(1, 0.0, 100.0), job(2, 10.0, 50.0)]
    rounds = simulate(trace, ONE_GPU, policy="fifo", allocator="proportional")
    events = simulate(trace, ONE_GPU, policy="fifo", allocator="proportional", mode="events")
    assert finishes(rounds) == pytest.approx({1: 100.0, 2: 350.0}, abs=1.0)
    assert finishes(events) == pytest.approx({1: 100.0, 2: 150.0}, abs=1.0)
    assert events.rounds == 3  # decisions at 0 (arrival of 1), 10 (arrival of 2) and 100 (end of 1)
    assert events.avg_jct_h < rounds.avg_jct_h


def test_an_arrival_is_decided_at_once_and_edf_preempts_for_it():
    # Job 1 (long, late deadline) runs; job 2 arrives at 60 s with an urgent deadline: EDF at the
    # arrival event pauses job 1, job 2 runs 60-90, job 1 resumes and ends at 630.
    trace = [job(1, 0.0, 600.0, deadline_s=10_000.0), job(2, 60.0, 30.0, deadline_s=200.0)]
    events = simulate(trace, ONE_GPU, policy="edf", allocator="proportional", mode="events")
    assert finishes(events) == pytest.approx({1: 630.0, 2: 90.0}, abs=1.0)
    assert events.qos.met == 2


def test_event_mode_is_deterministic_and_refuses_round_end_finishing():
    trace = genie_trace(40, jobs_per_hour=4, seed=3)
    cluster = ClusterSpec(servers=2)
    first = simulate(trace, cluster, policy="swaf", allocator="genie", mode="events")
    second = simulate(trace, cluster, policy="swaf", allocator="genie", mode="events")
    assert [r.finish_s for r in first.records] == [r.finish_s for r in second.records]
    assert first.finished_jobs == 40
    with pytest.raises(ValueError, match="round mode only"):
        simulate(trace, cluster, policy="fifo", allocator="tune", mode="events", finish_at_round_end=True)
    with pytest.raises(ValueError, match="mode must be one of"):
        simulate(trace, cluster, policy="fifo", allocator="tune", mode="ticks")
