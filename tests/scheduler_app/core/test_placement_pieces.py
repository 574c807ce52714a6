"""The placement package's pieces one by one: stages, filters, scores, the walk and the shared set-up."""

from __future__ import annotations

import random

import pytest

from scheduler_app.core import reasons
from scheduler_app.core.placement import (
    ANYWHERE,
    FIRST_FIT,
    HOME,
    HOME_LENIENT,
    PACKED,
    SCORES,
    STAGES,
    UNCLAIMED,
    UNRESERVED,
    MinServerGpus,
    OnServers,
    RoundState,
    gpus_fitting,
    score_named,
)
from scheduler_app.core.placement.filters import allowed_servers, restrict
from scheduler_app.core.placement.scores import OrderedScore, fill
from scheduler_app.core.placement.setup import RoundSetup
from scheduler_app.core.placement.stages import STAGES_WITHOUT_CLAIMS, View
from scheduler_app.core.types import Placement, ServerShare
from tests.builders import make_cluster, make_job, make_server


def held(job_id: int, *shares_: tuple[int, tuple[int, ...], int, float]) -> Placement:
    return Placement(job_id, tuple(ServerShare(*s) for s in shares_), 1.0)


def view_of(counts: list[int], cpus: list[float], mem_gb: list[float], prefer: list[int] | None = None):
    buckets: list[list[int]] = [[] for _ in range(max(counts) + 1)]
    for i, n in enumerate(counts):
        buckets[n].append(i)
    return View(buckets, counts, cpus, mem_gb, prefer)


# -- filters -----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("free", "c", "m", "expected"),
    [
        ((8, 24.0, 500.0), 3.0, 62.5, 8),  # the GPUs are the limit
        ((8, 7.0, 500.0), 3.0, 62.5, 2),  # cores: floor(7 / 3)
        ((8, 24.0, 100.0), 3.0, 62.5, 1),  # memory: floor(100 / 62.5)
        ((8, 0.0, 0.0), 0.0, 0.0, 8),  # a zero demand asks nothing of cores or memory
        ((8, 2.0, 500.0), 3.0, 62.5, 0),  # not even one GPU's share of cores
        ((3, 9.0 - 1e-9, 500.0), 3.0, 62.5, 3),  # within the tolerance
    ],
)
def test_gpus_fitting_is_the_tightest_of_gpus_cores_and_memory(free, c, m, expected):
    assert gpus_fitting(*free, c, m) == expected


def test_server_filters_allow_by_id_and_by_size():
    servers = [make_server(8, server_id=0), make_server(4, 12, 250, server_id=5), make_server(8, server_id=9)]
    assert allowed_servers(servers, [OnServers(frozenset({5, 9}))]) == [False, True, True]
    assert allowed_servers(servers, [MinServerGpus(8)]) == [True, False, True]
    assert allowed_servers(servers, [OnServers(frozenset({5, 9})), MinServerGpus(8)]) == [False, False, True]
    assert allowed_servers(servers, []) == [True, True, True]


def test_restrict_hides_refused_servers_from_counts_and_buckets():
    view = view_of([2, 3, 3], [6.0, 9.0, 9.0], [100.0, 100.0, 100.0])
    out = restrict(view, [True, False, True])
    assert out.counts == [2, 0, 3]
    assert out.buckets == [[1], [], [0], [2]]
    assert view.counts == [2, 3, 3]  # the state's own lists are never touched


def test_find_with_a_filter_places_only_on_allowed_servers():
    state = RoundState(make_cluster(3))
    c, m = state.uniform(3.0), state.uniform(62.5)
    assert state.find(FIRST_FIT, 2, c, m) == [(0, 2)]
    only_2 = [OnServers(frozenset({2}))]
    assert state.find(FIRST_FIT, 2, c, m, filters=only_2) == [(2, 2)]
    assert state.find(PACKED, 10, c, m, filters=only_2) is None  # one server of 8 GPUs
    assert state.find(PACKED, 10, c, m) == [(0, 8), (1, 2)]


def test_a_filtered_failure_is_not_remembered_for_unfiltered_searches():
    state = RoundState(make_cluster(2))
    only_0 = [OnServers(frozenset({0}))]
    assert state.find_uniform(PACKED, 12, 3.0, 62.5, filters=only_0) is None
    assert state.find_uniform(PACKED, 12, 3.0, 62.5) == [(0, 8), (1, 4)]


def test_a_filter_refusing_a_home_server_hides_the_home_too():
    state = RoundState(make_cluster(2, gpus=2, cpus=6, mem_gb=125.0))
    state.claim_current([make_job(1, gpus=2, current=held(1, (1, (0, 1), 6, 125.0)))])
    c, m = state.uniform(3.0), state.uniform(62.5)
    assert state.find(FIRST_FIT, 2, c, m, owner=1) == [(1, 2)]  # its home
    assert state.find(FIRST_FIT, 2, c, m, owner=1, filters=[OnServers(frozenset({0}))]) == [(0, 2)]


