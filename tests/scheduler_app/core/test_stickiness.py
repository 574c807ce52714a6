"""Placement stickiness on literal clusters: running jobs keep their GPUs, newcomers go around them."""

from __future__ import annotations

import dataclasses

import pytest

from bench.moves_per_round import round_changes
from scheduler_app.core import reasons
from scheduler_app.core.allocators import ALLOCATORS
from scheduler_app.core.allocators.proportional import ProportionalAllocator
from scheduler_app.core.allocators.tune import TuneAllocator
from scheduler_app.core.placement import FIRST_FIT, PACKED, RoundState
from scheduler_app.core.types import JobView, Placement, RoundPlan, ServerShare
from tests.builders import make_cluster, make_job, make_server
from tests.scheduler_app.core.helpers import outcomes, shares


def again(jobs: list[JobView], plan: RoundPlan) -> list[JobView]:
    """The same jobs one round later, each holding (as `current`) what `plan` gave it."""
    placements = plan.placements()
    return [dataclasses.replace(j, current=placements.get(j.job_id)) for j in jobs]


def held(job_id: int, *shares_: tuple[int, tuple[int, ...], int, float]) -> Placement:
    return Placement(job_id, tuple(ServerShare(*s) for s in shares_), 1.0)


# -- an incumbent keeps its GPUs when a newcomer arrives ---------------------------------------
def test_first_fit_newcomer_ahead_in_order_leaves_the_incumbent_its_gpu():
    cluster = make_cluster(2)
    first = ProportionalAllocator().allocate([make_job(1)], cluster)
    (a,) = again([make_job(1)], first)
    assert a.current is not None and shares(first.decisions[0]) == [(0, (0,), 3, 62.5)]
    newcomer = make_job(2)
    plan = ProportionalAllocator().allocate([newcomer, a], cluster)
    assert plan.decision_for(1).placement.same_resources(a.current)
    assert shares(plan.decision_for(2)) == [(0, (1,), 3, 62.5)]  # the next GPU, same server
    # Without stickiness first fit hands the newcomer the incumbent's GPU and moves the incumbent.
    plain = ProportionalAllocator().allocate([newcomer, make_job(1)], cluster)
    assert shares(plain.decision_for(2)) == [(0, (0,), 3, 62.5)]


def test_tune_newcomer_sorted_first_leaves_the_incumbent_its_gpu_and_cores():
    # res18 (best case 9 cores) ran alone on s0 GPU 0. alexnet (12 cores) arrives and is placed
    # first (tune with order="demand" sorts by CPU demand): it goes beside res18, not onto its GPU.
    cluster = make_cluster(2)
    first = TuneAllocator(order="demand").allocate([make_job(1, "res18")], cluster)
    assert shares(first.decisions[0]) == [(0, (0,), 9, 62.5)]
    (res18,) = again([make_job(1, "res18")], first)
    plan = TuneAllocator(order="demand").allocate([res18, make_job(2, "alexnet")], cluster)
    assert outcomes(plan) == [(1, "placed", "best_case"), (2, "placed", "best_case")]
    assert plan.decision_for(1).placement.same_resources(res18.current)
    assert shares(plan.decision_for(2)) == [(0, (1,), 12, 125.0)]
    plain = TuneAllocator(order="demand").allocate([make_job(1, "res18"), make_job(2, "alexnet")], cluster)
    assert shares(plain.decision_for(2)) == [(0, (0,), 12, 125.0)]


# -- after another job finishes the remaining jobs stay put ------------------------------------
@pytest.mark.parametrize("name", ["proportional", "greedy", "tune", "tune_matrix", "opt"])
def test_jobs_stay_put_when_another_finishes(name):
    # Every best case fits (s0: 8 + 1 + 6 + 12 = 27 cores would not, so they spread over two
    # servers); when job 1 finishes nobody's demand changes and nobody moves.
    allocator = ALLOCATORS.get(name)()
    cluster = make_cluster(2)
    jobs = [
        make_job(1, "res50", gpus=2),
        make_job(2, "bert"),
        make_job(3, "mobilenet"),
        make_job(4, "res50", gpus=3),
        make_job(5, "bert", gpus=2),
    ]
    first = allocator.allocate(jobs, cluster)
    assert set(first.placements()) == {1, 2, 3, 4, 5}
    rest = again(jobs, first)[1:]
    plan = allocator.allocate(rest, cluster)
    for job in rest:
        assert plan.decision_for(job.job_id).placement.same_resources(job.current), job.job_id


