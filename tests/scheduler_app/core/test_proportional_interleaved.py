"""Proportional's hold of the running jobs when newcomers come between them: the claims' round, exactly."""

from __future__ import annotations

import dataclasses
import random

import pytest

from scheduler_app.core import reasons
from scheduler_app.core.allocators import proportional
from scheduler_app.core.allocators.proportional import ProportionalAllocator
from scheduler_app.core.allocators.tune import TuneAllocator
from scheduler_app.core.placement import FIRST_FIT, PACKED, Score
from scheduler_app.core.placement.setup import RoundSetup
from scheduler_app.core.types import ClusterSnapshot, JobView, Outcome, RoundPlan
from scheduler_app.simulator import ClusterSpec, philly_derived_trace, simulate
from tests.builders import make_cluster, make_job, make_server, uniform_cluster

MODELS = ("alexnet", "bert", "deepspeech", "gnmt", "lstm", "m5", "mobilenet", "res18", "res50", "vae")


def _cluster(rng: random.Random) -> ClusterSnapshot:
    """Shares on and off the 2^-20 grid, servers partly busy or short of their shares, uneven ones."""
    kind = rng.randrange(5)
    if kind < 3:
        return uniform_cluster(kind, rng)
    if kind == 3:  # one server with fewer cores free than its free GPUs' shares
        return make_cluster(
            [
                make_server(8, 24, 500.0, server_id=0),
                make_server(8, 24, 500.0, server_id=1, free_gpus=(0, 1, 2, 5, 6, 7), free_cpus=16),
                make_server(8, 24, 500.0, server_id=2),
            ]
        )
    return make_cluster([make_server(8, 24, 500.0, server_id=0), make_server(4, 16, 250.0, server_id=1)])


def _job(job_id: int, rng: random.Random, wide: float) -> JobView:
    gpus = rng.choice((2, 4)) if rng.random() < wide else 1
    fixed = rng.choice((2.0, 5.0)) if rng.random() < 0.03 else None  # a user's per-GPU cores
    return make_job(job_id, rng.choice(MODELS), gpus=gpus, arrival_s=float(job_id), cpus_per_gpu=fixed)


def _next_jobs(
    rng: random.Random, jobs: list[JobView], plan: RoundPlan, next_id: int, wide: float
) -> list[JobView]:
    """Some jobs end, the others run where the plan put them (a few at another speed-up than the
    plan's, as after a change of allocator), newcomers arrive; then a new order in which newcomers go
    between the running jobs (as srtf's and las's do)."""
    where = plan.placements()
    for job_id, placement in list(where.items()):
        if rng.random() < 0.05:
            where[job_id] = dataclasses.replace(placement, speedup=placement.speedup * 0.9)
    kept = [dataclasses.replace(j, current=where.get(j.job_id)) for j in jobs if rng.random() > 0.15]
    out = kept + [_job(next_id + n, rng, wide) for n in range(rng.randrange(0, 8))]
    rng.shuffle(out)
    return out


def _general(monkeypatch: pytest.MonkeyPatch, jobs: list[JobView], snapshot: ClusterSnapshot) -> RoundPlan:
    with monkeypatch.context() as m:
        m.setattr(proportional, "hold_interleaved", lambda *args: frozenset())
        return ProportionalAllocator().allocate(jobs, snapshot)


@pytest.mark.parametrize(("wide", "previous"), [(0.0, "proportional"), (0.2, "proportional"), (0.0, "tune")])
def test_holding_the_running_jobs_first_gives_the_claims_plan(
    monkeypatch: pytest.MonkeyPatch, wide: float, previous: str
) -> None:
    """`previous`: the allocator whose plans the jobs ran on (tune's give other shares)."""
    held_rounds: list[int] = []
    real = proportional.hold_interleaved

    def spy(round_: RoundSetup, score: Score) -> frozenset[int]:
        held = real(round_, score)
        if held:
            held_rounds.append(len(held))
        return held

    monkeypatch.setattr(proportional, "hold_interleaved", spy)
    rounds = preempted = newcomers_ahead = 0
    for seed in range(40):
        rng = random.Random(seed)
        snapshot = _cluster(rng)
        jobs = [_job(i, rng, wide) for i in range(rng.randrange(4, 40))]
        next_id = 1000
        plan = ProportionalAllocator().allocate(jobs, snapshot)
        for _ in range(6):
            jobs = _next_jobs(rng, jobs, plan, next_id, wide)
            next_id += 100
            before = len(held_rounds)
            plan = ProportionalAllocator().allocate(jobs, snapshot)
            general = _general(monkeypatch, jobs, snapshot)
            assert plan.decisions == general.decisions
            assert plan.stable == general.stable
            rounds += 1
            if len(held_rounds) > before:
                running = [j.current is not None for j in jobs]
                last = max(p for p, r in enumerate(running) if r)
                newcomers_ahead += not all(running[:last])
                preempted += any(
                    j.current is not None and d.outcome is Outcome.PENDING
                    for j, d in zip(jobs, plan.decisions, strict=True)
                )
            if previous == "tune":
                plan = TuneAllocator().allocate(jobs, snapshot)
    assert rounds == 240
    # The new path decided many of these rounds, with newcomers ahead of running jobs and running
    # jobs left out by admission (preempted) among them; the other rounds took the claims.
    assert len(held_rounds) > 10 and newcomers_ahead > 10 and preempted > 3, (
        len(held_rounds),
        newcomers_ahead,
        preempted,
    )
    assert len(held_rounds) < rounds


