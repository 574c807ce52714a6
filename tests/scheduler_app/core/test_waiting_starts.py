"""The move guard's estimate of when a plan's waiting jobs start, as its running jobs finish."""

from __future__ import annotations

import dataclasses

from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler_app.core import reasons
from scheduler_app.core.move_guard import guarded_plan
from scheduler_app.core.restarts import RestartPolicy
from scheduler_app.core.types import Decision, Outcome, RoundPlan
from scheduler_app.core.waiting_starts import waiting_start_offsets
from tests.builders import make_cluster, make_job
from tests.scheduler_app.core.test_move_guard import NOW_S, on, pending, placed, placement, running, scripted


def test_a_waiting_job_starts_when_enough_gpus_of_one_server_are_free_for_good():
    cluster = make_cluster(2, gpus=8)
    finishes = {
        1: (100.0, ((0, 8),)),  # server 0 full until 100 s
        2: (50.0, ((1, 4),)),  # server 1: 4 free now, 8 from 50 s
    }
    four, eight = make_job(3, gpus=4), make_job(4, gpus=8, total_iters=100_000.0)
    starts = waiting_start_offsets(finishes, [eight, four], cluster, horizon_s=1800.0)
    assert starts[4] == 50.0  # server 1 frees whole at 50 s, before server 0 at 100 s
    assert starts[3] == 100.0  # then server 0; server 1's 4 free now are the 8-GPU job's from 50 s
    short = dataclasses.replace(eight, total_iters=10.0)  # done a few seconds after it starts
    starts = waiting_start_offsets(finishes, [short, four], cluster, horizon_s=1800.0)
    assert 50.0 < starts[3] < 100.0  # server 1 again, once the short 8-GPU job is done
    assert waiting_start_offsets(finishes, [eight], cluster, horizon_s=40.0) == {}  # not within 40 s


def test_a_job_over_several_servers_or_past_the_horizon_gets_no_start():
    cluster = make_cluster(1, gpus=8)
    big = make_job(1, gpus=16)
    assert waiting_start_offsets({}, [big], cluster, horizon_s=1800.0) == {}
    spread = dataclasses.replace(make_job(2, gpus=2), num_nodes=2)
    assert waiting_start_offsets({}, [spread], cluster, horizon_s=1800.0) == {}


def test_a_repacking_to_start_a_job_now_is_not_made_when_it_would_start_soon_anyway():
    # Two servers of 2 GPUs: job 1 (long) on server 0, job 2 on server 1 ends in a minute; job 3 needs
    # 2 GPUs. The allocator moves job 1 beside job 2 to start job 3 at once on server 0. Job 3 would
    # start in a minute anyway, when job 2 ends: the move does not pay.
    cluster = make_cluster(2, gpus=2, cpus=6, mem_gb=125.0)
    home1, there1 = placement(1, on(0, (0,))), placement(1, on(1, (1,)))
    home2 = placement(2, on(1, (0,)))
    cheap = {"startup_s": 30.0, "checkpoint_every_s": 600.0}
    one = running(1, 1, home1, started_s=NOW_S - 1_000.0, total_iters=100_000.0, **cheap)
    two = running(2, 1, home2, started_s=NOW_S - 1_000.0, total_iters=1_000.0, done_iters=1_000.0 - 60.0)
    three = pending(3, 2, total_iters=1_000.0)
    plans = {
        frozenset({1, 2, 3}): RoundPlan((placed(there1), placed(home2), placed(placement(3, on(0, (0, 1)))))),
        frozenset({3}): RoundPlan((Decision(3, Outcome.PENDING, reasons.INSUFFICIENT_GPUS),)),
        # job 1 pinned too (its move gains it nothing): job 3 waits
        frozenset({2, 3}): RoundPlan(
            (placed(home2), Decision(3, Outcome.PENDING, reasons.INSUFFICIENT_GPUS))
        ),
    }
    plan = guarded_plan(scripted(plans), [one, two, three], cluster, NOW_S, RestartPolicy())
    assert plan.decision_for(1) == Decision(1, Outcome.PLACED, reasons.RESTART_COST, home1)
    assert plan.decision_for(3).outcome is Outcome.PENDING
    # If job 2 ran for hours more, job 3 would wait for hours: then the move pays.
    long_two = dataclasses.replace(two, done_iters=0.0, total_iters=1_000_000.0)
    plan = guarded_plan(scripted(plans), [one, long_two, three], cluster, NOW_S, RestartPolicy())
    assert plan.decision_for(1) == placed(there1)


