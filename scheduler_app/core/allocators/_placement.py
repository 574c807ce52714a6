"""Shared placement machinery for the allocators: free-resource state, server choice, plan assembly.

Stable API (the opt allocator imports it too):
- `infeasible_reason(job, snapshot)` -> reason code or None: can this job ever fit this cluster?
  (`infeasible_reasons(jobs, snapshot)` for a whole list.)
- `gpu_admission(ordered_jobs, infeasible, free_gpu_count, snapshot=None)` -> list[bool]: Synergy's
  GPU-only admission in policy order (with `snapshot`: node counts that cannot start are skipped).
- `RoundState(snapshot, jobs=())`: free GPUs / cores / memory per server for one round, mutated as
  jobs are placed; `find_packed` / `find_first_fit` (or `find` / `find_uniform`) choose servers,
  `take` commits a plan, `adjust` gives back or claims cores and memory of a share already held.
  `claim_current` / `remember_current` / `release` / `home_servers` / `home_plan`: stickiness (below).
  `require_nodes` / `node_shape` / `node_servers` / `node_pending_reason`: node counts (below).
- `PlanBuilder`: one Decision per job, in input order.
- `DemandCache(shape)`: per-call memo of each job's (capped) best case and fixed-demand point.

Per-GPU demands are passed as two sequences indexed by server position (`dc[i]` cores and `dm[i]`
GB per GPU on server i), so one code path serves a uniform vector (`state.uniform(x)`), the
per-server proportional share (`state.prop_cpus`, `state.prop_mem_gb`) and fixed demands.
Cores are tracked as floats (a capped best case can be 4.8 cores per GPU); a share reports
floor(cores) as its integer core count, so the sum of reported cores never exceeds what was free.
GPU indices are taken lowest first, servers are named by their position in `snapshot.servers`.

Stickiness (round mode re-decides every job, but a moved job is a real restart): after admission an
allocator calls `state.claim_current(admitted_jobs)`; each job whose `current` placement is valid
on the snapshot then *claims* those GPU indices and *reserves* the cores and memory it held, and
`find*` / `take` take `owner=job_id`. A claimant goes back to exactly its GPUs (and, while its
demand is unchanged, exactly its shares) whenever they still hold its demand. Every placement
otherwise follows the strategy's own rule, stage by stage, first over unclaimed GPUs with
unreserved cores/memory, then over unclaimed GPUs with any free cores/memory, then over everything
free (taking unclaimed indices first, and from the fewest, smallest claimants; a claimant that
loses a GPU drops all its claims, since it has to move anyway). Each `find` fails exactly when
the plain rule would on the same state, so claims change no operating-point or admission rule,
only where jobs go; with no claims every choice is the plain rule's.

Node counts (`JobView.num_nodes`, Slurm's --nodes): the jobs given to `RoundState(snapshot, jobs)`
(or `require_nodes`, before `claim_current`) that ask for N servers are placed by `find*` with
`owner=job_id` only on exactly N distinct servers with num_gpus / N GPUs each: the strategy's order
over the servers that fit num_gpus / N GPUs at the demand (packed: fewest usable GPUs first, ties
lowest position; first fit: position order), through the same stages as above (home, unclaimed,
everything free), and nothing when fewer than N servers fit. A current placement of another shape
is not a home (it claims nothing). Jobs without num_nodes take exactly the paths above. Allocators
that choose servers themselves (opt's balanced choice, room-making) ask `node_shape` /
`node_servers`; `infeasible_reason` answers the shapes no cluster state could ever hold.
"""

from __future__ import annotations

import math
from bisect import insort
from collections.abc import Iterable, Sequence

from scheduler_app.core import reasons
from scheduler_app.core.throughput import OperatingPoint, ServerShape, best_case, relative_speed
from scheduler_app.core.types import (
    ClusterSnapshot,
    Decision,
    JobView,
    Outcome,
    Placement,
    RoundPlan,
    ServerShare,
    ServerView,
)

EPS = 1e-6

FIRST_FIT = "first_fit"
PACKED = "packed"
PLACEMENT_STRATEGIES = (FIRST_FIT, PACKED)

Plan = list[tuple[int, int]]  # (server position, number of GPUs) pairs


def has_fixed_demand(job: JobView) -> bool:
    """True when the user fixed the per-GPU cores or memory of this job."""
    return job.cpus_per_gpu_override is not None or job.mem_gb_per_gpu_override is not None


def infeasible_reason(
    job: JobView,
    snapshot: ClusterSnapshot,
    total_gpus: int | None = None,
    memo: dict[tuple[int, float | None, float | None], int] | None = None,
) -> str | None:
    """Why `job` can never fit this cluster (even empty), or None if it could.

    A fixed demand is infeasible when the cluster cannot hold `num_gpus` GPUs each with that
    per-GPU share, counting every server's full capacity (a split job needs the share on every
    server it touches); a dimension that is not overridden gets each server's proportional share,
    which always fits. A job with `num_nodes` = N needs num_gpus to split evenly, and N servers that
    could each hold num_gpus / N of its GPUs (with its fixed demand, if any). `memo`: a dict shared
    by the calls on one snapshot (counts of servers by demand), as `infeasible_reasons` passes.
    """
    if job.num_gpus < 1:
        raise ValueError(f"job {job.job_id}: num_gpus must be >= 1, got {job.num_gpus}")
    if job.num_nodes is not None:
        return _node_infeasible_reason(job, snapshot, total_gpus, {} if memo is None else memo)
    if job.num_gpus > (snapshot.total_gpus if total_gpus is None else total_gpus):
        return reasons.EXCEEDS_CLUSTER_GPUS
    if not has_fixed_demand(job):
        return None
    # A helper, not a generator here: capturing c and m would cost every job two cells per call.
    holdable = _holdable_total(snapshot, job.cpus_per_gpu_override, job.mem_gb_per_gpu_override)
    return reasons.EXCEEDS_SERVER_RESOURCES if holdable < job.num_gpus else None