def test_without_stickiness_first_fit_would_shift_everyone_down():
    # The behaviour the previous test guards against: plain first fit re-packs from GPU 0.
    jobs = [make_job(1), make_job(2), make_job(3)]
    cluster = make_cluster(1)
    first = ProportionalAllocator().allocate(jobs, cluster)
    plain = ProportionalAllocator().allocate(jobs[1:], cluster)
    sticky = ProportionalAllocator().allocate(again(jobs, first)[1:], cluster)
    assert [shares(d)[0][1] for d in first.decisions] == [(0,), (1,), (2,)]
    assert [shares(d)[0][1] for d in plain.decisions] == [(0,), (1,)]
    assert [shares(d)[0][1] for d in sticky.decisions] == [(1,), (2,)]


# -- a newcomer takes unclaimed GPUs -----------------------------------------------------------
def test_first_fit_newcomer_takes_the_unclaimed_gpus():
    cluster = make_cluster(2)
    incumbent = make_job(1, gpus=4, current=held(1, (0, (0, 1, 2, 3), 12, 250.0)))
    plan = ProportionalAllocator().allocate([make_job(2, gpus=2), incumbent], cluster)
    assert shares(plan.decision_for(2)) == [(0, (4, 5), 6, 125.0)]  # first fit, around the claim
    assert plan.decision_for(1).placement.same_resources(incumbent.current)


def test_packed_whole_placement_avoids_a_server_with_a_claimed_gpu():
    # Both servers have 8 free GPUs; packed takes the lowest position, s0, unless s0's GPU 0 is held.
    cluster = make_cluster(2)
    incumbent = make_job(1, "bert", current=held(1, (0, (0,), 1, 20.0)))
    big = make_job(2, "bert", gpus=8)
    plan = TuneAllocator().allocate([incumbent, big], cluster)
    assert shares(plan.decision_for(2)) == [(1, tuple(range(8)), 8, 160.0)]
    assert plan.decision_for(1).placement.same_resources(incumbent.current)
    plain = TuneAllocator().allocate([make_job(1, "bert"), big], cluster)
    assert shares(plain.decision_for(2)) == [(0, tuple(range(8)), 8, 160.0)]


def test_newcomer_avoids_cores_incumbents_reserved():
    # s0: alexnet holds GPU 0 with 12 cores, res18 GPU 1 with 9: 3 of s0's 24 cores are unreserved.
    # s1 has 7 free GPUs. Packed wants the fewest free GPUs, s0 (6 unclaimed), and an alexnet
    # newcomer (12 cores), placed first, would fit there in the free cores; the reservations send
    # it to s1 instead, so both incumbents keep their cores as well as their GPUs.
    cluster = make_cluster([make_server(server_id=0), make_server(server_id=1, free_gpus=range(7))])
    a = make_job(1, "alexnet", current=held(1, (0, (0,), 12, 125.0)))
    b = make_job(2, "res18", current=held(2, (0, (1,), 9, 62.5)))
    plan = TuneAllocator().allocate([make_job(3, "alexnet"), a, b], cluster)
    assert [d.reason for d in plan.decisions] == ["best_case"] * 3
    assert shares(plan.decision_for(3)) == [(1, (0,), 12, 125.0)]
    assert plan.decision_for(1).placement.same_resources(a.current)
    assert plan.decision_for(2).placement.same_resources(b.current)


# -- a job whose demand changes still stays on its server --------------------------------------
def test_tune_job_downgraded_to_proportional_keeps_its_gpu():
    # Round 1: alexnet alone, best case (12 cores) on GPU 0. Round 2: two alexnets placed ahead of
    # it take the other 12 + 12 cores; its best case fits nowhere, its proportional share does not
    # either, so tune takes surplus back, on its own server, and it stays on GPU 0 at 3 cores.
    cluster = make_cluster(1)
    first = TuneAllocator().allocate([make_job(1, "alexnet")], cluster)
    (a,) = again([make_job(1, "alexnet")], first)
    assert shares(first.decisions[0]) == [(0, (0,), 12, 125.0)]
    plan = TuneAllocator().allocate([make_job(2, "alexnet"), make_job(3, "alexnet"), a], cluster)
    assert outcomes(plan) == [
        (2, "placed", "reverted_to_proportional"),
        (3, "placed", "best_case"),
        (1, "placed", "proportional"),
    ]
    assert shares(plan.decision_for(1)) == [(0, (0,), 3, 62.5)]