def test_a_servers_earliest_start_is_the_walk_back_from_its_last_change():
    """_Timeline.earliest searches the least free counts from each change on; the same answer as
    walking the changes back from the last while at least `need` GPUs are free, on random timelines
    (changes before now included)."""
    import random

    from scheduler_app.core.waiting_starts import _Timeline

    def walked(line: _Timeline, need: int, until_s: float) -> float | None:
        free, levels = 0, []
        for t, d in zip(line.times, line.deltas, strict=True):
            free += d
            levels.append((t, free))
        start = None
        for t, level in reversed(levels):
            if level < need:
                break
            start = t
        return None if start is None or start > until_s else start

    rng = random.Random(5)
    for _ in range(2000):
        line = _Timeline(rng.randint(0, 8))
        for _ in range(rng.randint(0, 10)):
            at_s = rng.choice([rng.uniform(-10.0, 3000.0), float(rng.randint(0, 20))])
            line.add(at_s, rng.choice([-1, 1]) * rng.randint(0, 8))
            need, until_s = rng.randint(0, 9), rng.uniform(0.0, 3000.0)
            assert line.earliest(need, until_s) == walked(line, need, until_s)


def _starts_server_by_server(finishes, waiting, snapshot, horizon_s):
    """The estimate as first written: every server asked for every waiting job, the first in snapshot
    order among those where it starts soonest (the reference for the heap's answer)."""
    from scheduler_app.core.waiting_starts import _Timeline

    used: dict[int, int] = {}
    for _, shares in finishes.values():
        for server_id, gpus in shares:
            used[server_id] = used.get(server_id, 0) + gpus
    lines = {s.server_id: _Timeline(len(s.free_gpus) - used.get(s.server_id, 0)) for s in snapshot.servers}
    largest = max((s.num_gpus for s in snapshot.servers), default=0)
    freeable = sum(max(0, len(s.free_gpus) - used.get(s.server_id, 0)) for s in snapshot.servers)
    for finish_s, shares in finishes.values():
        for server_id, gpus in shares:
            lines[server_id].add(finish_s, gpus)
            if finish_s <= horizon_s:
                freeable += gpus
    starts = {}
    for job in waiting:
        if freeable <= 0:
            break
        need = job.num_gpus
        if need > largest or (job.num_nodes or 1) > 1:
            continue
        best = None
        for server_id, line in lines.items():
            at = line.earliest(need, horizon_s)
            if at is not None and (best is None or at < best[0]):
                best = (at, server_id)
        if best is None:
            continue
        at, server_id = best
        run_s = job.remaining_iters * job.profile.iter_time_s + job.startup_s
        lines[server_id].add(at, -need)
        lines[server_id].add(at + run_s, need)
        freeable -= need
        starts[job.job_id] = at
    return starts


@settings(max_examples=300, deadline=None)
@given(
    servers=st.integers(1, 6),
    running=st.lists(
        st.tuples(st.integers(0, 5), st.sampled_from((1, 2, 4, 8)), st.floats(-60.0, 4000.0)), max_size=20
    ),
    waiting=st.lists(st.tuples(st.sampled_from((1, 1, 2, 4, 8)), st.integers(1, 5000)), max_size=25),
    horizon_s=st.sampled_from((600.0, 1800.0, 3600.0)),
)
def test_the_soonest_server_is_the_one_asking_every_server_finds(servers, running, waiting, horizon_s):
    cluster = make_cluster(servers, gpus=8)
    left = {s: 8 for s in range(servers)}
    finishes = {}
    for n, (server, gpus, finish_s) in enumerate(running):
        server %= servers
        if left[server] >= gpus:
            left[server] -= gpus
            finishes[1000 + n] = (finish_s, ((server, gpus),))
    jobs = [make_job(i + 1, gpus=g, total_iters=float(t)) for i, (g, t) in enumerate(waiting)]
    expected = _starts_server_by_server(finishes, jobs, cluster, horizon_s)
    assert waiting_start_offsets(finishes, jobs, cluster, horizon_s) == expected
