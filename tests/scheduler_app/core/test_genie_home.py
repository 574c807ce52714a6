"""GENIE's lean path for running jobs kept at home (allocators/genie_home.py): the same plan as the search."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler_app.core.allocators import genie
from scheduler_app.core.allocators.genie import GenieRound
from scheduler_app.core.types import ClusterSnapshot, JobView, RoundPlan
from tests.builders import make_cluster, make_job

MODELS = ("alexnet", "bert", "deepspeech", "gnmt", "lstm", "m5", "mobilenet", "res18", "res50", "shufflenet")


def _decide_each(genie_round: GenieRound) -> None:
    """GenieRound.run's walk as it was before the lean path: `decide` for every feasible job."""
    jobs, likely = genie_round.jobs, genie_round.admitted
    genie_round.later_gpus = sum(job.num_gpus for pos, job in enumerate(jobs) if likely[pos])
    for pos, job in enumerate(jobs):
        if likely[pos]:
            genie_round.later_gpus -= job.num_gpus
        why = genie_round.infeasible[pos]
        if why is not None:
            genie_round.builder.infeasible(pos, why)
        else:
            genie_round.decide(pos, job)


def _decide(
    jobs: Sequence[JobView], snapshot: ClusterSnapshot, *, lean: bool, now_s: float = 0.0
) -> RoundPlan:
    if lean:
        return GenieRound(jobs, snapshot, now_s, 0.8, True).run()
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(genie, "decide_jobs", _decide_each)
        return GenieRound(jobs, snapshot, now_s, 0.8, True).run()


def _same(a: RoundPlan, b: RoundPlan) -> bool:
    """Equal plans whose placements are the same objects where one keeps a job's own (a simulator
    reads that identity as the lease continuing)."""
    return a == b and all(
        (x.placement is None) == (y.placement is None)
        and (x.placement is y.placement or x.placement == y.placement)
        for x, y in zip(a.decisions, b.decisions, strict=True)
    )


def _next(jobs: Sequence[JobView], plan: RoundPlan) -> list[JobView]:
    where = plan.placements()
    return [dataclasses.replace(j, current=where.get(j.job_id), done_iters=j.done_iters + 10.0) for j in jobs]


def test_running_jobs_go_home_and_a_newcomer_is_searched_as_before() -> None:
    snapshot = make_cluster(2)
    jobs = [make_job(1, "res18"), make_job(2, "alexnet", gpus=2), make_job(3, "lstm", gpus=4)]
    running = _next(jobs, _decide(jobs, snapshot, lean=True))
    newcomer = make_job(4, "res50", gpus=2)
    for order in ([*running, newcomer], [newcomer, *running[::-1]]):
        lean, full = _decide(order, snapshot, lean=True), _decide(order, snapshot, lean=False)
        assert _same(lean, full)
        kept = [d for d, j in zip(lean.decisions, order, strict=True) if d.placement is j.current]
        assert len(kept) == 3


@st.composite
def _rounds(draw: st.DrawFn) -> tuple[ClusterSnapshot, list[JobView], list[list[int]]]:
    servers = draw(st.integers(1, 3))
    cpus = draw(st.sampled_from((8, 12, 16, 24, 32)))  # tight ones: where the order matters
    snapshot = make_cluster(servers, cpus=cpus, mem_gb=draw(st.sampled_from((128.0, 500.0))))
    count = draw(st.integers(2, 12))
    jobs = []
    for i in range(count):
        qos = draw(st.sampled_from(("none", "none", "none", "deadline", "fixed")))
        jobs.append(
            make_job(
                i + 1,
                draw(st.sampled_from(MODELS)),
                gpus=draw(st.sampled_from((1, 1, 2, 4, 8))),
                done_iters=float(draw(st.integers(0, 900))),
                deadline_s=float(draw(st.integers(600, 90_000))) if qos == "deadline" else None,
                cpus_per_gpu=2.0 if qos == "fixed" else None,
            )
        )
    orders = [list(draw(st.permutations(range(count)))) for _ in range(3)]
    return snapshot, jobs, orders


@settings(max_examples=300, deadline=None)
@given(_rounds())
def test_rounds_with_arrivals_are_decided_as_the_search_decides_them(
    case: tuple[ClusterSnapshot, list[JobView], list[list[int]]],
) -> None:
    """Jobs arrive over three rounds in random orders (deadlines, fixed demands, tight servers, jobs
    that wait): every round's plan with the lean path is the search's, placement identity included."""
    snapshot, jobs, orders = case
    third = max(1, len(jobs) // 3)
    present: list[JobView] = []
    for r, order in enumerate(orders):
        arrived = {j.job_id for j in jobs[: third * (r + 1)]}
        by_id = {j.job_id: j for j in present}
        present = [by_id.get(jobs[i].job_id, jobs[i]) for i in order if jobs[i].job_id in arrived]
        lean = _decide(present, snapshot, lean=True, now_s=300.0 * r)
        full = _decide(present, snapshot, lean=False, now_s=300.0 * r)
        assert _same(lean, full)
        present = _next(present, full)
