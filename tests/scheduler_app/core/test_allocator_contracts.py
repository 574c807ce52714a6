"""Every registered allocator, under every policy, against the invariants of allocators/base.py.

Hypothesis generates the clusters (uneven, partly busy servers) and the job mixes (catalog models,
1-16 GPUs, some fixed demands, some impossible jobs, some node counts), some of them holding a
current placement from last round (on uneven clusters some of those are invalid here and must be
ignored). New allocators are picked up from the registry automatically; every one is held to "a job
with num_nodes = N runs on exactly N servers with num_gpus / N GPUs each, or not at all", the
Synergy ones also to "never below proportional speed", and proportional and tune to "a job keeps
its GPUs when it can" and (without node counts, which may leave an admitted job pending) "every
GPU-admitted job is placed".
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from profiles_app.catalog import load_catalog
from scheduler_app.core import reasons
from scheduler_app.core.allocators import ALLOCATORS
from scheduler_app.core.engine import schedule_round
from scheduler_app.core.policies import POLICIES
from scheduler_app.core.throughput import best_case, cluster_shape, intermediate_points
from scheduler_app.core.types import ClusterSnapshot, JobView, Outcome, Placement, RoundPlan, ServerShare
from tests.builders import make_cluster, make_job, make_server

SYNERGY_ALLOCATORS = {"proportional", "greedy", "tune", "tune_matrix", "opt"}
# Allocators that place every GPU-admitted job when servers are uniform and fully schedulable.
PLACE_ALL_ADMITTED = {"proportional", "tune", "tune_matrix"}
# A job back at the demand it held keeps exactly its current placement (uniform clusters, every
# current placement valid): always, or whenever the other jobs' allocations leave room for it there.
KEEPS_CURRENT = {"proportional"}
KEEPS_CURRENT_IF_ROOM = {"proportional", "greedy", "tune", "tune_matrix"}
# Allocators that drop current placements when a plan without them is clearly faster (repack_gain).
REPACKS = {"tune", "tune_matrix"}
MODELS = sorted(load_catalog())
ALLOCATOR_NAMES = ALLOCATORS.names()
POLICY_NAMES = POLICIES.names()
TOL = 1e-6

POLICY = st.sampled_from(POLICY_NAMES)
HYPOTHESIS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


# -- strategies ------------------------------------------------------------------------------
@st.composite
def servers(draw: st.DrawFn, uniform: bool = False) -> ClusterSnapshot:
    """1-5 servers; uneven shapes and partly busy servers unless `uniform`."""
    count = draw(st.integers(1, 5))
    if uniform:
        # One shape for all, free resources proportional to free GPUs (a round-mode snapshot).
        # 62.5 GB per GPU keeps every catalog best case on one side of proportional in both
        # dimensions, the condition under which tune's take-back always frees enough.
        num_gpus = draw(st.sampled_from([2, 4, 8]))
        cpus_per_gpu = draw(st.sampled_from([2, 3, 4, 6]))
        views = []
        for i in range(count):
            busy = draw(st.booleans())
            free = sorted(draw(st.sets(st.integers(0, num_gpus - 1)))) if busy else list(range(num_gpus))
            views.append(
                make_server(
                    num_gpus,
                    num_gpus * cpus_per_gpu,
                    num_gpus * 62.5,
                    server_id=i,
                    free_gpus=free,
                    free_cpus=len(free) * cpus_per_gpu,
                    free_mem_gb=len(free) * 62.5,
                )
            )
        return make_cluster(views)
    views = []
    for i in range(count):
        num_gpus = draw(st.sampled_from([1, 2, 4, 8]))
        num_cpus = draw(st.sampled_from([4, 8, 16, 20, 24, 32, 48]))
        mem_gb = draw(st.sampled_from([100.0, 250.0, 500.0, 1000.0]))
        if draw(st.booleans()):
            views.append(make_server(num_gpus, num_cpus, mem_gb, server_id=i))
            continue
        free = sorted(draw(st.sets(st.integers(0, num_gpus - 1))))
        free_cpus = draw(st.integers(0, num_cpus))
        free_mem_gb = draw(st.integers(0, int(mem_gb * 2))) / 2
        views.append(
            make_server(
                num_gpus,
                num_cpus,
                mem_gb,
                server_id=i,
                free_gpus=free,
                free_cpus=free_cpus,
                free_mem_gb=free_mem_gb,
            )
        )
    return make_cluster(views)


@st.composite
def job_mixes(draw: st.DrawFn, fixed_demands: bool = True, nodes: bool = True) -> list[JobView]:
    count = draw(st.integers(0, 18))
    jobs = []
    for job_id in range(count):
        cpus_per_gpu = mem_gb_per_gpu = None
        if fixed_demands and draw(st.integers(0, 9)) == 0:
            cpus_per_gpu = draw(st.sampled_from([None, 1.0, 2.0, 5.0, 12.0, 100.0]))
            mem_gb_per_gpu = draw(st.sampled_from([None, 10.0, 62.5, 300.0, 5000.0]))
        total_iters = draw(st.sampled_from([100.0, 1000.0, 50_000.0]))
        jobs.append(
            make_job(
                job_id,
                draw(st.sampled_from(MODELS)),
                gpus=draw(st.sampled_from([1, 1, 1, 2, 3, 4, 8, 16])),
                arrival_s=draw(st.integers(0, 5)) * 100.0,
                total_iters=total_iters,
                done_iters=draw(st.sampled_from([0.0, 0.5])) * total_iters,
                attained_service_gpu_s=float(draw(st.integers(0, 3)) * 600),
                cpus_per_gpu=cpus_per_gpu,
                mem_gb_per_gpu=mem_gb_per_gpu,
                priority=draw(st.sampled_from([0, 0, 0, 1])),
            )
        )
        if nodes and draw(st.integers(0, 3)) == 0:
            # Mostly an even split (a divisor of its GPU count), sometimes any count (maybe uneven).
            num_gpus = jobs[-1].num_gpus
            divisors = [n for n in (1, 2, 3, 4, 8) if num_gpus % n == 0]
            counts = st.sampled_from(divisors) if draw(st.integers(0, 4)) else st.sampled_from([2, 3, 4])
            jobs[-1] = dataclasses.replace(jobs[-1], num_nodes=draw(counts))
        elif jobs[-1].num_gpus > 1 and draw(st.integers(0, 4)) == 0:
            # A GPU range (GENIE's choice): genie may run it on any of these, the others on its count.
            jobs[-1] = dataclasses.replace(jobs[-1], gpu_choices=(1, max(1, jobs[-1].num_gpus // 2)))
    return jobs


@st.composite
def rounds(
    draw: st.DrawFn, uniform: bool = False, fixed_demands: bool = True, nodes: bool = True
) -> tuple[ClusterSnapshot, list[JobView]]:
    """A cluster and a job mix in which about half the jobs hold a current placement.

    Current placements take free GPUs no other job holds, a run of them in cluster order (so some
    span servers), at the job's proportional share or its best case, and never more cores or
    memory than its servers have free: what last round's plan could have been. A job with a node
    count mostly gets one of its shape (the lowest spare GPUs of drawn servers), else a run, which
    is then usually of another shape and must be ignored. On uneven clusters some are also invalid
    (unknown server, busy or doubly held GPU, wrong GPU count).
    """
    cluster = draw(servers(uniform=uniform))
    jobs = draw(job_mixes(fixed_demands=fixed_demands, nodes=nodes))
    shape = cluster_shape(cluster)
    by_id = {s.server_id: s for s in cluster.servers}
    spare = [(s.server_id, g) for s in cluster.servers for g in sorted(s.free_gpus)]
    cpus_left = {s.server_id: float(s.free_cpus) for s in cluster.servers}
    mem_left = {s.server_id: s.free_mem_gb for s in cluster.servers}
    out = []
    for job in jobs:
        if shape is None or not draw(st.booleans()):
            out.append(job)
            continue
        if not uniform and draw(st.integers(0, 5)) == 0:
            out.append(dataclasses.replace(job, current=draw(invalid_placement(job, cluster))))
            continue
        if job.num_gpus > len(spare):
            out.append(job)
            continue
        picked = draw(shaped_pick(job, spare))
        if picked is None:
            start = draw(st.integers(0, len(spare) - job.num_gpus))
            picked = spare[start : start + job.num_gpus]
        gpus: dict[int, list[int]] = defaultdict(list)
        for server_id, g in picked:
            gpus[server_id].append(g)
        best = best_case(job.profile, job.num_gpus, shape)
        at_best = draw(st.booleans())
        held = []  # (share, cores and GB as the plan held them: shares report floor(cores))
        for server_id, idx in gpus.items():
            server, k = by_id[server_id], len(idx)
            if at_best:
                c, m = best.cpus_per_gpu, best.mem_gb_per_gpu
            else:
                c, m = server.cpus_per_gpu, server.mem_gb_per_gpu
            held.append((ServerShare(server_id, tuple(idx), int(k * c + 1e-6), k * m), k * c, k * m))
        if any(c > cpus_left[sh.server_id] + TOL or m > mem_left[sh.server_id] + TOL for sh, c, m in held):
            out.append(job)
            continue
        for sh, c, m in held:
            cpus_left[sh.server_id] -= c
            mem_left[sh.server_id] -= m
        shares = [sh for sh, _, _ in held]
        spare = [p for p in spare if p not in picked]
        out.append(dataclasses.replace(job, current=Placement(job.job_id, tuple(shares), 1.0)))
    return cluster, out


@st.composite
def shaped_pick(draw: st.DrawFn, job: JobView, spare: list[tuple[int, int]]) -> list[tuple[int, int]] | None:
    """For a job with an even node count N, mostly: num_gpus / N spare GPUs (the lowest) on each of N
    drawn servers that have them; None otherwise (the caller takes a run of spare GPUs)."""
    nodes = job.num_nodes
    if nodes is None or job.num_gpus % nodes or not draw(st.integers(0, 3)):
        return None
    per_node = job.num_gpus // nodes
    on: dict[int, list[int]] = defaultdict(list)
    for server_id, g in spare:
        on[server_id].append(g)
    fitting = [server_id for server_id, gpus in on.items() if len(gpus) >= per_node]
    if len(fitting) < nodes:
        return None
    chosen = draw(st.permutations(fitting))[:nodes]
    return [(server_id, g) for server_id in sorted(chosen) for g in on[server_id][:per_node]]


@st.composite
def invalid_placement(draw: st.DrawFn, job: JobView, cluster: ClusterSnapshot) -> Placement:
    """A placement last round's plan could not have left on this snapshot (allocators ignore it)."""
    server = draw(st.sampled_from(cluster.servers))
    kind = draw(st.sampled_from(["unknown_server", "busy_gpu", "wrong_count", "any_free"]))
    if kind == "unknown_server":
        share = ServerShare(999, tuple(range(job.num_gpus)), 1, 1.0)
    elif kind == "busy_gpu":
        share = ServerShare(server.server_id, (server.num_gpus,), 1, 1.0)  # no such GPU
    elif kind == "wrong_count":
        share = ServerShare(server.server_id, tuple(range(job.num_gpus + 1)), 1, 1.0)
    else:  # free GPUs that another job may also hold
        share = ServerShare(server.server_id, tuple(sorted(server.free_gpus))[: job.num_gpus], 1, 1.0)
    return Placement(job.job_id, (share,), 1.0)


