"""Tune's repack test: the fresh plan's throughput without its plan, and remembered for the same jobs."""

from __future__ import annotations

import dataclasses
import pickle
import random
from types import SimpleNamespace

from bench.synergy_runs import DEFAULT_DATA_DIR, STATIC_TRACE, TESTBED, PolicyOrderTune
from scheduler_app.core.allocators.tune import TuneAllocator, TuneRound
from scheduler_app.core.allocators.tune_repack import FreshThroughputs, held_speed
from scheduler_app.core.placement import PACKED
from scheduler_app.core.types import JobView, RoundPlan
from scheduler_app.simulator import ClusterSpec, philly_derived_trace, read_trace, simulate
from tests.builders import make_cluster, make_job

MODELS = ("alexnet", "bert", "deepspeech", "gnmt", "lstm", "m5", "mobilenet", "res18", "res50", "vae")
# The catalog's jobs run as fast spread as on one server: these pay for it, so a spread job's speed
# in the plan is its held speed less the penalty.
PENALISED = {
    model: dataclasses.replace(make_job(0, model).profile, placement_penalty=1.25) for model in MODELS
}


def _job(job_id: int, rng: random.Random, arrival_s: float = 0.0) -> JobView:
    model = rng.choice(MODELS)
    job = make_job(job_id, model, gpus=rng.choice((1, 1, 2, 4, 8)), arrival_s=arrival_s)
    return dataclasses.replace(job, profile=PENALISED[model])


def _next_round(rng: random.Random, jobs: list[JobView], plan: RoundPlan, next_id: int) -> list[JobView]:
    """The jobs a round later: each on the Placement `plan` gave it, some finished, some arrived."""
    where = plan.placements()
    kept = [dataclasses.replace(j, current=where.get(j.job_id)) for j in jobs if rng.random() > 0.25]
    arrived = [_job(next_id + n, rng, arrival_s=300.0) for n in range(rng.randrange(0, 8))]
    return kept + arrived


def test_planned_throughput_is_the_throughput_of_the_plan_run_builds() -> None:
    spread = rounds = 0
    for seed in range(10):
        rng = random.Random(seed)
        snapshot = make_cluster(rng.choice((2, 3, 4)))
        jobs = [_job(i, rng) for i in range(rng.randrange(8, 30))]
        next_id = 1000
        for _ in range(6):
            for sticky, keep_homes in ((False, False), (True, True), (True, False)):
                planned = TuneRound(jobs, snapshot, PACKED, sticky=sticky, keep_homes=keep_homes)
                value = planned.planned_throughput()
                built = TuneRound(jobs, snapshot, PACKED, sticky=sticky, keep_homes=keep_homes).run()
                assert value == built.throughput()  # the same float, summed in the same order
                spread += sum(1 for h in planned.held if held_speed(h) != h.speed)
                rounds += 1
            plan = TuneAllocator().allocate(jobs, snapshot)
            jobs = _next_round(rng, jobs, plan, next_id)
            next_id += 100
    assert rounds == 180
    assert spread > 0  # some jobs were spread over servers: their penalty summed as in the plan


def _round(snapshot: object, jobs: list[JobView], admitted: list[bool]) -> SimpleNamespace:
    return SimpleNamespace(snapshot=snapshot, jobs=jobs, infeasible=[None] * len(jobs), admitted=admitted)


def test_fresh_throughput_is_remembered_for_the_same_admitted_jobs_on_the_same_snapshot() -> None:
    worked_out: list[float] = []

    def work_out(value: float):  # type: ignore[no-untyped-def]
        return lambda: worked_out.append(value) or value

    memo = FreshThroughputs()
    snapshot = make_cluster(2)
    jobs = [make_job(1, "res18"), make_job(2, "bert", gpus=2), make_job(3, "vae")]
    assert memo.get(_round(snapshot, jobs, [True, True, False]), work_out(10.0)) == 10.0
    # The same admitted jobs (the third, not admitted, may change): remembered.
    other_third = [*jobs[:2], make_job(4, "alexnet")]
    assert memo.get(_round(snapshot, other_third, [True, True, False]), work_out(99.0)) == 10.0
    assert worked_out == [10.0]
    # Worked out again for another snapshot, even an equal one (a live round's), another demand,
    # another order or another admitted set.
    assert memo.get(_round(make_cluster(2), jobs, [True, True, False]), work_out(11.0)) == 11.0
    fixed = [dataclasses.replace(jobs[0], cpus_per_gpu_override=2.0), *jobs[1:]]
    assert memo.get(_round(snapshot, fixed, [True, True, False]), work_out(12.0)) == 12.0
    swapped = [jobs[1], jobs[0], jobs[2]]
    assert memo.get(_round(snapshot, swapped, [True, True, False]), work_out(13.0)) == 13.0
    assert memo.get(_round(snapshot, jobs, [True, True, True]), work_out(14.0)) == 14.0
    another_model = [dataclasses.replace(jobs[0], profile=make_job(1, "vae").profile), *jobs[1:]]
    assert memo.get(_round(snapshot, another_model, [True, True, True]), work_out(15.0)) == 15.0
    assert worked_out == [10.0, 11.0, 12.0, 13.0, 14.0, 15.0]


