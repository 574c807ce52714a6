"""The round's shared free capacity (`RoundState`): where jobs may go, and what placing them takes.

Interface (allocators and policies use only these):
- `RoundState(snapshot, jobs=())`: free GPUs / cores / memory per server position for one round,
  mutated as jobs are placed. `uniform(x)` / `fixed_demand(job)` / `prop_cpus`, `prop_mem_gb`: per-
  server per-GPU demand vectors (`dc[i]` cores, `dm[i]` GB on server i), so one code path serves a
  uniform demand, each server's proportional share and fixed demands.
- `find(score, num_gpus, dc, dm, owner=None, filters=())` -> Plan or None: the score's rule
  (scores.py; a name such as "packed" is accepted) walked through the stages (stages.py), over the
  servers every filter allows (filters.py). `find_uniform` adds failure memos for a uniform
  demand; `find_packed` / `find_first_fit` are the plain rules, claims ignored. `walk(owner, ...,
  phases)` runs any phase (opt's balanced choice) through the same stages; `view(stage)` is what
  one stage offers.
- `take(plan, dc, dm, owner)` commits a plan (-> HeldShare per server), `adjust(share, cpus, GB)`
  gives back or claims cores and memory of a share already held, `server_shares(held)` freezes them.
- Stickiness (`claim_current`, `remember_current`, `release`, `home_servers`, `home_plan`):
  claims.py. Node counts (`require_nodes`, `node_shape`, `node_servers`, `node_pending_reason`):
  nodes.py.
Cores are tracked as floats (a capped best case can be 4.8 cores per GPU); a share reports
floor(cores) as its integer core count, so the sum of reported cores never exceeds what was free.
GPU indices are taken lowest first, servers are named by their position in `snapshot.servers`.
"""

from __future__ import annotations

from bisect import insort
from collections.abc import Sequence

from scheduler_app.core.placement.claims import Home
from scheduler_app.core.placement.filters import ServerFilter, allowed_servers, restrict
from scheduler_app.core.placement.nodes import NodeCounts
from scheduler_app.core.placement.plan import EPS, HeldShare, Plan
from scheduler_app.core.placement.scores import FIRST_FIT, PACKED, Phase, Score, score_named
from scheduler_app.core.placement.stages import (
    ALL_FREE,
    STAGES,
    STAGES_WITHOUT_CLAIMS,
    STRICT,
    UNRESERVED_ONLY,
    Stage,
    View,
)
from scheduler_app.core.types import ClusterSnapshot, JobView, ServerShare

# id(snapshot) -> (snapshot, then RoundState's fresh lists for it), the snapshot kept so that its id is
# not reused meanwhile; a few snapshots (a live service makes one a round), cleared whole past that.
_FRESH: dict[int, tuple] = {}
_FRESH_MAX = 16


def _fresh_lists(snapshot: ClusterSnapshot) -> tuple:
    """What a fresh RoundState of `snapshot` starts from (its server ids, free GPU indices sorted, free
    GPU counts, cores and GB, proportional shares, servers bucketed by free GPUs), remembered."""
    servers = snapshot.servers
    free_idx = [sorted(s.free_gpus) for s in servers]
    num_free = [len(x) for x in free_idx]
    buckets: list[list[int]] = [[] for _ in range(max(num_free, default=0) + 1)]
    for i, n in enumerate(num_free):
        buckets[n].append(i)
    fresh = (
        snapshot,
        [s.server_id for s in servers],
        free_idx,
        num_free,
        [float(s.free_cpus) for s in servers],
        [float(s.free_mem_gb) for s in servers],
        [s.num_cpus / s.num_gpus if s.num_gpus else 0.0 for s in servers],
        [s.mem_gb / s.num_gpus if s.num_gpus else 0.0 for s in servers],
        buckets,
    )
    if len(_FRESH) >= _FRESH_MAX:
        _FRESH.clear()
    _FRESH[id(snapshot)] = fresh
    return fresh