def allocate(
    name: str, policy: str, jobs: list[JobView], cluster: ClusterSnapshot, **options: object
) -> tuple[list, RoundPlan]:
    ordered = POLICIES.get(policy)().order(jobs, cluster, 1000.0)
    return ordered, ALLOCATORS.get(name)(**options).allocate_at(ordered, cluster, 1000.0)


# -- invariant checks ------------------------------------------------------------------------
def check_decisions_match_jobs(ordered: list[JobView], plan: RoundPlan) -> None:
    assert [d.job_id for d in plan.decisions] == [j.job_id for j in ordered]
    for d in plan.decisions:
        if d.outcome == Outcome.PLACED:
            assert d.placement is not None and d.placement.job_id == d.job_id
            assert d.reason in reasons.PLACED_REASONS
        elif d.outcome == Outcome.PENDING:
            assert d.placement is None and d.reason in reasons.PENDING_REASONS
        else:
            assert d.placement is None and d.reason in reasons.INFEASIBLE_REASONS


def check_no_over_commit(cluster: ClusterSnapshot, plan: RoundPlan) -> None:
    servers = {s.server_id: s for s in cluster.servers}
    used_gpus: dict[int, list[int]] = defaultdict(list)
    used_cpus: dict[int, int] = defaultdict(int)
    used_mem_gb: dict[int, float] = defaultdict(float)
    for placement in plan.placements().values():
        for share in placement.shares:
            used_gpus[share.server_id].extend(share.gpu_indices)
            used_cpus[share.server_id] += share.num_cpus
            used_mem_gb[share.server_id] += share.mem_gb
            assert share.num_cpus >= 0 and share.mem_gb >= -TOL
    for server_id, gpus in used_gpus.items():
        server = servers[server_id]
        assert len(gpus) == len(set(gpus)), f"GPU given twice on server {server_id}"
        assert set(gpus) <= set(server.free_gpus), f"busy GPU used on server {server_id}"
        assert used_cpus[server_id] <= server.free_cpus
        assert used_mem_gb[server_id] <= server.free_mem_gb + TOL