def test_tune_job_upgraded_to_its_best_case_keeps_its_gpu():
    # Round 1 is crowded: res18 runs at proportional on GPU 2. Round 2 the others are gone and its
    # best case (9 cores) fits on its own GPU.
    cluster = make_cluster(1)
    jobs = [make_job(1, "alexnet"), make_job(2, "alexnet"), make_job(3, "res18")]
    first = TuneAllocator().allocate(jobs, cluster)
    assert shares(first.decision_for(3)) == [(0, (2,), 3, 62.5)]
    (res18,) = again(jobs, first)[2:]
    plan = TuneAllocator().allocate([res18], cluster)
    assert outcomes(plan) == [(3, "placed", "best_case")]
    assert shares(plan.decisions[0]) == [(0, (2,), 9, 62.5)]


def test_tune_job_at_proportional_stays_rather_than_moving_for_its_best_case():
    # res18 held GPU 0 of s0 at proportional (3 cores) beside seven neighbours that hold and need
    # the other 21 cores (a fixed demand of 3 per GPU); s1 is empty. Its best case (9 cores) fits
    # only on s1. Moving there would be a restart for a faster operating point: the sticky plan
    # keeps it on GPU 0 at proportional, and its neighbours where they are (before, it moved, and
    # on a full cluster the job whose cores it took did too). Here that costs the round more than
    # 5 % of its throughput (repack_gain), so by default res18 does move for its best case, alone:
    # the re-packed plan, no faster, would move two neighbours to s1 as well.
    cluster = make_cluster(2)
    res18 = make_job(1, "res18", current=held(1, (0, (0,), 3, 62.5)))
    neighbours = [make_job(j, cpus_per_gpu=3.0, current=held(j, (0, (j - 1,), 3, 62.5))) for j in range(2, 9)]
    plan = TuneAllocator(repack_gain=None).allocate([res18, *neighbours], cluster)
    assert outcomes(plan)[0] == (1, "placed", "proportional")
    for job in (res18, *neighbours):
        assert plan.decision_for(job.job_id).placement.same_resources(job.current), job.job_id
    default = TuneAllocator().allocate([res18, *neighbours], cluster)
    assert shares(default.decision_for(1)) == [(1, (0,), 9, 62.5)]
    for job in neighbours:
        assert default.decision_for(job.job_id).placement.same_resources(job.current), job.job_id


@pytest.mark.parametrize("allocator", ["tune", "tune_matrix"])
def test_jobs_ending_move_few_running_jobs_on_a_full_cluster(allocator):
    # 100 full servers (the fleet bench's job mix), 10 jobs ending per round: the jobs they free
    # room for start and almost every running job stays where it is. Before `keep_home`, tune moved
    # 64 to 69 running jobs to other servers per round here, tune_matrix 28 to 49 (and at 1,000
    # servers 310 to 564 and 61 to 172: `python -m bench.moves_per_round`).
    moved = [c.moved for c in round_changes(allocator, servers=100, rounds=4, ending=10)]
    assert max(moved) <= 10, moved


def test_job_whose_home_cannot_hold_its_new_demand_moves_around_other_incumbents():
    # Each of the two s0 incumbents held 6 cores on 1 GPU; a fixed demand of 20 cores per GPU for
    # job 1 cannot stay on s0, so it goes to s1, and not onto the GPU job 3 holds there.
    cluster = make_cluster(2)
    mover = make_job(1, cpus_per_gpu=20.0, current=held(1, (0, (0,), 6, 62.5)))
    neighbour = make_job(2, cpus_per_gpu=6.0, current=held(2, (0, (1,), 6, 62.5)))
    other = make_job(3, current=held(3, (1, (0,), 3, 62.5)))
    hog = make_job(4, cpus_per_gpu=12.0, current=held(4, (0, (2,), 12, 62.5)))
    plan = ProportionalAllocator().allocate([mover, neighbour, other, hog], cluster)
    assert shares(plan.decision_for(1)) == [(1, (1,), 20, 62.5)]
    for job in (neighbour, other, hog):
        assert plan.decision_for(job.job_id).placement.same_resources(job.current)


# -- the placement layer ------------------------------------------------------------------------
def test_invalid_current_placements_claim_nothing():
    cluster = make_cluster([make_server(server_id=0, free_gpus=(1, 2, 3))])
    state = RoundState(cluster)
    state.claim_current(
        [
            make_job(1, current=held(1, (9, (0,), 3, 62.5))),  # unknown server
            make_job(2, current=held(2, (0, (0,), 3, 62.5))),  # GPU 0 is busy
            make_job(3, gpus=2, current=held(3, (0, (1,), 3, 62.5))),  # one GPU for a 2-GPU job
            make_job(4, current=held(4, (0, (2,), 3, 62.5))),
            make_job(5, current=held(5, (0, (2,), 3, 62.5))),  # GPU 2 already claimed by job 4
        ]
    )
    assert [state.home_servers(j) for j in (1, 2, 3, 4, 5)] == [None, None, None, [(0, 1)], None]
    assert (state.num_unclaimed, state.reserved_cpus) == ([2], [3.0])