def test_rounds_of_another_shape_take_the_claims(monkeypatch: pytest.MonkeyPatch) -> None:
    snapshot = make_cluster(2)
    first = ProportionalAllocator().allocate([make_job(1, "res18"), make_job(2, "bert")], snapshot)
    where = first.placements()
    running = [dataclasses.replace(make_job(j, "res18"), current=where[j]) for j in (1, 2)]

    def held(jobs: list[JobView], snap: ClusterSnapshot = snapshot, score: Score = PACKED) -> frozenset[int]:
        return proportional.hold_interleaved(RoundSetup(jobs, snap), score)

    assert held([make_job(3, "alexnet"), *running]) == frozenset({1, 2})
    assert held([make_job(3, "alexnet", gpus=2), *running]) == frozenset()  # wider newcomer ahead
    assert held([running[0], make_job(3, "alexnet", gpus=2), running[1]]) == frozenset()
    assert held([*running, make_job(3, "alexnet", gpus=2)]) == frozenset({0, 1})  # behind them all
    assert held([make_job(3, "alexnet", gpus=2), *running], score=FIRST_FIT) == frozenset({1, 2})
    assert held([make_job(3, "alexnet", cpus_per_gpu=2.0), *running]) == frozenset()  # fixed demand
    nodes = dataclasses.replace(make_job(3, "alexnet"), num_nodes=1)
    assert held([nodes, *running]) == frozenset()
    busy = make_cluster(
        [make_server(8, 24, 500.0, server_id=0), make_server(8, 24, 500.0, server_id=1, free_cpus=20)]
    )
    assert held([make_job(3, "alexnet"), *running], busy) == frozenset()  # short of its shares
    # The new path leaves pending what admission leaves out, as the claims do.
    full = [make_job(10 + n, "alexnet") for n in range(15)]
    plan = ProportionalAllocator().allocate([*full, *running], snapshot)
    assert [d.outcome for d in plan.decisions].count(Outcome.PLACED) == 16
    assert plan.decisions[-1].reason == reasons.INSUFFICIENT_GPUS
    assert plan.decisions == _general(monkeypatch, [*full, *running], snapshot).decisions


@pytest.mark.parametrize("wide", [0.0, 0.3])
def test_packed_placement_gives_the_same_plans(monkeypatch: pytest.MonkeyPatch, wide: float) -> None:
    rng = random.Random(7)
    snapshot = make_cluster(3)
    jobs = [_job(i, rng, wide) for i in range(20)]
    plan = ProportionalAllocator(PACKED).allocate(jobs, snapshot)
    for n in range(30):
        jobs = _next_jobs(rng, jobs, plan, 100 * (n + 1), wide)
        plan = ProportionalAllocator(PACKED).allocate(jobs, snapshot)
        with monkeypatch.context() as m:
            m.setattr(proportional, "hold_interleaved", lambda *args: frozenset())
            assert plan.decisions == ProportionalAllocator(PACKED).allocate(jobs, snapshot).decisions


@pytest.mark.parametrize("policy", ["srtf", "las"])
@pytest.mark.parametrize("multi_gpu", [False, True])
def test_simulations_are_the_same_with_and_without_it(
    monkeypatch: pytest.MonkeyPatch, policy: str, multi_gpu: bool
) -> None:
    trace = philly_derived_trace(250, jobs_per_hour=12.0, multi_gpu=multi_gpu, seed=3)
    cluster = ClusterSpec(servers=4, gpus_per_server=8, cpus_per_server=24, mem_gb_per_server=500.0)
    calls: list[int] = []
    real = proportional.hold_interleaved

    def spy(round_: RoundSetup, score: Score) -> frozenset[int]:
        held = real(round_, score)
        calls.append(bool(held))
        return held

    monkeypatch.setattr(proportional, "hold_interleaved", spy)
    lean = simulate(trace, cluster, policy=policy, allocator=ProportionalAllocator()).to_dict()
    assert sum(calls) > 20  # rounds this path decided
    monkeypatch.setattr(proportional, "hold_interleaved", lambda *args: frozenset())
    general = simulate(trace, cluster, policy=policy, allocator=ProportionalAllocator()).to_dict()
    lean.pop("wall_s", None)
    general.pop("wall_s", None)
    assert lean == general