def _node_infeasible_reason(
    job: JobView,
    snapshot: ClusterSnapshot,
    total_gpus: int | None,
    memo: dict[tuple[int, float | None, float | None], int],
) -> str | None:
    """`infeasible_reason` for a job with a node count (kept apart: every job passes the other path).

    `memo` keys: (0, c, m) -> GPUs the cluster holds at (c, m); (k, c, m) -> servers holding k of
    them. Live jobs mostly carry a node count, so each is counted once per snapshot, not per job.
    """
    nodes = job.num_nodes
    assert nodes is not None
    num_gpus = job.num_gpus
    if nodes < 1:
        raise ValueError(f"job {job.job_id}: num_nodes must be >= 1 or None, got {nodes}")
    if num_gpus % nodes:
        return reasons.UNEVEN_NODE_SPLIT
    if num_gpus > (snapshot.total_gpus if total_gpus is None else total_gpus):
        return reasons.EXCEEDS_CLUSTER_GPUS
    c, m = job.cpus_per_gpu_override, job.mem_gb_per_gpu_override
    if c is not None or m is not None:
        holdable = memo.get((0, c, m))
        if holdable is None:
            holdable = memo[(0, c, m)] = _holdable_total(snapshot, c, m)
        if holdable < num_gpus:
            return reasons.EXCEEDS_SERVER_RESOURCES
    per_node = num_gpus // nodes
    servers = memo.get((per_node, c, m))
    if servers is None:
        servers = memo[(per_node, c, m)] = _servers_holding(snapshot, per_node, c, m)
    return reasons.EXCEEDS_CLUSTER_NODES if servers < nodes else None


def _holdable_total(snapshot: ClusterSnapshot, c: float | None, m: float | None) -> int:
    """How many GPUs of the whole (empty) cluster a job with fixed per-GPU demand (c, m) could hold."""
    return sum(_holdable_gpus(s, c, m) for s in snapshot.servers)


def _servers_holding(snapshot: ClusterSnapshot, k: int, c: float | None, m: float | None) -> int:
    """How many servers of the (empty) cluster could each hold k GPUs at fixed per-GPU demand (c, m)."""
    return sum(1 for s in snapshot.servers if _holdable_gpus(s, c, m) >= k)


def _holdable_gpus(server: ServerView, c: float | None, m: float | None) -> int:
    """How many GPUs of an empty `server` a job with fixed per-GPU demand (c, m) could hold."""
    k = server.num_gpus
    if c is not None and c > 0:
        k = min(k, math.floor((server.num_cpus + EPS) / c))
    if m is not None and m > 0:
        k = min(k, math.floor((server.mem_gb + EPS) / m))
    return k


def infeasible_reasons(jobs: Sequence[JobView], snapshot: ClusterSnapshot) -> list[str | None]:
    """`infeasible_reason` for every job (the cluster's GPU total and server counts computed once)."""
    total_gpus = snapshot.total_gpus
    memo: dict[tuple[int, float | None, float | None], int] = {}
    return [infeasible_reason(job, snapshot, total_gpus, memo) for job in jobs]


def gpu_admission(
    ordered_jobs: Sequence[JobView],
    infeasible: Sequence[str | None],
    free_gpu_count: int,
    snapshot: ClusterSnapshot | None = None,
) -> list[bool]:
    """Synergy's runnable set: in policy order, admit a job if its GPU count fits what is left.

    Only GPUs are checked, so a later smaller job may be admitted past a big one that does not fit.
    Infeasible jobs are never admitted. Reference: simulator/schedulers/*_synergy_new.py
    (`jobs_this_round`). With `snapshot`, a job with a node count N is admitted only if N servers
    have num_gpus / N free GPUs: otherwise it cannot start this round whatever the others do, and
    admitting it would only hold GPUs back from the jobs behind it.
    """
    admitted = [False] * len(ordered_jobs)
    left = free_gpu_count
    servers_free: dict[int, int] = {}  # k -> servers with at least k free GPUs
    for pos, job in enumerate(ordered_jobs):
        if infeasible[pos] is None and job.num_gpus <= left:
            nodes = job.num_nodes
            if nodes is not None and snapshot is not None:
                per_node = job.num_gpus // nodes
                servers = servers_free.get(per_node)
                if servers is None:
                    servers = servers_free[per_node] = _servers_with_free(snapshot, per_node)
                if servers < nodes:
                    continue
            admitted[pos] = True
            left -= job.num_gpus
    return admitted


def _servers_with_free(snapshot: ClusterSnapshot, k: int) -> int:
    """How many servers of the snapshot have at least k free GPUs."""
    return sum(1 for s in snapshot.servers if len(s.free_gpus) >= k)


class HeldShare:
    """The part of a job's allocation on one server, while the round is being decided (mutable)."""

    __slots__ = ("cpus", "gpu_indices", "mem_gb", "server_pos")

    def __init__(self, server_pos: int, gpu_indices: tuple[int, ...], cpus: float, mem_gb: float) -> None:
        self.server_pos = server_pos
        self.gpu_indices = gpu_indices
        self.cpus = cpus
        self.mem_gb = mem_gb

    @property
    def num_gpus(self) -> int:
        return len(self.gpu_indices)