# In place of an allocator's FreshThroughputs: every fresh throughput worked out, as before tune_repack.py.
NEVER_REMEMBERS = SimpleNamespace(get=lambda sticky_round, work_out: work_out())


class PlainRepackTune(TuneAllocator):
    """Tune deciding its repack test as before tune_repack.py: every fresh plan built and never
    remembered."""

    class round_class(TuneRound):
        def planned_throughput(self) -> float:
            return self.run().throughput()

    def __init__(self) -> None:
        super().__init__()
        self._fresh = NEVER_REMEMBERS  # type: ignore[assignment]


def test_a_simulation_remembers_only_the_fresh_throughput_it_would_work_out_and_gives_the_same_results(
    monkeypatch,
) -> None:  # type: ignore[no-untyped-def]
    # Image-heavy jobs on a cluster short of cores: tune's sticky plans are rarely stable, so the
    # repack test runs in most decided rounds.
    trace = philly_derived_trace(400, jobs_per_hour=6.0, class_split=(50, 0, 50), multi_gpu=True, seed=3)
    cluster = ClusterSpec(servers=4, gpus_per_server=8, cpus_per_server=24, mem_gb_per_server=500.0)
    remembered = {"n": 0}
    get = FreshThroughputs.get

    def checking(self, sticky_round, work_out):  # type: ignore[no-untyped-def]
        calls = {"n": 0}

        def counted() -> float:
            calls["n"] += 1
            return work_out()

        value = get(self, sticky_round, counted)
        if not calls["n"]:
            remembered["n"] += 1
            assert value == work_out()  # the round's own fresh plan has that throughput
        return value

    monkeypatch.setattr(FreshThroughputs, "get", checking)
    for policy in ("fifo", "srtf"):
        new = simulate(trace, cluster, policy=policy, allocator=TuneAllocator(), finish_at_round_end=True)
        old = simulate(trace, cluster, policy=policy, allocator=PlainRepackTune(), finish_at_round_end=True)
        assert new.to_dict() | {"wall_s": 0} == old.to_dict() | {"wall_s": 0}
    assert remembered["n"] > 20  # rounds whose fresh throughput was the one remembered


def test_a_pickled_tune_leaves_its_memory_out_and_one_pickled_without_it_gets_one() -> None:
    allocator = TuneAllocator()
    allocator._fresh.get(_round(make_cluster(1), [make_job(1)], [True]), lambda: 3.0)
    copy = pickle.loads(pickle.dumps(allocator))
    assert copy._fresh._last is None and copy.repack_gain == allocator.repack_gain
    state = dict(allocator.__dict__)
    del state["_fresh"]  # as a forecast pickled before the memory existed holds it
    old = TuneAllocator.__new__(TuneAllocator)
    old.__setstate__(state)
    assert old._fresh._last is None


class PlainPolicyOrderTune(PolicyOrderTune):
    """The bench's policy-order tune with every fresh throughput worked out."""

    def __init__(self) -> None:
        super().__init__()
        self._fresh = NEVER_REMEMBERS  # type: ignore[assignment]


def test_a_round_class_with_its_own_run_has_its_fresh_throughput_worked_out_every_time() -> None:
    # The bench's policy-order tune claims current placements in its fresh plan too: remembering
    # its throughput changed the static trace's makespan (10.89 h became 10.85 h).
    trace = read_trace(DEFAULT_DATA_DIR / STATIC_TRACE)
    remembering = simulate(trace, TESTBED, policy="fifo", allocator=PolicyOrderTune())
    plain = simulate(trace, TESTBED, policy="fifo", allocator=PlainPolicyOrderTune())
    assert remembering.to_dict() | {"wall_s": 0} == plain.to_dict() | {"wall_s": 0}
    assert round(remembering.makespan_h, 2) == 10.89  # docs/reproduction-synergy-run.md, section a