# -- scores ------------------------------------------------------------------------------------
def reference_fill(order, num_gpus, counts, dc, dm, cpus, mem_gb):
    """fill, written with filters.gpus_fitting: the inlined hot loop must agree with it."""
    plan, need = [], num_gpus
    for i in order:
        k = gpus_fitting(counts[i], cpus[i], mem_gb[i], dc[i], dm[i])
        if k > 0:
            plan.append((i, min(k, need)))
            need -= min(k, need)
            if need == 0:
                return plan
    return None


def test_fill_agrees_with_gpus_fitting_on_random_servers():
    rng = random.Random(35)
    for _ in range(500):
        n = rng.randint(1, 6)
        counts = [rng.randint(0, 8) for _ in range(n)]
        cpus = [rng.uniform(0, 24) for _ in range(n)]
        mem_gb = [rng.uniform(0, 500) for _ in range(n)]
        dc = [rng.choice([0.0, 1.5, 3.0, 4.8]) for _ in range(n)]
        dm = [rng.choice([0.0, 31.25, 62.5]) for _ in range(n)]
        order = rng.sample(range(n), n)
        num_gpus = rng.randint(1, 12)
        expected = reference_fill(order, num_gpus, counts, dc, dm, cpus, mem_gb)
        assert fill(order, num_gpus, counts, dc, dm, cpus, mem_gb) == expected


def test_packed_orders_by_fewest_usable_gpus_then_position():
    view = view_of([4, 1, 0, 4, 2], [24.0] * 5, [500.0] * 5)
    assert list(PACKED.order(view, 1)) == [1, 4, 0, 3]
    assert list(PACKED.order(view, 2)) == [4, 0, 3]
    assert list(FIRST_FIT.order(view, 1)) == [0, 1, 2, 3, 4]


def test_packed_whole_takes_the_fullest_server_that_holds_the_job():
    c, m = [3.0] * 3, [62.5] * 3
    view = view_of([4, 2, 3], [24.0, 24.0, 3.0], [500.0] * 3)
    # 2 GPUs: server 1, the one with the fewest usable GPUs that holds them.
    assert PACKED.whole(view, 2, c, m) == [(1, 2)]
    assert PACKED.whole(view, 3, c, m) == [(0, 3)]  # server 2 has 3 GPUs but cores for one
    assert PACKED.whole(view, 5, c, m) is None


def test_packed_whole_prefers_the_server_with_the_fewest_claimed_gpus_among_the_fullest():
    c, m = [3.0] * 3, [62.5] * 3
    # Servers 0 and 2 both have 4 usable GPUs; 3 of 0's and 1 of 2's are unclaimed.
    view = view_of([4, 0, 4], [24.0] * 3, [500.0] * 3, prefer=[3, 0, 1])
    assert PACKED.whole(view, 4, c, m) == [(0, 4)]
    assert PACKED.whole(view._replace(prefer=None), 4, c, m) == [(0, 4)]  # lowest position
    view = view_of([4, 0, 4], [24.0] * 3, [500.0] * 3, prefer=[1, 0, 4])
    assert PACKED.whole(view, 4, c, m) == [(2, 4)]  # unclaimed enough: no claimant moves


def test_packed_spreads_only_when_no_server_holds_the_job_whole():
    c, m = [3.0] * 3, [62.5] * 3
    view = view_of([3, 1, 2], [24.0] * 3, [500.0] * 3)
    assert PACKED.place(view, 2, c, m) == [(2, 2)]
    assert PACKED.place(view, 4, c, m) == [(1, 1), (2, 2), (0, 1)]  # fewest usable first
    assert FIRST_FIT.place(view, 4, c, m) == [(0, 3), (1, 1)]
    assert [p.__name__ for p in PACKED.phases(2)] == ["whole", "spread"]
    assert [p.__name__ for p in PACKED.phases(1)] == ["spread"]
    assert len(FIRST_FIT.phases(4)) == 1


def test_scores_are_chosen_by_name():
    assert score_named("packed") is PACKED and score_named("first_fit") is FIRST_FIT
    assert score_named(PACKED) is PACKED
    assert set(SCORES) == {"packed", "first_fit"}
    with pytest.raises(ValueError, match="placement"):
        score_named("random")


def test_a_new_score_is_a_new_piece():
    class LastFirst(OrderedScore):
        """Servers from the highest position down (say, a restart cost that favours the newest)."""

        name = "last_first"

        def order(self, view, min_gpus):
            return reversed(range(len(view.counts)))

    state = RoundState(make_cluster(3))
    c, m = state.uniform(3.0), state.uniform(62.5)
    assert state.find(LastFirst(), 10, c, m) == [(2, 8), (1, 2)]
    # Through the stages too, while a claim stands (server 2's GPUs 0-1 are job 1's).
    state.claim_current([make_job(1, gpus=2, current=held(1, (2, (0, 1), 6, 125.0)))])
    assert state.find(LastFirst(), 8, c, m) == [(2, 6), (1, 2)]  # unclaimed GPUs first
    assert state.find(LastFirst(), 2, c, m, owner=1) == [(2, 2)]  # the claimant: its home