class RoundState:
    """Free resources of one round, per server position; mutated as jobs are placed.

    Servers are also bucketed by their free GPU count, so "the server with the fewest free GPUs
    that fits" is found without scanning full servers. Once jobs claim their current placements
    (`claim_current`), servers are bucketed by their unclaimed free GPU count too, and the cores
    and memory not reserved by a claimant are tracked beside the free ones.
    """

    def __init__(self, snapshot: ClusterSnapshot, jobs: Sequence[JobView] = ()) -> None:
        servers = snapshot.servers
        self.servers = servers
        self.num_servers = len(servers)
        self.server_ids = [s.server_id for s in servers]
        self.free_idx: list[list[int]] = [sorted(s.free_gpus) for s in servers]
        self.num_free: list[int] = [len(x) for x in self.free_idx]
        self.free_cpus: list[float] = [float(s.free_cpus) for s in servers]
        self.free_mem_gb: list[float] = [float(s.free_mem_gb) for s in servers]
        self.prop_cpus: list[float] = [s.num_cpus / s.num_gpus if s.num_gpus else 0.0 for s in servers]
        self.prop_mem_gb: list[float] = [s.mem_gb / s.num_gpus if s.num_gpus else 0.0 for s in servers]
        self.free_gpu_count = sum(self.num_free)
        self.total_free_cpus = sum(self.free_cpus)
        self.total_free_mem_gb = sum(self.free_mem_gb)
        top = max(self.num_free, default=0)
        self._buckets: list[list[int]] = [[] for _ in range(top + 1)]
        for i, n in enumerate(self.num_free):
            self._buckets[n].append(i)
        self._uniform: dict[float, list[float]] = {}
        self._failed: dict[tuple[float, float], int] = {}  # (c, m) -> fewest GPUs that did not fit
        self._failed_nodes: dict[tuple[float, float, int], int] = {}  # (c, m, k) -> fewest servers
        # Stickiness, set up by claim_current (until then `_claimed` is None and every choice is the
        # plain rule). `_home`: job id -> its valid current placement as (server position, GPU
        # indices, cores, GB) per share; `_claimants`: the jobs whose claims still stand.
        self._home: dict[int, list[tuple[int, tuple[int, ...], float, float]]] = {}
        self._home_plan: dict[int, Plan] = {}  # job id -> its home as a plan (returned as is)
        self._claimants: set[int] = set()
        self._claimed: list[dict[int, int]] | None = None  # per server: claimed GPU index -> job id
        self.num_unclaimed: list[int] = []
        self.reserved_cpus: list[float] = []
        self.reserved_mem_gb: list[float] = []
        self.unreserved_cpus: list[float] = []  # free minus reserved, kept up to date for the hot loops
        self.unreserved_mem_gb: list[float] = []
        self._ubuckets: list[list[int]] = []
        # Node counts: job id -> (servers, GPUs on each) for the jobs with `num_nodes` (usually none,
        # so the hot paths test one empty dict).
        self._nodes: dict[int, tuple[int, int]] = {}
        self.require_nodes(jobs)

    # -- node counts ---------------------------------------------------------------------------
    def require_nodes(self, jobs: Sequence[JobView]) -> None:
        """Learn the node counts (`num_nodes`) of `jobs`: from now on `find*` with `owner=job_id`
        places such a job only on exactly that many servers, with num_gpus / num_nodes GPUs each.

        Call before `claim_current`, so that a current placement of another shape claims nothing.
        An uneven split is recorded as it is and never found a place (infeasible_reason says why).
        """
        # One comprehension (every round passes every job here, and almost none has a node count).
        for job in [job for job in jobs if job.num_nodes is not None]:
            nodes = job.num_nodes
            assert nodes is not None
            shape = self._nodes[job.job_id] = (nodes, job.num_gpus // nodes if nodes > 0 else 0)
            home = self._home.get(job.job_id)
            if home is not None and not _has_shape(home, shape):
                # Registered too late to be skipped: a home it may not run on is no home.
                self.release(job.job_id)
                del self._home[job.job_id], self._home_plan[job.job_id]

    def node_shape(self, owner: int | None) -> tuple[int, int] | None:
        """(servers, GPUs on each) that `owner` must be placed on, or None: any split will do."""
        if not self._nodes or owner is None:
            return None
        return self._nodes.get(owner)

    def node_servers(self, owner: int, counts: Sequence[int]) -> Plan | None:
        """For a job with a node count N: N servers with at least num_gpus / N usable GPUs each
        (`counts`: free or unclaimed GPUs per server), fewest first (ties: lowest position), each
        with num_gpus / N; None if fewer servers have them or the job has no node count. Used where
        an allocator picks servers to make room on, before placing the job there."""
        shape = self.node_shape(owner)
        if shape is None:
            return None
        nodes, per_node = shape
        if per_node < 1:
            return None
        fitting = sorted((n, i) for i, n in enumerate(counts) if n >= per_node)
        if len(fitting) < nodes:
            return None
        return sorted((i, per_node) for _, i in fitting[:nodes])

    def node_pending_reason(self, job: JobView) -> str | None:
        """Why a job with a node count N found no place: `insufficient_gpus` when fewer than N servers
        have num_gpus / N free GPUs, else `fragmented` (cores or memory were missing there); None for
        a job without a node count (the caller's own reason stands)."""
        shape = self.node_shape(job.job_id)
        if shape is None:
            return None
        nodes, per_node = shape
        if self._servers_with_free(max(per_node, 1)) < nodes:
            return reasons.INSUFFICIENT_GPUS
        return reasons.FRAGMENTED

    def _servers_with_free(self, k: int) -> int:
        """How many servers have at least k free GPUs now (bucket b: servers with b free)."""
        return sum(map(len, self._buckets[k:]))

    # -- demand vectors ------------------------------------------------------------------------
    def uniform(self, value: float) -> list[float]:
        """The same per-GPU value on every server, as a per-server sequence (cached per value)."""
        vec = self._uniform.get(value)
        if vec is None:
            vec = self._uniform[value] = [value] * self.num_servers
        return vec

    def fixed_demand(self, job: JobView) -> tuple[list[float], list[float]]:
        """Per-server per-GPU demand of a fixed-demand job (non-overridden side: proportional)."""
        c, m = job.cpus_per_gpu_override, job.mem_gb_per_gpu_override
        dc = self.prop_cpus if c is None else self.uniform(float(c))
        dm = self.prop_mem_gb if m is None else self.uniform(float(m))
        return dc, dm

    # -- stickiness ----------------------------------------------------------------------------
    def claim_current(self, jobs: Iterable[JobView]) -> None:
        """Let each job's `current` placement claim its GPUs and reserve the cores and memory it held.

        Call once, before placing anything, with the jobs expected to run this round (the admitted
        ones): a claim that will not be used would only push newcomers aside for nothing. A
        placement claims nothing unless it is valid on this snapshot: the job's GPU count, known
        servers (each once), GPUs that are free here and not claimed by an earlier job of `jobs`.
        """
        self._register(jobs, claim=True)

    def remember_current(self, jobs: Iterable[JobView]) -> None:
        """Note current placements without claiming them (jobs that may run but are not expected to):
        such a job still goes back to its old GPUs if nobody claimed or took them (after claim_current)."""
        self._register(jobs, claim=False)

    def _register(self, jobs: Iterable[JobView], *, claim: bool) -> None:
        # Runs for every running job every round: kept to plain loops and local names.
        pos_of = {sid: i for i, sid in enumerate(self.server_ids)}
        free_sets: list[set[int]] | None = None
        homes, home_plans, claimants = self._home, self._home_plan, self._claimants
        claimed, nodes = self._claimed, self._nodes
        for job in jobs:
            cur = job.current
            if cur is None:
                continue
            job_id = job.job_id
            if job_id in homes:
                continue
            if free_sets is None:
                free_sets = [set(x) for x in self.free_idx]
                self._start_claims()
                claimed = self._claimed
            assert claimed is not None
            home: list[tuple[int, tuple[int, ...], float, float]] = []
            num_gpus = 0
            valid = True
            for share in cur.shares:
                i = pos_of.get(share.server_id)
                idx = share.gpu_indices
                if i is None or not idx or any(h[0] == i for h in home):
                    valid = False
                    break
                free, on = free_sets[i], claimed[i]
                for g in idx:
                    if g not in free or (claim and g in on):
                        valid = False
                        break
                if not valid or (len(idx) > 1 and len(set(idx)) != len(idx)):
                    valid = False
                    break
                num_gpus += len(idx)
                home.append((i, idx, float(share.num_cpus), float(share.mem_gb)))
            if not valid or num_gpus != job.num_gpus:
                continue
            if nodes and job_id in nodes and not _has_shape(home, nodes[job_id]):
                continue  # not where the job may run: keeping it would only push others aside
            homes[job_id] = home
            home_plans[job_id] = [(i, len(idx)) for i, idx, _, _ in home]
            if not claim:
                continue
            claimants.add(job_id)
            for i, idx, cpus, mem_gb in home:
                on = claimed[i]
                for g in idx:
                    on[g] = job_id
                self.reserved_cpus[i] += cpus
                self.reserved_mem_gb[i] += mem_gb
                self.unreserved_cpus[i] -= cpus
                self.unreserved_mem_gb[i] -= mem_gb
        if claim and claimed is not None:
            # Bucketed once here rather than per claim: a round claims for most of its jobs.
            self.num_unclaimed = [n - len(on) for n, on in zip(self.num_free, claimed, strict=True)]
            self._ubuckets = [[] for _ in self._buckets]
            for i, n in enumerate(self.num_unclaimed):
                self._ubuckets[n].append(i)

    def release(self, job_id: int) -> None:
        """Drop a job's claims and reservations: it was placed, left pending, or lost a GPU."""
        if job_id not in self._claimants:
            return
        self._claimants.discard(job_id)
        claimed = self._claimed
        assert claimed is not None
        for i, idx, cpus, mem_gb in self._home[job_id]:
            on = claimed[i]
            for g in idx:
                if on.get(g) == job_id:
                    del on[g]
            self._reserve(i, -cpus, -mem_gb)
            self._refresh_unclaimed(i)

    def home_servers(self, owner: int) -> Plan | None:
        """The owner's current servers with its GPU count on each, if it can still get that many GPUs
        there without taking another claimant's (its own while it claims them, else unclaimed ones)."""
        home = self._home.get(owner)
        if home is None:
            return None
        if owner not in self._claimants and any(self.num_unclaimed[i] < len(idx) for i, idx, _, _ in home):
            return None
        return self._home_plan[owner]

    def home_plan(self, owner: int, dc: Sequence[float], dm: Sequence[float], *, strict: bool) -> Plan | None:
        """`home_servers` if they also hold the demand (dc, dm); `take` then returns its own GPUs.

        Strict: the demand must also fit beside what the other claimants there reserved, unless the
        job asks no more than it held (keeping its own is never pushing a neighbour out). Lenient:
        only what is free counts; used once no other server has unclaimed room.
        """
        home = self._home.get(owner)
        if home is None:
            return None
        holds = owner in self._claimants
        free_cpus, free_mem = self.free_cpus, self.free_mem_gb
        for i, idx, held_cpus, held_mem_gb in home:
            k = len(idx)
            if not holds and self.num_unclaimed[i] < k:
                return None
            need_cpus, need_mem_gb = k * dc[i], k * dm[i]
            if need_cpus > free_cpus[i] + EPS or need_mem_gb > free_mem[i] + EPS:
                return None
            if strict:
                own_cpus, own_mem_gb = (held_cpus, held_mem_gb) if holds else (0.0, 0.0)
                beside = (
                    need_cpus <= self.unreserved_cpus[i] + own_cpus + EPS
                    and need_mem_gb <= self.unreserved_mem_gb[i] + own_mem_gb + EPS
                )
                # Shares report floor(cores), so "no more than held" compares floors.
                no_more = holds and int(need_cpus + EPS) <= held_cpus and need_mem_gb <= held_mem_gb + EPS
                if not (beside or no_more):
                    return None
        return self._home_plan[owner]

    def _start_claims(self) -> None:
        if self._claimed is not None:
            return
        self._claimed = [{} for _ in range(self.num_servers)]
        self.num_unclaimed = list(self.num_free)
        self.reserved_cpus = [0.0] * self.num_servers
        self.reserved_mem_gb = [0.0] * self.num_servers
        self.unreserved_cpus = list(self.free_cpus)
        self.unreserved_mem_gb = list(self.free_mem_gb)
        self._ubuckets = [list(b) for b in self._buckets]

    def _reserve(self, i: int, cpus: float, mem_gb: float) -> None:
        self.reserved_cpus[i] += cpus
        self.reserved_mem_gb[i] += mem_gb
        self.unreserved_cpus[i] -= cpus
        self.unreserved_mem_gb[i] -= mem_gb

    def _refresh_unclaimed(self, i: int) -> None:
        assert self._claimed is not None
        new = self.num_free[i] - len(self._claimed[i])
        old = self.num_unclaimed[i]
        if new != old:
            self._ubuckets[old].remove(i)
            insort(self._ubuckets[new], i)
            self.num_unclaimed[i] = new

    # -- queries -------------------------------------------------------------------------------
    def gpus_fitting(self, i: int, c: float, m: float) -> int:
        """How many GPUs server i can take at per-GPU demand (c, m) right now."""
        k = self.num_free[i]
        if c > 0:
            k = min(k, int((self.free_cpus[i] + EPS) / c))
        if m > 0:
            k = min(k, int((self.free_mem_gb[i] + EPS) / m))
        return k

    def totals_allow(self, num_gpus: int, c: float, m: float) -> bool:
        """Cheap necessary condition for a uniform per-GPU demand: the cluster-wide free totals."""
        return (
            num_gpus <= self.free_gpu_count
            and num_gpus * c <= self.total_free_cpus + EPS
            and num_gpus * m <= self.total_free_mem_gb + EPS
        )

    def find_packed(self, num_gpus: int, dc: Sequence[float], dm: Sequence[float]) -> Plan | None:
        """Synergy's placement-sensitive choice (resources/cluster.py `allocate_synergy_placement`).

        A multi-GPU job first goes whole onto the server with the fewest free GPUs that fits its
        whole vector (ties: lowest position); otherwise (and always for a single GPU) it is spread
        GPU by GPU from the servers with the fewest free GPUs, as the reference's min-heap does:
        that heap drains the emptiest fitting server before moving to the next, so we take as many
        GPUs as fit from each server in ascending (free GPUs, position) order. Claims are ignored
        (`find` is the claim-aware entry point).
        """
        return self._packed(num_gpus, dc, dm, self._buckets, self.free_cpus, self.free_mem_gb)

    def find_first_fit(self, num_gpus: int, dc: Sequence[float], dm: Sequence[float]) -> Plan | None:
        """Synergy's first fit (resources/cluster.py `_top_synergy_gpus`, the reference's default).

        Scan the free GPUs in cluster order (server by server, lowest index first) and take a GPU
        whenever its server still has the per-GPU share, holding resources during the scan. Claims
        are ignored (`find` is the claim-aware entry point).
        """
        return self._first_fit(num_gpus, dc, dm, self.num_free, self.free_cpus, self.free_mem_gb)

    def _packed(
        self,
        num_gpus: int,
        dc: Sequence[float],
        dm: Sequence[float],
        buckets: list[list[int]],
        free_cpus: list[float],
        free_mem: list[float],
    ) -> Plan | None:
        """find_packed over the given availability: bucket b holds the servers with b usable GPUs."""
        if num_gpus > 1:
            plan = self._packed_whole(num_gpus, dc, dm, buckets, free_cpus, free_mem, None)
            if plan is not None:
                return plan
        return self._packed_spread(num_gpus, dc, dm, buckets, free_cpus, free_mem)

    def _packed_whole(
        self,
        num_gpus: int,
        dc: Sequence[float],
        dm: Sequence[float],
        buckets: list[list[int]],
        free_cpus: list[float],
        free_mem: list[float],
        unclaimed: list[int] | None,
    ) -> Plan | None:
        """Packed's first stage: the whole job on the fitting server with the fewest usable GPUs.

        With `unclaimed`, among the fitting servers of the fewest free GPUs the one where the fewest
        claimed GPUs must be taken wins (ties: lowest position).
        """
        for b in range(num_gpus, len(buckets)):
            pick = -1
            for i in buckets[b]:
                if free_cpus[i] + EPS >= num_gpus * dc[i] and free_mem[i] + EPS >= num_gpus * dm[i]:
                    if unclaimed is None or unclaimed[i] >= num_gpus:
                        return [(i, num_gpus)]
                    if pick < 0 or unclaimed[i] > unclaimed[pick]:
                        pick = i
            if pick >= 0:
                return [(pick, num_gpus)]
        return None

    def _packed_spread(
        self,
        num_gpus: int,
        dc: Sequence[float],
        dm: Sequence[float],
        buckets: list[list[int]],
        free_cpus: list[float],
        free_mem: list[float],
    ) -> Plan | None:
        """Packed's second stage: as many GPUs as fit from each server, fewest usable GPUs first."""
        plan: Plan = []
        need = num_gpus
        for b in range(1, len(buckets)):
            for i in buckets[b]:
                # gpus_fitting, inlined: this loop is the allocators' hot path.
                k = b
                c = dc[i]
                if c > 0:
                    kc = int((free_cpus[i] + EPS) / c)
                    if kc < k:
                        k = kc
                m = dm[i]
                if m > 0:
                    km = int((free_mem[i] + EPS) / m)
                    if km < k:
                        k = km
                if k <= 0:
                    continue
                if k >= need:
                    plan.append((i, need))
                    return plan
                plan.append((i, k))
                need -= k
        return None

    def _first_fit(
        self,
        num_gpus: int,
        dc: Sequence[float],
        dm: Sequence[float],
        num_free: list[int],
        free_cpus: list[float],
        free_mem: list[float],
    ) -> Plan | None:
        """find_first_fit over the given availability (usable GPUs, cores and GB per server)."""
        plan: Plan = []
        need = num_gpus
        for i in range(self.num_servers):
            k = num_free[i]
            if k <= 0:
                continue
            # gpus_fitting, inlined: this loop is the allocators' hot path.
            c = dc[i]
            if c > 0:
                kc = int((free_cpus[i] + EPS) / c)
                if kc < k:
                    k = kc
            m = dm[i]
            if m > 0:
                km = int((free_mem[i] + EPS) / m)
                if km < k:
                    k = km
            if k <= 0:
                continue
            if k >= need:
                plan.append((i, need))
                return plan
            plan.append((i, k))
            need -= k
        return None

    def find(
        self,
        strategy: str,
        num_gpus: int,
        dc: Sequence[float],
        dm: Sequence[float],
        owner: int | None = None,
    ) -> Plan | None:
        """Servers for `num_gpus` GPUs at demand (dc, dm) under `strategy` (`packed` or `first_fit`).

        Without claims this is the strategy's rule. With claims, the owner's home first
        (`home_plan`, strict), then each stage of the rule (packed: a whole server, then the spread;
        first fit: its one scan) over, in turn: unclaimed GPUs with unreserved cores/memory, so that
        nobody is pushed off what it held; unclaimed GPUs with all free cores/memory (a GPU taken
        is a claimant moved, while reserved cores are only last round's demand, which may shrink);
        everything free. The owner's home, lenient, comes after the first of those. The stages keep
        the rule's order (packed never splits a job a server could hold whole), and the last try
        fails exactly when the plain rule does, so claims never decide whether a demand fits, only
        where it goes. An owner with a node count goes through `_find_nodes` instead (same stages).
        """
        if self._nodes and owner in self._nodes:
            return self._find_nodes(strategy, num_gpus, dc, dm, owner)
        if self._claimed is None:
            if strategy == PACKED:
                return self._packed(num_gpus, dc, dm, self._buckets, self.free_cpus, self.free_mem_gb)
            return self._first_fit(num_gpus, dc, dm, self.num_free, self.free_cpus, self.free_mem_gb)
        at_home = owner is not None and owner in self._home
        if at_home:
            assert owner is not None
            plan = self.home_plan(owner, dc, dm, strict=True)
            if plan is not None:
                return plan
        claims = self.has_claims
        stages = ("whole", "spread") if strategy == PACKED and num_gpus > 1 else ("spread",)
        for stage in stages:
            if claims:
                plan = self._stage(strategy, stage, num_gpus, dc, dm, unclaimed=True, unreserved=True)
                if plan is not None:
                    return plan
            if at_home:
                assert owner is not None
                at_home = False  # once is enough: the state has not changed since
                plan = self.home_plan(owner, dc, dm, strict=False)
                if plan is not None:
                    return plan
            if claims:
                plan = self._stage(strategy, stage, num_gpus, dc, dm, unclaimed=True, unreserved=False)
                if plan is not None:
                    return plan
            plan = self._stage(strategy, stage, num_gpus, dc, dm, unclaimed=False, unreserved=False)
            if plan is not None:
                return plan
        return None

    def _find_nodes(
        self, strategy: str, num_gpus: int, dc: Sequence[float], dm: Sequence[float], owner: int
    ) -> Plan | None:
        """`find` for an owner with a node count N: N servers with num_gpus / N GPUs each at the
        demand, in `find`'s stages (home strict; unclaimed GPUs with unreserved, then any free
        cores/memory, the home lenient in between; everything free). The last stage fails exactly
        when fewer than N servers fit, so claims decide only where the job goes here too."""
        nodes, per_node = self._nodes[owner]
        if per_node < 1 or nodes * per_node != num_gpus:
            return None  # an uneven split (infeasible) or a GPU count other than the job's
        if self._servers_with_free(per_node) < nodes:
            return None  # too few servers with k free GPUs: no stage below can succeed
        buckets, free, cpus, mem = self._buckets, self.num_free, self.free_cpus, self.free_mem_gb
        if self._claimed is None:
            return self._nodes_stage(strategy, nodes, per_node, dc, dm, buckets, free, cpus, mem)
        at_home = owner in self._home
        if at_home:
            plan = self.home_plan(owner, dc, dm, strict=True)
            if plan is not None:
                return plan
        claims = self.has_claims
        ubuckets, unclaimed = self._ubuckets, self.num_unclaimed
        if claims:
            ucpus, umem = self.unreserved_cpus, self.unreserved_mem_gb
            plan = self._nodes_stage(strategy, nodes, per_node, dc, dm, ubuckets, unclaimed, ucpus, umem)
            if plan is not None:
                return plan
        if at_home:
            plan = self.home_plan(owner, dc, dm, strict=False)
            if plan is not None:
                return plan
        if claims:
            plan = self._nodes_stage(strategy, nodes, per_node, dc, dm, ubuckets, unclaimed, cpus, mem)
            if plan is not None:
                return plan
        prefer = unclaimed if claims else None
        return self._nodes_stage(strategy, nodes, per_node, dc, dm, buckets, free, cpus, mem, prefer)

    def _nodes_stage(
        self,
        strategy: str,
        nodes: int,
        per_node: int,
        dc: Sequence[float],
        dm: Sequence[float],
        buckets: list[list[int]],
        counts: list[int],
        free_cpus: list[float],
        free_mem: list[float],
        unclaimed: list[int] | None = None,
    ) -> Plan | None:
        """One stage of `_find_nodes`: the first `nodes` servers, in the strategy's order, each with
        `per_node` usable GPUs (`counts`, bucketed in `buckets`) and their cores/memory at the demand.

        With `unclaimed` (everything free, while claims stand), the servers where the fewest
        claimed GPUs must be taken come first (strategy order within ties): a claimant that loses
        one GPU has to move whole.
        """
        if strategy == PACKED:
            order: Iterable[int] = (i for b in range(per_node, len(buckets)) for i in buckets[b])
        else:
            order = range(self.num_servers)
        chosen: list[int] = []
        for i in order:
            if (
                counts[i] >= per_node
                and free_cpus[i] + EPS >= per_node * dc[i]
                and free_mem[i] + EPS >= per_node * dm[i]
            ):
                chosen.append(i)
                if unclaimed is None and len(chosen) == nodes:
                    break
        if len(chosen) < nodes:
            return None
        if unclaimed is not None:
            chosen.sort(key=lambda i: max(0, per_node - unclaimed[i]))  # stable
        return [(i, per_node) for i in chosen[:nodes]]

    def _stage(
        self,
        strategy: str,
        stage: str,
        num_gpus: int,
        dc: Sequence[float],
        dm: Sequence[float],
        *,
        unclaimed: bool,
        unreserved: bool,
    ) -> Plan | None:
        """One stage of the strategy's rule over unclaimed (or all free) GPUs and unreserved (or
        all free) cores/memory."""
        cpus, mem = self.availability(unreserved)
        if strategy != PACKED:
            counts = self.num_unclaimed if unclaimed else self.num_free
            return self._first_fit(num_gpus, dc, dm, counts, cpus, mem)
        buckets = self._ubuckets if unclaimed else self._buckets
        if stage == "whole":
            # Over everything free, prefer the server where the fewest claimed GPUs must be taken.
            tie_break = None if unclaimed or not self.has_claims else self.num_unclaimed
            return self._packed_whole(num_gpus, dc, dm, buckets, cpus, mem, tie_break)
        return self._packed_spread(num_gpus, dc, dm, buckets, cpus, mem)

    @property
    def has_claims(self) -> bool:
        """True while some job still claims GPUs (then the unclaimed view differs from the free one)."""
        return bool(self._claimants)

    def find_unclaimed(
        self, strategy: str, num_gpus: int, dc: Sequence[float], dm: Sequence[float], *, unreserved: bool
    ) -> Plan | None:
        """The strategy's rule over unclaimed GPUs only (claims set up), with only the unreserved
        cores/memory if `unreserved`, else with all that is free."""
        cpus, mem = self.availability(unreserved)
        if strategy == PACKED:
            return self._packed(num_gpus, dc, dm, self._ubuckets, cpus, mem)
        return self._first_fit(num_gpus, dc, dm, self.num_unclaimed, cpus, mem)

    def availability(self, unreserved: bool) -> tuple[list[float], list[float]]:
        """Per-server cores and GB to place into: not reserved by claimants, or simply free."""
        if unreserved:
            return self.unreserved_cpus, self.unreserved_mem_gb
        return self.free_cpus, self.free_mem_gb

    def find_uniform(
        self, strategy: str, num_gpus: int, c: float, m: float, owner: int | None = None
    ) -> Plan | None:
        """`find` for the same per-GPU demand (c, m) on every server, with two shortcuts.

        Both strategies fail exactly when the servers together cannot hold `num_gpus` GPUs at
        (c, m) (the spread and the first fit take all they can from every server), a condition
        monotone in the GPU count that stays true while resources are only taken. So a failure
        is remembered per (c, m) until `adjust` frees something, and the free totals are
        checked before any scan. (Claims change neither: `find`'s last step is the plain rule.)
        """
        failed_at = self._failed.get((c, m))
        if failed_at is not None and num_gpus >= failed_at:
            return None  # also right for a node count: its shapes are among the plain rule's
        if self._nodes and owner in self._nodes:
            return self._find_uniform_nodes(strategy, num_gpus, c, m, owner)
        plan = None
        if self.totals_allow(num_gpus, c, m):
            plan = self.find(strategy, num_gpus, self.uniform(c), self.uniform(m), owner)
        if plan is None and (failed_at is None or num_gpus < failed_at):
            self._failed[(c, m)] = num_gpus
        return plan

    def _find_uniform_nodes(
        self, strategy: str, num_gpus: int, c: float, m: float, owner: int
    ) -> Plan | None:
        """`find_uniform` for an owner with a node count (N, k): it fails exactly when fewer than N
        servers hold k GPUs at (c, m) (`_find_nodes`' last stage), which stays true for more servers
        while resources are only taken, so that is remembered per (c, m, k) as the plain failures are."""
        nodes, per_node = self._nodes[owner]
        key = (c, m, per_node)
        failed_at = self._failed_nodes.get(key)
        if failed_at is not None and nodes >= failed_at:
            return None
        plan = None
        if self.totals_allow(num_gpus, c, m):
            plan = self.find(strategy, num_gpus, self.uniform(c), self.uniform(m), owner)
        if plan is None and nodes * per_node == num_gpus and (failed_at is None or nodes < failed_at):
            self._failed_nodes[key] = nodes
        return plan

    # -- mutations -----------------------------------------------------------------------------
    def take(
        self, plan: Plan, dc: Sequence[float], dm: Sequence[float], owner: int | None = None
    ) -> list[HeldShare]:
        """Commit a plan: GPU indices and the per-GPU cores/memory on each server of it.

        Indices: the owner's GPUs of last round first (while free and nobody else's claim), then
        unclaimed ones, then other claimants' (lowest index first within each); a claimant losing
        a GPU drops all its claims. The owner's claims end here (it is placed).
        """
        claimed = self._claimed
        own: dict[int, tuple[int, ...]] = {}
        home = self._home.get(owner) if claimed is not None and owner is not None else None
        if home is not None:
            assert owner is not None
            if owner in self._claimants:
                # The plan home_plan returned (the common case), or the same servers and counts.
                if plan is self._home_plan[owner] or plan == self._home_plan[owner]:
                    return self._take_home(owner, home, dc, dm)
                self.release(owner)
            own = {i: idx for i, idx, _, _ in home}
        shares = []
        for i, k in plan:
            idx = self.free_idx[i]
            if claimed is None or (not claimed[i] and i not in own):
                gpus = tuple(idx[:k])
                del idx[:k]
            else:
                gpus = self._pick(i, k, own.get(i, ()))
            cpus = k * dc[i]
            mem_gb = k * dm[i]
            self.free_cpus[i] -= cpus
            self.free_mem_gb[i] -= mem_gb
            self.total_free_cpus -= cpus
            self.total_free_mem_gb -= mem_gb
            if claimed is not None:
                self.unreserved_cpus[i] -= cpus
                self.unreserved_mem_gb[i] -= mem_gb
            self._move(i, self.num_free[i] - k)
            shares.append(HeldShare(i, gpus, cpus, mem_gb))
        return shares

    def _take_home(
        self,
        owner: int,
        home: list[tuple[int, tuple[int, ...], float, float]],
        dc: Sequence[float],
        dm: Sequence[float],
    ) -> list[HeldShare]:
        """`take` of exactly the owner's claimed GPUs: the common case, so done without re-bucketing
        the unclaimed counts (k fewer free and k fewer claimed GPUs leave them as they were)."""
        self._claimants.discard(owner)
        claimed = self._claimed
        assert claimed is not None
        free_cpus, free_mem, free_idx = self.free_cpus, self.free_mem_gb, self.free_idx
        buckets, num_free = self._buckets, self.num_free
        shares = []
        for i, idx, held_cpus, held_mem_gb in home:
            on, free = claimed[i], free_idx[i]
            for g in idx:
                del on[g]
                free.remove(g)
            k = len(idx)
            cpus = k * dc[i]
            mem_gb = k * dm[i]
            free_cpus[i] -= cpus
            free_mem[i] -= mem_gb
            self.total_free_cpus -= cpus
            self.total_free_mem_gb -= mem_gb
            self.reserved_cpus[i] -= held_cpus
            self.reserved_mem_gb[i] -= held_mem_gb
            self.unreserved_cpus[i] += held_cpus - cpus
            self.unreserved_mem_gb[i] += held_mem_gb - mem_gb
            old = num_free[i]
            buckets[old].remove(i)
            insort(buckets[old - k], i)
            num_free[i] = old - k
            self.free_gpu_count -= k
            shares.append(HeldShare(i, idx, cpus, mem_gb))
        return shares

    def _pick(self, i: int, k: int, mine: tuple[int, ...]) -> tuple[int, ...]:
        """k free GPU indices of server i, removed from the free list (see `take` for the order)."""
        idx = self.free_idx[i]
        assert self._claimed is not None
        on = self._claimed[i]
        chosen = [g for g in mine if g not in on and g in idx][:k]
        if len(chosen) < k:
            taken = set(chosen)
            for g in idx:
                if g not in on and g not in taken:
                    chosen.append(g)
                    if len(chosen) == k:
                        break
        if len(chosen) < k:
            # Someone must move: as few claimants as possible, and the smallest jobs, since a
            # job that loses one GPU loses all of them.
            by_claimant: dict[int, list[int]] = {}
            for g in idx:
                if g in on:
                    by_claimant.setdefault(on[g], []).append(g)
            while len(chosen) < k:
                need = k - len(chosen)
                job_id = min(by_claimant, key=lambda j: self._victim_key(j, len(by_claimant[j]), need))
                chosen.extend(by_claimant.pop(job_id)[:need])
                self.release(job_id)  # it cannot get its GPUs back: stop holding the others
        for g in chosen:
            idx.remove(g)
        if len(mine) == k and len(chosen) == k and set(chosen) == set(mine):
            return mine  # exactly the GPUs it held, in the order it held them
        return tuple(sorted(chosen))

    def _victim_key(self, job_id: int, here: int, need: int) -> tuple[bool, int, int]:
        """Order of claimants to take GPUs from: those whose `here` GPUs cover `need` first, the
        smallest job among them; else the most GPUs here; then the lowest job id (determinism)."""
        size = sum(len(idx) for _, idx, _, _ in self._home[job_id])
        return (here < need, size if here >= need else -here, job_id)

    def adjust(self, share: HeldShare, cpus: float, mem_gb: float) -> None:
        """Set a held share's cores and memory to new values, returning or claiming the difference."""
        i = share.server_pos
        self.free_cpus[i] += share.cpus - cpus
        self.free_mem_gb[i] += share.mem_gb - mem_gb
        self.total_free_cpus += share.cpus - cpus
        self.total_free_mem_gb += share.mem_gb - mem_gb
        if self._claimed is not None:
            self.unreserved_cpus[i] += share.cpus - cpus
            self.unreserved_mem_gb[i] += share.mem_gb - mem_gb
        if cpus < share.cpus or mem_gb < share.mem_gb:
            self._failed.clear()  # something was freed: remembered failures may fit now
            self._failed_nodes.clear()
        share.cpus = cpus
        share.mem_gb = mem_gb

    def _move(self, i: int, new_free: int) -> None:
        old = self.num_free[i]
        self._buckets[old].remove(i)
        insort(self._buckets[new_free], i)
        self.num_free[i] = new_free
        self.free_gpu_count -= old - new_free
        if self._claimed is not None:
            self._refresh_unclaimed(i)

    # -- output --------------------------------------------------------------------------------
    def server_shares(self, held: Sequence[HeldShare]) -> tuple[ServerShare, ...]:
        """Frozen shares for a Placement (integer cores: floor of the float cores held)."""
        ids = self.server_ids
        return tuple(ServerShare(ids[h.server_pos], h.gpu_indices, int(h.cpus + EPS), h.mem_gb) for h in held)


def _has_shape(home: Sequence[tuple[int, tuple[int, ...], float, float]], shape: tuple[int, int]) -> bool:
    """True when a home (one entry per server) spans exactly `shape` = (servers, GPUs on each)."""
    nodes, per_node = shape
    return len(home) == nodes and all(len(idx) == per_node for _, idx, _, _ in home)


class PlanBuilder:
    """Collects one Decision per input job and returns them in input order."""

    def __init__(self, ordered_jobs: Sequence[JobView]) -> None:
        self._jobs = ordered_jobs
        self._decisions: list[Decision | None] = [None] * len(ordered_jobs)

    def placed(self, pos: int, shares: tuple[ServerShare, ...], speedup: float, reason: str) -> None:
        job_id = self._jobs[pos].job_id
        self._decisions[pos] = Decision(job_id, Outcome.PLACED, reason, Placement(job_id, shares, speedup))

    def pending(self, pos: int, reason: str) -> None:
        self._decisions[pos] = Decision(self._jobs[pos].job_id, Outcome.PENDING, reason)

    def infeasible(self, pos: int, reason: str) -> None:
        self._decisions[pos] = Decision(self._jobs[pos].job_id, Outcome.INFEASIBLE, reason)

    def is_decided(self, pos: int) -> bool:
        return self._decisions[pos] is not None

    def build(self) -> RoundPlan:
        missing = [self._jobs[p].job_id for p, d in enumerate(self._decisions) if d is None]
        if missing:
            raise RuntimeError(f"allocator left jobs without a decision: {missing}")
        return RoundPlan(tuple(self._decisions))  # type: ignore[arg-type]


def pending_reason(num_gpus: int, free_gpu_count: int) -> str:
    """`insufficient_gpus` when the GPUs were not there, `fragmented` when CPU/memory were missing."""
    return reasons.INSUFFICIENT_GPUS if num_gpus > free_gpu_count else reasons.FRAGMENTED


class DemandCache:
    """Per-call memo of each job's best case on the cluster shape, keyed by (id(profile), num_gpus).

    Hashing a frozen profile walks its whole matrix, so within one allocate() call we look it up
    by identity (the jobs keep their profiles alive for the whole call) and fall back to the
    module-level caches in throughput.py only once per distinct profile object.
    """

    def __init__(self, shape: ServerShape | None) -> None:
        self.shape = shape
        self._best: dict[tuple[int, int], OperatingPoint] = {}

    def best(self, job: JobView) -> OperatingPoint:
        key = (id(job.profile), job.num_gpus)
        point = self._best.get(key)
        if point is None:
            assert self.shape is not None, "a feasible job implies a non-empty cluster"
            point = self._best[key] = best_case(job.profile, job.num_gpus, self.shape)
        return point

    def fixed_point(self, job: JobView) -> OperatingPoint:
        """The per-GPU point of a fixed-demand job on the cluster shape, and its speed there."""
        assert self.shape is not None
        c = job.cpus_per_gpu_override
        m = job.mem_gb_per_gpu_override
        cpus = self.shape.cpus_per_gpu if c is None else float(c)
        mem_gb = self.shape.mem_gb_per_gpu if m is None else float(m)
        speed = relative_speed(job.profile, job.num_gpus, self.shape, cpus, mem_gb)
        return OperatingPoint(cpus, mem_gb, speed)
