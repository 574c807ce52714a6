"""Fair share in the simulator and the forecast: owners' usage grows as their jobs run."""

from __future__ import annotations

import dataclasses

from profiles_app.catalog import load_catalog
from scheduler_app.simulator import ClusterSpec, TraceJob, simulate
from scheduler_app.simulator.forecast import forecast
from tests.builders import make_cluster, make_job

ITER_S = load_catalog()["res18"].iter_time_s
ONE_GPU = ClusterSpec(servers=1, gpus_per_server=1, cpus_per_server=3, mem_gb_per_server=62.5)


def hour_job(job_id: int, owner: int, arrival_s: float) -> TraceJob:
    return TraceJob(job_id, "res18", arrival_s, round(3600 / ITER_S), 1, owner_id=owner)


def test_on_one_gpu_a_second_user_goes_between_the_first_users_jobs():
    # Alice queues three 1-h jobs at t=0, Bob one at t=60. FIFO: Bob waits for all three; fair share:
    # once Alice's first has run an hour, Bob (no usage) goes before her second.
    trace = [hour_job(1, 1, 0), hour_job(2, 1, 0), hour_job(3, 1, 0), hour_job(4, 2, 60)]
    finish = {}
    for policy in ("fifo", "fairshare"):
        result = simulate(trace, ONE_GPU, policy=policy, allocator="proportional", round_s=300)
        finish[policy] = [r.job_id for r in sorted(result.records, key=lambda r: r.finish_s)]
    assert finish["fifo"] == [1, 2, 3, 4]
    assert finish["fairshare"] == [1, 4, 2, 3]


def test_without_owners_fair_share_simulates_like_fifo():
    trace = [dataclasses.replace(hour_job(i, 1, 10 * i), owner_id=None) for i in range(1, 5)]
    fifo = simulate(trace, ONE_GPU, policy="fifo", allocator="proportional", round_s=300)
    fair = simulate(trace, ONE_GPU, policy="fairshare", allocator="proportional", round_s=300)
    assert [r.finish_s for r in fifo.records] == [r.finish_s for r in fair.records]


def test_the_forecast_keeps_the_live_owners_usage():
    # The live service says Bob used 1.5 GPU-hours lately (virtual start 5400 s): on one GPU his job is
    # forecast after two of Alice's 1-h jobs (0 and 3600 s), before her third (7200 s). Were his usage
    # lost on the way into the forecast, he would go second.
    cluster = make_cluster(1, gpus=1, cpus=3, mem_gb=62.5)
    total = 3600 / ITER_S

    def owned(job_id, owner, arrival_s, usage):
        job = make_job(job_id, total_iters=total, arrival_s=arrival_s)
        return dataclasses.replace(job, owner_id=owner, owner_usage_gpu_s=usage)

    jobs = [owned(1, 1, 0, 0.0), owned(2, 1, 1, 0.0), owned(3, 1, 2, 0.0), owned(4, 2, 3, 5400.0)]
    out = forecast(
        cluster, jobs, policy="fairshare", allocator="proportional", first_round_s=0.0, round_s=300
    )
    order = sorted(out, key=lambda j: out[j].start_s)
    assert order == [1, 2, 4, 3]