def check_all_or_nothing(ordered: list[JobView], plan: RoundPlan) -> None:
    jobs = {j.job_id: j for j in ordered}
    for job_id, placement in plan.placements().items():
        job = jobs[job_id]
        assert placement.num_gpus in {job.num_gpus, *job.gpu_choices}
        server_ids = [s.server_id for s in placement.shares]
        assert len(server_ids) == len(set(server_ids))
        assert all(len(s.gpu_indices) > 0 for s in placement.shares)


def check_node_counts(cluster: ClusterSnapshot, ordered: list[JobView], plan: RoundPlan) -> None:
    """A job with num_nodes = N runs on exactly N distinct servers with num_gpus / N GPUs each, or is
    not placed; it is infeasible for its node count exactly when its split is uneven or fewer than N
    servers could ever hold num_gpus / N of its GPUs (checked here apart from the core)."""
    for job, d in zip(ordered, plan.decisions, strict=True):
        nodes = job.num_nodes
        if nodes is None:
            continue
        if d.placement is not None:
            per_node = job.num_gpus // nodes
            assert job.num_gpus % nodes == 0, d
            assert len({s.server_id for s in d.placement.shares}) == len(d.placement.shares) == nodes, d
            assert all(len(s.gpu_indices) == per_node for s in d.placement.shares), d
        uneven = job.num_gpus % nodes != 0
        assert (d.reason == reasons.UNEVEN_NODE_SPLIT) == uneven, d
        if not uneven and d.reason == reasons.EXCEEDS_CLUSTER_NODES:
            assert servers_holding(cluster, job, job.num_gpus // nodes) < nodes, d
        elif not uneven and d.outcome != Outcome.INFEASIBLE:
            assert servers_holding(cluster, job, job.num_gpus // nodes) >= nodes, d


def servers_holding(cluster: ClusterSnapshot, job: JobView, per_node: int) -> int:
    """How many servers of the (empty) cluster could hold `per_node` GPUs of `job` at its fixed demand."""
    c, m = job.cpus_per_gpu_override, job.mem_gb_per_gpu_override
    return sum(
        1
        for s in cluster.servers
        if s.num_gpus >= per_node
        and (not c or per_node * c <= s.num_cpus + TOL)
        and (not m or per_node * m <= s.mem_gb + TOL)
    )


def check_not_below_proportional(ordered: list[JobView], plan: RoundPlan) -> None:
    """A placed job runs at least as fast as its GPU-proportional share on the same servers."""
    jobs = {j.job_id: j for j in ordered}
    for d in plan.decisions:
        if d.placement is None or d.reason == reasons.FIXED_DEMAND:
            continue  # a user-fixed demand may well be below proportional
        profile = jobs[d.job_id].profile
        proportional = 1.0 / profile.placement_penalty if d.placement.num_servers > 1 else 1.0
        assert d.placement.speedup >= proportional - TOL, d


def decided_demand(job: JobView, reason: str, cluster: ClusterSnapshot) -> tuple[float, float] | None:
    """The per-GPU (cores, GB) a placed job got on a uniform cluster, when its reason says which."""
    shape = cluster_shape(cluster)
    assert shape is not None
    if reason == reasons.PROPORTIONAL:
        return shape.cpus_per_gpu, shape.mem_gb_per_gpu
    if reason == reasons.BEST_CASE:
        best = best_case(job.profile, job.num_gpus, shape)
        return best.cpus_per_gpu, best.mem_gb_per_gpu
    return None  # reverted or intermediate: placed at another demand than the one it ends with


def most_held(job: JobView, reason: str, cluster: ClusterSnapshot) -> tuple[float, float] | None:
    """The most per-GPU (cores, GB) a placed job can have held at any time in the round (uniform)."""
    demand = decided_demand(job, reason, cluster)
    if demand is not None:
        return demand
    shape = cluster_shape(cluster)
    assert shape is not None
    if reason in (reasons.REVERTED_TO_PROPORTIONAL, reasons.INTERMEDIATE):
        # Placed at its best case or a matrix point (tune_matrix), then maybe shrunk: a point may
        # ask more cores than the best case with less memory, so bound each dimension apart.
        points = [
            best_case(job.profile, job.num_gpus, shape),
            *intermediate_points(job.profile, job.num_gpus, shape),
        ]
        return max(p.cpus_per_gpu for p in points), max(p.mem_gb_per_gpu for p in points)
    return None


def check_keeps_current(
    cluster: ClusterSnapshot, ordered: list[JobView], plan: RoundPlan, *, strong: bool
) -> None:
    """A GPU-admitted job back at the demand it held keeps exactly its GPUs, cores and memory.

    Uniform clusters: every current placement of the generator is valid, so every GPU-admitted
    job claims its own (greedy may also place a job admission did not foresee; that one only goes
    back if nobody claimed the room). Strong: always (without node counts). Otherwise: whenever
    the others' allocations leave room for it there (see `room_left`). A current placement of
    another shape than the job's node count is never kept. Tune gives a job its best case wherever that fits,
    so another job may then have to take an incumbent's GPU where proportional never would.
    """
    jobs = {j.job_id: j for j in ordered}
    claimants = admitted_ids(ordered, cluster)
    # A job with a node count may find N servers only by taking a claimant's GPUs, so with node
    # counts around even proportional keeps placements only where room is left.
    strong = strong and all(job.num_nodes is None for job in ordered)
    for d in plan.decisions:
        job = jobs[d.job_id]
        if d.placement is None or job.current is None or job.job_id not in claimants:
            continue
        if not has_node_shape(job, job.current):
            continue  # not a placement the job may run on: it must move
        demand = decided_demand(job, d.reason, cluster)
        if demand is None:
            continue
        c, m = demand
        current = job.current.shares
        at_demand = tuple(
            ServerShare(s.server_id, s.gpu_indices, int(k * c + 1e-6), k * m)
            for s, k in ((s, len(s.gpu_indices)) for s in current)
        )
        if at_demand != current:
            continue
        if strong or room_left(cluster, jobs, plan, job.current, demand):
            assert d.placement.same_resources(job.current), (d, job.current)


def has_node_shape(job: JobView, placement: Placement) -> bool:
    """True when `placement` is of the job's node count (always, for a job without one)."""
    if job.num_nodes is None:
        return True
    per_node = job.num_gpus / job.num_nodes
    shares = placement.shares
    return len(shares) == job.num_nodes and all(len(s.gpu_indices) == per_node for s in shares)


def room_left(
    cluster: ClusterSnapshot,
    jobs: dict[int, JobView],
    plan: RoundPlan,
    current: Placement,
    demand: tuple[float, float],
) -> bool:
    """Whether the other jobs leave `current` free at `demand`: none holds one of its GPUs, and on
    each of its servers the most cores and memory the others can have held at any time this round
    leave its share free (so it fitted there whenever its turn came)."""
    servers = {srv.server_id: srv for srv in cluster.servers}
    mine = {s.server_id: set(s.gpu_indices) for s in current.shares}
    cpus: dict[int, float] = defaultdict(float)
    mem_gb: dict[int, float] = defaultdict(float)
    for d in plan.decisions:
        if d.placement is None or d.job_id == current.job_id:
            continue
        most = most_held(jobs[d.job_id], d.reason, cluster)
        for share in d.placement.shares:
            if share.server_id not in mine:
                continue
            if mine[share.server_id] & set(share.gpu_indices) or most is None:
                return False  # one of its GPUs is taken, or no bound is known (an LP share)
            cpus[share.server_id] += len(share.gpu_indices) * most[0]
            mem_gb[share.server_id] += len(share.gpu_indices) * most[1]
    c, m = demand
    for share in current.shares:
        server, k = servers[share.server_id], len(share.gpu_indices)
        if cpus[share.server_id] + k * c > server.free_cpus + TOL:
            return False
        if mem_gb[share.server_id] + k * m > server.free_mem_gb + TOL:
            return False
    return True


def admitted_ids(ordered: list[JobView], cluster: ClusterSnapshot) -> set[int]:
    """Synergy's GPU-only admission, computed independently of the allocators (a job with a node
    count N only if its split is even and N servers have num_gpus / N free GPUs)."""
    left = cluster.free_gpu_count
    admitted = set()
    for job in ordered:
        nodes = job.num_nodes
        if nodes is not None and (
            job.num_gpus % nodes
            or sum(len(s.free_gpus) >= job.num_gpus // nodes for s in cluster.servers) < nodes
        ):
            continue
        if job.num_gpus <= cluster.total_gpus and job.num_gpus <= left:
            admitted.add(job.job_id)
            left -= job.num_gpus
    return admitted


# -- the contract ----------------------------------------------------------------------------
@pytest.mark.parametrize("name", ALLOCATOR_NAMES)
@HYPOTHESIS
@given(case=rounds(), policy=POLICY)
def test_invariants_hold_for_every_allocator(name, case, policy):
    cluster, jobs = case
    ordered, plan = allocate(name, policy, jobs, cluster)
    check_decisions_match_jobs(ordered, plan)
    check_no_over_commit(cluster, plan)
    check_all_or_nothing(ordered, plan)
    check_node_counts(cluster, ordered, plan)
    if name in SYNERGY_ALLOCATORS:
        check_not_below_proportional(ordered, plan)


@pytest.mark.parametrize("name", ALLOCATOR_NAMES)
@HYPOTHESIS
@given(case=rounds(), policy=POLICY)
def test_same_inputs_same_plan(name, case, policy):
    cluster, jobs = case
    _, first = allocate(name, policy, jobs, cluster)
    _, second = allocate(name, policy, list(jobs), cluster)
    assert first == second
    via_engine = schedule_round(cluster, jobs, policy=policy, allocator=name, now_s=1000.0)
    assert via_engine == first


@pytest.mark.parametrize("name", sorted(PLACE_ALL_ADMITTED & set(ALLOCATOR_NAMES)))
@HYPOTHESIS
@given(case=rounds(uniform=True, fixed_demands=False, nodes=False), policy=POLICY)
def test_every_gpu_admitted_job_is_placed(name, case, policy):
    cluster, jobs = case
    ordered, plan = allocate(name, policy, jobs, cluster)
    placed = set(plan.placements())
    assert placed == admitted_ids(ordered, cluster)
    check_no_over_commit(cluster, plan)


@HYPOTHESIS
@given(case=rounds(uniform=True, fixed_demands=False, nodes=False), policy=POLICY)
def test_tune_uses_exactly_the_gpus_proportional_uses(case, policy):
    cluster, jobs = case
    _, tune = allocate("tune", policy, jobs, cluster)
    _, proportional = allocate("proportional", policy, jobs, cluster)
    assert set(tune.placements()) == set(proportional.placements())


@pytest.mark.parametrize("name", sorted(KEEPS_CURRENT_IF_ROOM & set(ALLOCATOR_NAMES)))
@HYPOTHESIS
@given(case=rounds(uniform=True, fixed_demands=False, nodes=True), policy=POLICY)
def test_a_job_back_at_its_demand_keeps_its_placement(name, case, policy):
    cluster, jobs = case
    # Tune's repacking (a fresh plan that is clearly faster) is checked on its own below.
    options = {"repack_gain": None} if name in REPACKS else {}
    ordered, plan = allocate(name, policy, jobs, cluster, **options)
    check_keeps_current(cluster, ordered, plan, strong=name in KEEPS_CURRENT)


@pytest.mark.parametrize("name", sorted(REPACKS & set(ALLOCATOR_NAMES)))
@HYPOTHESIS
@given(case=rounds(uniform=True, fixed_demands=False), policy=POLICY)
def test_tune_leaves_placements_only_for_a_clearly_faster_plan(name, case, policy):
    cluster, jobs = case
    gain = 0.05
    _, plan = allocate(name, policy, jobs, cluster, repack_gain=gain)
    _, sticky = allocate(name, policy, jobs, cluster, repack_gain=None)
    unclaimed = [dataclasses.replace(job, current=None) for job in jobs]
    _, fresh = allocate(name, policy, unclaimed, cluster)
    assert plan.throughput() >= sticky.throughput() - TOL
    assert plan.throughput() * (1 + gain) >= fresh.throughput() - TOL
    if plan != sticky:
        assert fresh.throughput() > sticky.throughput() * (1 + gain)


@pytest.mark.parametrize("name", ALLOCATOR_NAMES)
def test_empty_inputs(name):
    allocator = ALLOCATORS.get(name)()
    assert allocator.allocate([], make_cluster(2)).decisions == ()
    plan = allocator.allocate([make_job(1)], make_cluster(0))
    expected = [(Outcome.INFEASIBLE, reasons.EXCEEDS_CLUSTER_GPUS)]
    assert [(d.outcome, d.reason) for d in plan.decisions] == expected