def test_take_order_own_then_unclaimed_then_claimed_and_a_victim_drops_all_its_claims():
    cluster = make_cluster(2)
    state = RoundState(cluster)
    state.claim_current(
        [
            make_job(1, gpus=2, current=held(1, (0, (0, 1), 6, 125.0))),
            make_job(2, gpus=2, current=held(2, (0, (2,), 3, 62.5), (1, (0,), 3, 62.5))),
        ]
    )
    c, m = state.uniform(3.0), state.uniform(62.5)
    # A 7-GPU newcomer on s0: the 5 unclaimed GPUs, then the lowest claimed ones (job 1's).
    (share,) = state.take([(0, 7)], c, m)
    assert share.gpu_indices == (0, 1, 3, 4, 5, 6, 7)
    assert state.home_servers(1) is None
    assert state.home_servers(2) == [(0, 1), (1, 1)]
    assert (state.num_unclaimed, state.reserved_cpus) == ([0, 7], [3.0, 3.0])
    # One more GPU on s0 can only be job 2's: job 2 then also stops holding s1's GPU 0.
    (share,) = state.take([(0, 1)], c, m)
    assert share.gpu_indices == (2,)
    assert (state.num_unclaimed, state.reserved_cpus) == ([0, 8], [0.0, 0.0])
    assert state.home_servers(2) is None  # no unclaimed GPU left on s0 for it
    # A GPU taken on s1 for job 2 is still its old one there.
    (share,) = state.take([(1, 1)], c, m, owner=2)
    assert share.gpu_indices == (0,)


def test_find_tries_home_then_unclaimed_room_then_the_plain_rule():
    cluster = make_cluster(2, gpus=2, cpus=6, mem_gb=125.0)
    state = RoundState(cluster)
    state.claim_current([make_job(1, gpus=2, current=held(1, (1, (0, 1), 6, 125.0)))])
    c, m = state.uniform(3.0), state.uniform(62.5)
    assert state.find(FIRST_FIT, 2, c, m, owner=1) == [(1, 2)]  # home, though s0 comes first
    assert state.find(PACKED, 2, c, m) == [(0, 2)]  # a newcomer: the unclaimed server
    state.take([(0, 2)], c, m)
    assert state.find(PACKED, 2, c, m) == [(1, 2)]  # nothing unclaimed is left: the plain rule
    assert state.find_packed(2, c, m) == [(1, 2)]


def test_same_plan_for_the_same_inputs_with_current_placements():
    cluster = make_cluster(2)
    jobs = [make_job(i, "res18" if i % 2 else "alexnet", gpus=1 + i % 3) for i in range(1, 8)]
    first = TuneAllocator().allocate(jobs, cluster)
    later = [*again(jobs, first)[2:], make_job(9, "m5", gpus=2)]
    assert TuneAllocator().allocate(later, cluster) == TuneAllocator().allocate(list(later), cluster)
    assert reasons.BEST_CASE in {d.reason for d in first.decisions}


def test_tune_gives_a_job_kept_as_it_ran_its_current_placement_itself():
    # A job kept on the same GPUs, cores, memory and speed gets its current Placement object back
    # (equal to a new one, cheaper, and the simulator sees its lease continue at once); a job whose
    # cores change gets a new one.
    allocator = TuneAllocator()
    cluster = make_cluster(1)
    jobs = [make_job(1, "alexnet"), make_job(2, "alexnet"), make_job(3, "res18")]
    kept = again(jobs, allocator.allocate(jobs, cluster))
    plan = allocator.allocate(kept, cluster)
    same = [job.job_id for job in kept if plan.decision_for(job.job_id).placement is job.current]
    assert same == [1, 2]
    # res18 ran at proportional beside two alexnets; now its best case fits: more cores, same GPU.
    assert plan.decision_for(3).placement != kept[2].current
    assert shares(plan.decision_for(3)) == [(0, (2,), 9, 62.5)]
    steady = again(kept, plan)
    again_plan = allocator.allocate(steady, cluster)
    assert all(again_plan.decision_for(j.job_id).placement is j.current for j in steady)