# -- stages and the walk -----------------------------------------------------------------------
def test_the_stages_in_their_order():
    assert [s.name for s in STAGES] == ["home", "unreserved", "home_lenient", "unclaimed", "anywhere"]
    assert STAGES == (HOME, UNRESERVED, HOME_LENIENT, UNCLAIMED, ANYWHERE)
    assert [s.needs_claims for s in STAGES] == [False, True, False, True, False]
    assert [s.home for s in STAGES] == ["strict", None, "lenient", None, None]
    assert STAGES_WITHOUT_CLAIMS == (HOME, HOME_LENIENT, ANYWHERE)


def claimed_state() -> RoundState:
    """Two servers of 2 GPUs, 6 cores, 125 GB; job 1 claims server 1's GPUs, 6 cores and 125 GB."""
    state = RoundState(make_cluster(2, gpus=2, cpus=6, mem_gb=125.0))
    state.claim_current([make_job(1, gpus=2, current=held(1, (1, (0, 1), 6, 125.0)))])
    return state


def test_each_stage_views_the_capacity_it_names():
    state = claimed_state()
    assert state.view(UNRESERVED)[1:] == ([2, 0], [6.0, 0.0], [125.0, 0.0], None)
    assert state.view(UNCLAIMED)[1:] == ([2, 0], [6.0, 6.0], [125.0, 125.0], None)
    assert state.view(ANYWHERE)[1:] == ([2, 2], [6.0, 6.0], [125.0, 125.0], [2, 0])
    assert RoundState(make_cluster(2)).view(ANYWHERE).prefer is None  # no claims, no preference


def test_the_walk_tries_each_stage_in_order_and_each_phase_over_all_stages():
    state = claimed_state()
    seen: list[tuple[str, tuple[int, ...], tuple[float, ...]]] = []

    def phase(name):
        def run(view, num_gpus, dc, dm):
            seen.append((name, tuple(view.counts), tuple(view.cpus)))
            return None

        return run

    c, m = state.uniform(3.0), state.uniform(62.5)
    assert state.walk(None, 2, c, m, (phase("a"), phase("b"))) is None
    unreserved, unclaimed, anywhere = ((2, 0), (6.0, 0.0)), ((2, 0), (6.0, 6.0)), ((2, 2), (6.0, 6.0))
    assert seen == [(p, *v) for p in "ab" for v in (unreserved, unclaimed, anywhere)]
    # The owner is offered its home first, before any stage's view.
    seen.clear()
    assert state.walk(1, 2, c, m, (phase("a"),)) == [(1, 2)]
    assert seen == []


def test_without_claims_the_walk_is_the_plain_rule():
    state = RoundState(make_cluster(2))
    seen = []

    def phase(view, num_gpus, dc, dm):
        seen.append(view)
        return None

    state.walk(None, 1, state.uniform(3.0), state.uniform(62.5), (phase,))
    assert seen == [state.view(ANYWHERE)]


# -- the shared set-up ---------------------------------------------------------------------------
def test_round_setup_decides_infeasible_and_unadmitted_jobs_and_returns_the_admitted():
    cluster = make_cluster(1)
    jobs = [make_job(1, gpus=6), make_job(2, gpus=99), make_job(3, gpus=4), make_job(4, gpus=2)]
    setup = RoundSetup(jobs, cluster)
    assert setup.infeasible == [None, reasons.EXCEEDS_CLUSTER_GPUS, None, None]
    assert setup.admitted == [True, False, False, True]
    assert setup.admit() == [0, 3]
    setup.placed(0, setup.state.take([(0, 6)], setup.state.prop_cpus, setup.state.prop_mem_gb), 1.0, "x")
    setup.builder.pending(3, reasons.FRAGMENTED)
    plan = setup.builder.build()
    assert [d.outcome.value for d in plan.decisions] == ["placed", "infeasible", "pending", "pending"]
    assert plan.decision_for(3).reason == reasons.INSUFFICIENT_GPUS
    assert plan.decision_for(1).placement.shares[0].gpu_indices == (0, 1, 2, 3, 4, 5)


def test_round_setup_claims_the_admitted_and_remembers_the_others():
    cluster = make_cluster(1, gpus=2, cpus=6, mem_gb=125.0)
    first = make_job(1, gpus=2, current=held(1, (0, (0, 1), 6, 125.0)))
    later = make_job(2, gpus=2, current=held(2, (0, (0, 1), 6, 125.0)))
    setup = RoundSetup([first, later], cluster)
    setup.claim_admitted(remember_others=True)
    assert setup.state.has_claims and setup.state.home_servers(1) == [(0, 2)]
    assert setup.state.home_servers(2) is None  # remembered, but job 1 claims those GPUs
    setup.state.release(1)  # job 1 left pending: job 2 may go back to its GPUs
    assert setup.state.home_servers(2) == [(0, 2)]
    bare = RoundSetup([first, later], cluster)
    bare.claim_admitted(remember_others=False)
    bare.state.release(1)
    assert bare.state.home_servers(2) is None  # never remembered
