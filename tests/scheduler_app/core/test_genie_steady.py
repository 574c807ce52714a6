"""GENIE's steady round told without the search (allocators/genie_steady.py): the full round's plan."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler_app.core.allocators.genie import GenieAllocator, GenieRound
from scheduler_app.core.allocators.genie_steady import steady_plan
from scheduler_app.core.types import ClusterSnapshot, JobView, RoundPlan
from tests.builders import make_cluster, make_job

MODELS = ("alexnet", "bert", "deepspeech", "gnmt", "lstm", "m5", "mobilenet", "res18", "res50", "shufflenet")


def _full(jobs: Sequence[JobView], snapshot: ClusterSnapshot) -> RoundPlan:
    return GenieRound(jobs, snapshot, 0.0, 0.8, True).run()


def _running(jobs: Sequence[JobView], plan: RoundPlan) -> list[JobView]:
    """The jobs one round later, each on the very Placement `plan` gave it (None where it waits)."""
    where = plan.placements()
    return [dataclasses.replace(j, current=where.get(j.job_id), done_iters=j.done_iters + 10.0) for j in jobs]


def test_jobs_at_their_best_case_are_kept_in_any_order_as_the_full_round_keeps_them() -> None:
    snapshot = make_cluster(2)
    jobs = [make_job(1, "res18"), make_job(2, "alexnet", gpus=2), make_job(3, "lstm")]
    first = _full(jobs, snapshot)
    assert steady_plan(jobs, snapshot) is None  # nobody runs yet: decided
    assert [d.reason for d in first.decisions] == ["best_case"] * 3
    running = _running(jobs, first)
    for order in (running, running[::-1], [running[1], running[2], running[0]]):
        steady = steady_plan(order, snapshot)
        assert steady is not None and steady.stable
        assert steady == _full(order, snapshot)
        # Kept as they ran: their own Placements.
        assert all(d.placement is j.current for d, j in zip(steady.decisions, order, strict=True))


def test_what_the_search_would_read_sends_the_round_to_it() -> None:
    snapshot = make_cluster(1)
    jobs = [make_job(1, "res18"), make_job(2, "alexnet")]
    running = _running(jobs, _full(jobs, snapshot))
    assert steady_plan(running, snapshot) is not None
    # A deadline (progress and the clock), a job without a placement, a fixed demand, GPU choices.
    assert steady_plan([dataclasses.replace(running[0], deadline_s=9e9), running[1]], snapshot) is None
    assert steady_plan([*running, make_job(3, "res18")], snapshot) is None
    assert (
        steady_plan([dataclasses.replace(running[0], cpus_per_gpu_override=1.0), running[1]], snapshot)
        is None
    )
    assert steady_plan([dataclasses.replace(running[0], gpu_choices=(1, 2)), running[1]], snapshot) is None
    # A placement on a server the snapshot lacks, or two jobs on one GPU.
    assert steady_plan(running, make_cluster([])) is None
    clash = dataclasses.replace(running[1], current=dataclasses.replace(running[0].current, job_id=2))
    assert steady_plan([running[0], clash], snapshot) is None
    # The same server with fewer cores than its jobs hold (its capacity changed): the search decides.
    smaller = make_cluster(1, cpus=8)
    assert steady_plan(running, smaller) is None
    assert _full(running, smaller) != _full(running, snapshot)


def test_an_order_in_which_a_best_case_would_starve_the_jobs_after_it_is_decided() -> None:
    """Everyone at its best case in one order; in another, gnmt's best case (above its proportional
    share) would leave the 1-GPU job after it less than its share: the full round gives gnmt its
    share, then the leftover pass grows it. steady_plan must not answer that round."""
    snapshot = make_cluster(1, cpus=16)
    jobs = [make_job(1, "bert"), make_job(2, "gnmt", gpus=4), make_job(3, "res18")]
    first = _full(jobs, snapshot)
    assert [d.reason for d in first.decisions] == ["best_case"] * 3
    running = _running(jobs, first)
    assert steady_plan(running, snapshot) == _full(running, snapshot)
    order = [running[0], running[2], running[1]]
    full = _full(order, snapshot)
    assert [d.reason for d in full.decisions] != ["best_case"] * 3
    assert steady_plan(order, snapshot) is None


def test_allocator_answers_a_steady_round_as_keyed() -> None:
    snapshot = make_cluster(2)
    jobs = [make_job(1, "res50", gpus=4), make_job(2, "mobilenet")]
    running = _running(jobs, GenieAllocator().allocate_at(jobs, snapshot, 0.0))
    plan, keyed = GenieAllocator().allocate_keyed(running[::-1], snapshot, 600.0)
    assert keyed and plan.stable and plan == _full(running[::-1], snapshot)


@st.composite
def _rounds(draw: st.DrawFn) -> tuple[ClusterSnapshot, list[JobView], list[int], list[int]]:
    servers = draw(st.integers(1, 3))
    cpus = draw(st.sampled_from((8, 12, 16, 24, 32)))  # tight ones: where the order matters
    snapshot = make_cluster(servers, cpus=cpus, mem_gb=draw(st.sampled_from((128.0, 500.0))))
    count = draw(st.integers(1, 10))
    jobs = [
        make_job(
            i + 1,
            draw(st.sampled_from(MODELS)),
            gpus=draw(st.sampled_from((1, 1, 2, 4, 8))),
            done_iters=float(draw(st.integers(0, 900))),
        )
        for i in range(count)
    ]
    first = draw(st.permutations(range(count)))
    second = draw(st.permutations(range(count)))
    return snapshot, jobs, list(first), list(second)


@settings(max_examples=300, deadline=None)
@given(_rounds())
def test_a_steady_plan_is_always_the_full_rounds(
    case: tuple[ClusterSnapshot, list[JobView], list[int], list[int]],
) -> None:
    """Decide a round in one order, run each job where it was placed, then decide the next round in
    another order: wherever steady_plan answers, the full round gives exactly that plan; and it
    answers whenever the full round kept everyone at its best case in an order-free way it checks."""
    snapshot, jobs, first, second = case
    plan = _full([jobs[i] for i in first], snapshot)
    running = _running(jobs, plan)
    # Twice: the second round from placements the first round's kept plan left (claims, floors).
    for order in (first, second):
        ordered = [running[i] for i in order]
        full = _full(ordered, snapshot)
        steady = steady_plan(ordered, snapshot)
        if steady is not None:
            assert steady == full and steady.stable and full.stable
            assert all(d.reason == "best_case" for d in full.decisions)
        running = _running(running, full)


def test_the_kept_jobs_memo_pins_at_most_two_snapshots_and_still_answers() -> None:
    """kept_job's memo serves one snapshot per entry: a live service's new snapshot every round must
    not leave ended placements' entries pinning old ones (genie_kept.KEPT_SNAPSHOTS_MAX)."""
    from scheduler_app.core.allocators.genie_kept import KEPT_ENTRIES, KEPT_SNAPSHOTS_MAX, kept_job
    from scheduler_app.core.throughput import cluster_shape

    first = make_cluster(2)
    jobs = [make_job(1, "res18"), make_job(2, "alexnet", gpus=2), make_job(3, "lstm")]
    running = _running(jobs, _full(jobs, first))
    snapshots = [first] + [make_cluster(2) for _ in range(4)]  # equal servers, other objects: new rounds
    for snapshot in snapshots:
        shape = cluster_shape(snapshot)
        # Every round the jobs hold Placements of their own (as jobs that ended and others that started
        # on the same GPUs would): the last round's entries are never asked for again.
        running = [dataclasses.replace(j, current=dataclasses.replace(j.current)) for j in running]
        kept = [kept_job(job, snapshot, shape) for job in running]
        assert all(k is not None for k in kept)  # each at its best case, kept on every snapshot
        assert [kept_job(job, snapshot, shape) for job in running] == kept  # the memo's answers
        pinned = {id(entry[1]) for entry in KEPT_ENTRIES.values()}
        assert id(snapshot) in pinned and len(pinned) <= KEPT_SNAPSHOTS_MAX
    assert all(entry[1] is not first for entry in KEPT_ENTRIES.values())
