"""Tune's fresh plan's throughput for single-GPU rounds on plain lists: the general walk's float."""

from __future__ import annotations

import dataclasses
import random

import pytest

from scheduler_app.core import reasons
from scheduler_app.core.allocators import tune_fresh
from scheduler_app.core.allocators.tune import ORDER_DEMAND, TuneAllocator, TuneRound
from scheduler_app.core.allocators.tune_fresh import single_gpu_fresh_throughput
from scheduler_app.core.placement import FIRST_FIT, PACKED
from scheduler_app.core.types import ClusterSnapshot, JobView, RoundPlan
from scheduler_app.simulator import ClusterSpec, philly_derived_trace, simulate
from tests.builders import make_cluster, make_job, make_server, uniform_cluster

MODELS = ("alexnet", "bert", "deepspeech", "gnmt", "lstm", "m5", "mobilenet", "res18", "res50", "vae")


def _cluster(rng: random.Random) -> ClusterSnapshot:
    """Servers short of cores or memory in various ways, some of them partly busy or uneven."""
    kind = rng.randrange(4)
    if kind < 3:
        return uniform_cluster(kind, rng)
    servers = [
        make_server(8, 24, 500.0, server_id=0),
        make_server(4, 16, 250.0, server_id=1),
        make_server(8, 24, 500.0, server_id=2, free_gpus=(0, 1, 2, 5, 6), free_cpus=15, free_mem_gb=310.0),
    ]
    return make_cluster(servers)


def _job(job_id: int, rng: random.Random) -> JobView:
    return make_job(job_id, rng.choice(MODELS), arrival_s=float(job_id))


def _next_round(rng: random.Random, jobs: list[JobView], plan: RoundPlan, next_id: int) -> list[JobView]:
    where = plan.placements()
    kept = [dataclasses.replace(j, current=where.get(j.job_id)) for j in jobs if rng.random() > 0.2]
    return kept + [_job(next_id + n, rng) for n in range(rng.randrange(0, 10))]


def _fresh(jobs: list[JobView], snapshot: ClusterSnapshot) -> TuneRound:
    return TuneRound(jobs, snapshot, PACKED, sticky=False, keep_homes=False)


def test_the_lean_walk_gives_the_general_walks_throughput_to_the_last_bit() -> None:
    rounds = reverted = downgraded = waited = 0
    for seed in range(40):
        rng = random.Random(seed)
        snapshot = _cluster(rng)
        jobs = [_job(i, rng) for i in range(rng.randrange(4, 40))]
        next_id = 1000
        for _ in range(5):
            lean = single_gpu_fresh_throughput(_fresh(jobs, snapshot))
            general = _fresh(jobs, snapshot)
            plan = general.run()
            assert lean is not None
            assert lean == plan.throughput()  # the same float, summed in the same order
            why = [d.reason for d in plan.decisions]
            reverted += why.count(reasons.REVERTED_TO_PROPORTIONAL)
            downgraded += why.count(reasons.PROPORTIONAL)
            waited += why.count(reasons.FRAGMENTED)
            rounds += 1
            jobs = _next_round(rng, jobs, TuneAllocator().allocate(jobs, snapshot), next_id)
            next_id += 100
    assert rounds == 200
    # Step 5's every outcome was walked: peers reverted, jobs downgraded, and jobs left waiting.
    assert reverted > 50 and downgraded > 50 and waited > 0, (reverted, downgraded, waited)


def test_rounds_of_another_shape_are_left_to_the_general_walk() -> None:
    snapshot = make_cluster(2)
    single = [make_job(1, "res18"), make_job(2, "alexnet")]
    assert single_gpu_fresh_throughput(_fresh(single, snapshot)) is not None
    two_gpus = [*single, make_job(3, "bert", gpus=2)]
    assert single_gpu_fresh_throughput(_fresh(two_gpus, snapshot)) is None
    fixed = [*single, make_job(3, "bert", cpus_per_gpu=2.0)]
    assert single_gpu_fresh_throughput(_fresh(fixed, snapshot)) is None
    nodes = [*single, dataclasses.replace(make_job(3, "bert"), num_nodes=1)]
    assert single_gpu_fresh_throughput(_fresh(nodes, snapshot)) is None
    sticky = TuneRound(single, snapshot, PACKED)
    assert single_gpu_fresh_throughput(sticky) is None
    first_fit = TuneRound(single, snapshot, FIRST_FIT, sticky=False, keep_homes=False)
    assert single_gpu_fresh_throughput(first_fit) is None


@pytest.mark.parametrize("order", [ORDER_DEMAND, "subclass"])
def test_planned_throughput_takes_the_lean_walk_only_for_tunes_own_round(order: str, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    calls: list[object] = []
    monkeypatch.setattr(
        "scheduler_app.core.allocators.tune.single_gpu_fresh_throughput", lambda r: calls.append(r) or None
    )
    jobs, snapshot = [make_job(1, "res18"), make_job(2, "alexnet")], make_cluster(1)

    class OtherRound(TuneRound):
        pass

    if order == "subclass":
        OtherRound(jobs, snapshot, PACKED, sticky=False, keep_homes=False).planned_throughput()
    else:
        TuneRound(jobs, snapshot, PACKED, order=order, sticky=False, keep_homes=False).planned_throughput()
    assert calls == []
    _fresh(jobs, snapshot).planned_throughput()
    assert len(calls) == 1


class GeneralWalkTune(TuneAllocator):
    """Tune whose fresh plans always take the general walk (its round is a subclass)."""

    class round_class(TuneRound):
        pass


def test_simulations_give_the_same_figures_with_the_lean_walk(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    # Image-heavy single-GPU jobs on a cluster short of cores: the repack test runs in most rounds.
    trace = philly_derived_trace(300, jobs_per_hour=7.0, class_split=(50, 0, 50), seed=5)
    cluster = ClusterSpec(servers=4, gpus_per_server=8, cpus_per_server=24, mem_gb_per_server=500.0)
    used = {"n": 0}
    lean = tune_fresh.single_gpu_fresh_throughput

    def counted(round_: TuneRound) -> float | None:
        value = lean(round_)
        used["n"] += value is not None
        return value

    monkeypatch.setattr("scheduler_app.core.allocators.tune.single_gpu_fresh_throughput", counted)
    for policy in ("fifo", "srtf", "las"):
        new = simulate(trace, cluster, policy=policy, allocator=TuneAllocator(), finish_at_round_end=True)
        old = simulate(trace, cluster, policy=policy, allocator=GeneralWalkTune(), finish_at_round_end=True)
        assert new.to_dict() | {"wall_s": 0} == old.to_dict() | {"wall_s": 0}
    assert used["n"] > 100