class RoundState(NodeCounts):
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
        fresh = _FRESH.get(id(snapshot))
        if fresh is None or fresh[0] is not snapshot:
            fresh = _fresh_lists(snapshot)
        # Copies of the snapshot's fresh state (worked out once per snapshot: a simulation's rounds
        # share one), each list this round's own.
        _, ids, free_idx, num_free, free_cpus, free_mem_gb, prop_cpus, prop_mem_gb, buckets = fresh
        self.server_ids = list(ids)
        self.free_idx: list[list[int]] = [list(x) for x in free_idx]
        self.num_free: list[int] = list(num_free)
        self.free_cpus: list[float] = list(free_cpus)
        self.free_mem_gb: list[float] = list(free_mem_gb)
        self.prop_cpus: list[float] = list(prop_cpus)
        self.prop_mem_gb: list[float] = list(prop_mem_gb)
        self.free_gpu_count = sum(self.num_free)
        self.total_free_cpus = sum(self.free_cpus)
        self.total_free_mem_gb = sum(self.free_mem_gb)
        self._buckets: list[list[int]] = [list(x) for x in buckets]
        self._uniform: dict[float, list[float]] = {}
        self._failed: dict[tuple[float, float], int] = {}  # (c, m) -> fewest GPUs that did not fit
        self._failed_nodes: dict[tuple[float, float, int], int] = {}  # (c, m, k) -> fewest servers
        # Servers whose usable GPUs, cores or memory grew in some view (a freed share, a dropped claim
        # or reservation), in order: everything else only shrinks within a round (nodes.py `_unfit`).
        self._grown: list[int] = []
        self._unfit: dict[tuple[int, ...], tuple[object, ...]] = {}
        # Stickiness, set up by claim_current (until then `_claimed` is None and every choice is the
        # plain rule). `_home`: job id -> its valid current placement as (server position, GPU
        # indices, cores, GB) per share; `_claimants`: the jobs whose claims still stand.
        self._home: dict[int, Home] = {}
        self._home_plan: dict[int, Plan] = {}  # job id -> its home as a plan (returned as is)
        self._claimants: set[int] = set()
        self._claimed: list[dict[int, int]] | None = None  # per server: claimed GPU index -> job id
        self.num_unclaimed: list[int] = []
        self.reserved_cpus: list[float] = []
        self.reserved_mem_gb: list[float] = []
        self.unreserved_cpus: list[float] = []  # free minus reserved, kept up to date for the hot loops
        self.unreserved_mem_gb: list[float] = []
        self._ubuckets: list[list[int]] = []
        self._pos_of: dict[int, int] | None = None  # server id -> position, once asked (take_current)
        # The plain rule's view: these lists are only ever changed in place, so it stays current.
        self._free_view = View(self._buckets, self.num_free, self.free_cpus, self.free_mem_gb, None)
        # Node counts: job id -> (servers, GPUs on each) for the jobs with `num_nodes` (usually none,
        # so the hot paths test one empty dict).
        self._nodes: dict[int, tuple[int, int]] = {}
        self.require_nodes(jobs)

    @property
    def has_node_counts(self) -> bool:
        """True when some job of the round has a node count (`require_nodes`)."""
        return bool(self._nodes)

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

    # -- stages ------------------------------------------------------------------------------
    def view(self, stage: Stage) -> View:
        """What `stage` offers now (a home stage's view is ANYWHERE's; `walk` handles homes)."""
        claims = bool(self._claimants)
        if stage.gpus == ALL_FREE:
            if not claims and stage.room == ALL_FREE:
                return self._free_view
            buckets, counts = self._buckets, self.num_free
        else:
            buckets, counts = self._ubuckets, self.num_unclaimed
        if stage.room == UNRESERVED_ONLY:
            cpus, mem_gb = self.unreserved_cpus, self.unreserved_mem_gb
        else:
            cpus, mem_gb = self.free_cpus, self.free_mem_gb
        # Over everything free, prefer the servers where the fewest claimed GPUs must be taken.
        prefer = self.num_unclaimed if claims and stage.gpus == ALL_FREE else None
        return View(buckets, counts, cpus, mem_gb, prefer)

    def walk(
        self,
        owner: int | None,
        num_gpus: int,
        dc: Sequence[float],
        dm: Sequence[float],
        phases: Sequence[Phase],
        allowed: Sequence[bool] | None = None,
        *,
        home_tried: bool = False,
    ) -> Plan | None:
        """The first plan any phase finds, each phase over every stage of STAGES in turn.

        The owner's home is offered at the home stages of the first phase (the state does not
        change in between, so once is enough); stages that differ from ANYWHERE only by claims
        are skipped while none stand. ANYWHERE is the plain rule, so the walk fails exactly when
        the plain rule would on the same state. `allowed` (per server position, from the filters)
        hides servers from every stage, the owner's home included. `home_tried`: the caller already
        tried the strict HOME stage (with nothing changed since).
        """
        at_home = owner is not None and owner in self._home
        if at_home and allowed is not None:
            assert owner is not None
            at_home = all(allowed[i] for i, _ in self._home_plan[owner])
        stages = STAGES if self._claimants else STAGES_WITHOUT_CLAIMS
        for phase in phases:
            for stage in stages:
                if stage.home is not None:
                    if not at_home:
                        continue
                    assert owner is not None
                    strict = stage.home == STRICT
                    at_home = strict  # the lenient try closes the home stages
                    if strict and home_tried:
                        continue
                    plan = self.home_plan(owner, dc, dm, strict=strict)
                else:
                    view = self.view(stage)
                    if allowed is not None:
                        view = restrict(view, allowed)
                    plan = phase(view, num_gpus, dc, dm)
                if plan is not None:
                    return plan
        return None

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
        """The packed rule (scores.PACKED) over everything free, claims ignored (`find` heeds them)."""
        return PACKED.place(self._free_view, num_gpus, dc, dm)

    def find_first_fit(self, num_gpus: int, dc: Sequence[float], dm: Sequence[float]) -> Plan | None:
        """The first-fit rule (scores.FIRST_FIT) over everything free, claims ignored."""
        return FIRST_FIT.place(self._free_view, num_gpus, dc, dm)

    def find(
        self,
        score: Score | str,
        num_gpus: int,
        dc: Sequence[float],
        dm: Sequence[float],
        owner: int | None = None,
        filters: Sequence[ServerFilter] = (),
    ) -> Plan | None:
        """Servers for `num_gpus` GPUs at demand (dc, dm) under `score` (or its name).

        Without claims or filters this is the score's rule over everything free. Otherwise the
        rule walks the stages (`walk`): the owner's home, unclaimed GPUs with unreserved room,
        the home leniently, unclaimed GPUs with any free room, everything free; each phase of the
        score (packed: whole, then spread) in that order, so the stages keep the rule's order
        (packed never splits a job a server could hold whole). An owner with a node count goes
        through `_find_nodes` instead (same stages).
        """
        if isinstance(score, str):
            score = score_named(score)
        allowed = allowed_servers(self.servers, filters) if filters else None
        if self._nodes and owner in self._nodes:
            assert owner is not None
            return self._find_nodes(score, num_gpus, dc, dm, owner, allowed)
        if self._claimed is None and allowed is None:
            return score.place(self._free_view, num_gpus, dc, dm)
        if allowed is None and owner is not None and owner in self._home:
            # The HOME stage ahead of the walk: in a steady round most jobs end here, so they skip
            # the walk's set-up.
            plan = self.home_plan(owner, dc, dm, strict=True)
            if plan is not None:
                return plan
            return self.walk(owner, num_gpus, dc, dm, score.phases(num_gpus), home_tried=True)
        return self.walk(owner, num_gpus, dc, dm, score.phases(num_gpus), allowed)

    def find_uniform(
        self,
        score: Score | str,
        num_gpus: int,
        c: float,
        m: float,
        owner: int | None = None,
        filters: Sequence[ServerFilter] = (),
    ) -> Plan | None:
        """`find` for the same per-GPU demand (c, m) on every server, with two shortcuts.

        Both strategies fail exactly when the servers together cannot hold `num_gpus` GPUs at
        (c, m) (the spread and the first fit take all they can from every server), a condition
        monotone in the GPU count that stays true while resources are only taken. So a failure
        is remembered per (c, m) until `adjust` frees something, and the free totals are
        checked before any scan. (Claims change neither: `find`'s last step is the plain rule.)
        Filters bypass the memo: a failure on some servers says nothing of the others.
        """
        if filters:
            if not self.totals_allow(num_gpus, c, m):
                return None
            return self.find(score, num_gpus, self.uniform(c), self.uniform(m), owner, filters)
        failed_at = self._failed.get((c, m))
        if failed_at is not None and num_gpus >= failed_at:
            return None  # also right for a node count: its shapes are among the plain rule's
        if self._nodes and owner in self._nodes:
            return self._find_uniform_nodes(score, num_gpus, c, m, owner)
        plan = None
        if self.totals_allow(num_gpus, c, m):
            plan = self.find(score, num_gpus, self.uniform(c), self.uniform(m), owner)
        if plan is None and (failed_at is None or num_gpus < failed_at):
            self._failed[(c, m)] = num_gpus
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
            self._grown.append(i)
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
        if len(held) == 1:  # a job on one server (most of them): no generator
            h = held[0]
            return (ServerShare(ids[h.server_pos], h.gpu_indices, int(h.cpus + EPS), h.mem_gb),)
        return tuple(ServerShare(ids[h.server_pos], h.gpu_indices, int(h.cpus + EPS), h.mem_gb) for h in held)
