"""SWAF's aging bound (policies/aging.py): a long job under a stream of short ones waits at most its
threshold plus a round, with and without restart costs; without aging it starves (the control)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler_app.core.policies import Policy
from scheduler_app.core.policies.aging import Aging, wait_s
from scheduler_app.core.policies.sjf import SjfPolicy
from scheduler_app.core.policies.srtf import SrtfPolicy
from scheduler_app.core.policies.swaf import SwafPolicy
from scheduler_app.core.restarts import RestartPolicy
from scheduler_app.core.types import JobView
from scheduler_app.simulator import ClusterSpec, TraceJob, simulate
from scheduler_app.simulator.restart_costs import RestartCosts
from tests.builders import make_cluster
from tests.scheduler_app.simulator.fakes import toy_profile

CATALOG = {"toy": toy_profile()}  # 1 s per iteration: iterations = seconds at the proportional point
FOUR_GPUS = ClusterSpec(servers=1, gpus_per_server=4, cpus_per_server=12, mem_gb_per_server=200.0)
ROUND_S = 300.0
LONG_ID, LONG_S = 0, 3600.0  # one 4-GPU job of an hour: it needs the whole server
SHORT_S = 1200.0  # 1-GPU jobs of 20 minutes ...
STREAM_H = 24.0  # ... one every 5 minutes for a day: four always run, one always waits
AGING = Aging(factor=2.0, floor_s=0.0)  # the long job's threshold: 2 x 1 h


def adversarial_trace() -> list[TraceJob]:
    """The long job arrives just after the stream has filled the GPUs; a short job follows every
    SHORT_S / 4, so a short job is always waiting, and shortest-first always prefers it."""
    shorts = [
        TraceJob(i, "toy", (i - 1) * SHORT_S / 4, int(SHORT_S), 1)
        for i in range(1, int(STREAM_H * 3600 / (SHORT_S / 4)) + 1)
    ]
    return [TraceJob(LONG_ID, "toy", 60.0, int(LONG_S), 4), *shorts]


def long_wait_s(
    aging: Aging | None, allocator: str, restarts: RestartPolicy | None, policy: type[Policy] = SwafPolicy
) -> float:
    result = simulate(
        adversarial_trace(),
        FOUR_GPUS,
        policy=policy(aging=aging),  # type: ignore[call-arg]
        allocator=allocator,
        catalog=CATALOG,
        round_s=ROUND_S,
        first_round_s=0.0,
        restarts=restarts,
        restart_costs=None if restarts is None else RestartCosts(startup_s=30.0, checkpoint_every_s=600.0),
    )
    record = next(r for r in result.records if r.job_id == LONG_ID)
    assert record.start_s is not None and record.finish_s is not None
    return record.start_s - record.arrival_s


RUNS = [
    pytest.param("tune", None, id="tune, papers' rounds"),
    pytest.param("genie", None, id="genie, papers' rounds"),
    pytest.param("tune", RestartPolicy(), id="tune, restart costs"),
    pytest.param("genie", RestartPolicy(), id="genie, restart costs"),
]


@pytest.mark.parametrize(("allocator", "restarts"), RUNS)
def test_the_long_job_waits_at_most_its_threshold_and_a_round(allocator, restarts):
    bound_s = AGING.factor * LONG_S + ROUND_S
    assert long_wait_s(AGING, allocator, restarts) <= bound_s


@pytest.mark.parametrize(("allocator", "restarts"), RUNS)
def test_without_aging_the_long_job_starves_past_the_bound(allocator, restarts):
    # The control: the same stream keeps it waiting until the stream ends (a day), far past 2 h.
    assert long_wait_s(None, allocator, restarts) > STREAM_H * 3600 - SHORT_S


@pytest.mark.parametrize("policy", [SjfPolicy, SrtfPolicy])
def test_sjf_and_srtf_given_the_rule_bound_the_wait_too(policy):
    assert long_wait_s(AGING, "tune", RestartPolicy(), policy) <= AGING.factor * LONG_S + ROUND_S
    # Without it (their default: the papers' baselines) they starve it like SWAF without aging.
    assert long_wait_s(None, "tune", RestartPolicy(), policy) > STREAM_H * 3600 - SHORT_S


def test_a_configured_maximum_wait_caps_the_multiple():
    capped = Aging(factor=2.0, floor_s=0.0, max_wait_s=1800.0)
    assert long_wait_s(capped, "tune", RestartPolicy()) <= 1800.0 + ROUND_S


# -- the rule itself -------------------------------------------------------------------------------
CLUSTER = make_cluster(1, gpus=4, cpus=12, mem_gb=200.0)


def job(
    job_id: int, *, num_gpus: int = 1, arrival_s: float = 0.0, total_iters: float = 1000.0, **kw
) -> JobView:
    """A job of the toy profile: 1 s per iteration, so iterations are seconds at the proportional point."""
    return JobView(job_id, num_gpus, arrival_s, CATALOG["toy"], total_iters, **kw)


def test_threshold_is_k_times_the_remaining_proportional_time_or_the_floor():
    aging = Aging(factor=3.0, floor_s=600.0)
    assert aging.threshold_s(job(1, total_iters=1000)) == 3000.0
    assert aging.threshold_s(job(2, total_iters=100)) == 600.0
    half_done = job(3, total_iters=1000, done_iters=500)
    assert aging.threshold_s(half_done) == 1500.0
    assert Aging(factor=3.0, floor_s=600.0, max_wait_s=1000.0).threshold_s(job(4, total_iters=1000)) == 1000.0


def test_wait_leaves_out_the_time_the_job_ran():
    ran_100_s_on_2_gpus = job(1, num_gpus=2, arrival_s=0.0, attained_service_gpu_s=200.0)
    assert wait_s(ran_100_s_on_2_gpus, now_s=500.0) == 400.0


def test_an_aged_long_job_goes_ahead_of_shorter_ones_but_behind_a_deadline_it_cannot_delay():
    aging = Aging(factor=2.0, floor_s=0.0)
    long = job(1, arrival_s=0.0, total_iters=1000)  # threshold 2000 s
    short = job(2, arrival_s=1995.0, total_iters=10)  # waits 6 s, under its 20 s
    due = job(3, arrival_s=1995.0, total_iters=10, deadline_s=5000.0)
    young = SwafPolicy(aging=aging).order([long, short, due], CLUSTER, now_s=1999.0)
    assert [j.job_id for j in young] == [3, 2, 1]
    aged = SwafPolicy(aging=aging).order([long, short, due], CLUSTER, now_s=2001.0)
    assert [j.job_id for j in aged] == [3, 1, 2]
    assert SwafPolicy(aging=aging).must_not_wait([long, short, due], CLUSTER, 2001.0) == {1}
    assert SwafPolicy(aging=None).must_not_wait([long, short, due], CLUSTER, 2001.0) == set()


def test_qos_jobs_do_not_age_late_or_not():
    aging = Aging(factor=1.0, floor_s=0.0)
    due = job(1, arrival_s=0.0, total_iters=10, deadline_s=10_000.0)
    late = job(2, arrival_s=0.0, total_iters=10, deadline_s=100.0)
    rate = job(3, arrival_s=0.0, total_iters=10, min_rate_iters_per_s=0.5)
    free = job(4, arrival_s=0.0, total_iters=10)
    assert SwafPolicy(aging=aging).must_not_wait([due, late, rate, free], CLUSTER, now_s=5000.0) == {4}


@settings(max_examples=60, deadline=None)
@given(
    lengths_s=st.lists(st.integers(10, 10_000), min_size=2, max_size=12),
    arrivals_s=st.lists(st.integers(0, 20_000), min_size=12, max_size=12),
    now_s=st.integers(0, 40_000),
    factor=st.floats(0.5, 8.0),
)
def test_every_aged_job_precedes_every_job_that_is_not_and_aged_jobs_go_by_arrival(
    lengths_s, arrivals_s, now_s, factor
):
    aging = Aging(factor=factor, floor_s=0.0)
    jobs = [
        job(i, arrival_s=float(min(a, now_s)), total_iters=n)
        for i, (n, a) in enumerate(zip(lengths_s, arrivals_s, strict=False))
    ]
    ordered = SwafPolicy(aging=aging).order(jobs, CLUSTER, float(now_s))
    flags = [aging.is_aged(j, float(now_s)) for j in ordered]
    assert flags == sorted(flags, reverse=True)  # aged first
    aged = [j for j, f in zip(ordered, flags, strict=True) if f]
    assert [(j.arrival_s, j.job_id) for j in aged] == sorted((j.arrival_s, j.job_id) for j in aged)
    rest = [j for j, f in zip(ordered, flags, strict=True) if not f]
    assert [j.remaining_iters for j in rest] == sorted(j.remaining_iters for j in rest)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.integers(0, 2),  # priority
            st.floats(0.0, 5000.0),  # arrival
            st.integers(1, 4000),  # total iterations
            st.integers(0, 4000),  # done
            st.floats(0.0, 20000.0),  # attained GPU-seconds
        ),
        min_size=1,
        max_size=30,
    ),
    st.sampled_from(
        [None, Aging(factor=2.0, floor_s=300.0), Aging(factor=4.0, floor_s=0.0, max_wait_s=900.0)]
    ),
)
def test_swaf_without_qos_targets_orders_as_its_keys_say(rows, aging):
    """SWAF's order of jobs none of which has a QoS target (worked out in one pass, swaf.py
    `_order_without_qos_targets`) is the documented one: aged jobs by arrival, then shortest remaining
    proportional execution time first, after a higher priority; ties by arrival, then id."""
    jobs = [
        job(i, arrival_s=a, total_iters=t, done_iters=min(d, t), attained_service_gpu_s=s, priority=p)
        for i, (p, a, t, d, s) in enumerate(rows)
    ]
    now_s = 6000.0

    def key(j: JobView) -> tuple:
        if aging is not None and aging.is_aged(j, now_s):
            return (-j.priority, 0, 0.0, j.arrival_s, j.job_id)
        return (-j.priority, 1, j.remaining_iters * j.profile.iter_time_s, j.arrival_s, j.job_id)

    ordered = SwafPolicy(aging=aging).order(jobs, CLUSTER, now_s)
    assert [j.job_id for j in ordered] == [j.job_id for j in sorted(jobs, key=key)]
    aged = SwafPolicy(aging=aging).must_not_wait(jobs, CLUSTER, now_s)
    assert aged == {j.job_id for j in jobs if aging is not None and aging.is_aged(j, now_s)}


class _CappedAging(Aging):
    """An aging rule of another threshold: SWAF's inline order must ask it, not the base rule's."""

    def threshold_for_s(self, proportional_s: float) -> float:
        return 10.0


def test_swaf_asks_an_aging_subclass_for_its_threshold() -> None:
    short = job(1, arrival_s=0.0, total_iters=100, done_iters=0, attained_service_gpu_s=0.0, priority=0)
    long = job(2, arrival_s=0.0, total_iters=4000, done_iters=0, attained_service_gpu_s=0.0, priority=0)
    now_s = 600.0  # both have waited 600 s: within the base rule's floor, past the subclass's 10 s
    assert [j.job_id for j in SwafPolicy(aging=Aging()).order([long, short], CLUSTER, now_s)] == [1, 2]
    # Both aged: arrival order, then id.
    ordered = SwafPolicy(aging=_CappedAging()).order([long, short], CLUSTER, now_s)
    assert [j.job_id for j in ordered] == [1, 2]
    late = job(3, arrival_s=500.0, total_iters=50, done_iters=0, attained_service_gpu_s=0.0, priority=0)
    # The shortest job, arrived at 500 s, has waited 100 s: aged only under the subclass, where it
    # comes after the two that arrived earlier.
    assert [j.job_id for j in SwafPolicy(aging=Aging()).order([long, short, late], CLUSTER, now_s)] == [
        3,
        1,
        2,
    ]
    assert [
        j.job_id for j in SwafPolicy(aging=_CappedAging()).order([long, short, late], CLUSTER, now_s)
    ] == [
        1,
        2,
        3,
    ]
