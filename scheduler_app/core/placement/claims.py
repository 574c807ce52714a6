"""Stickiness: jobs claim the GPUs they held last round and reserve the cores and memory they had.

Round mode re-decides every job, but a moved job is a real restart. After admission an allocator
calls `state.claim_current(admitted_jobs)`; each job whose `current` placement is valid on the
snapshot then *claims* those GPU indices and *reserves* the cores and memory it held, and
`find*` / `take` take `owner=job_id`. A claimant goes back to exactly its GPUs (and, while its
demand is unchanged, exactly its shares) whenever they still hold its demand (the HOME stages);
every other placement walks the other stages (stages.py), and `take` picks unclaimed indices
first, then from the fewest, smallest claimants: a claimant that loses a GPU drops all its claims,
since it has to move anyway. The mixin holds the claim bookkeeping of `RoundState` (state.py).
"""

from __future__ import annotations

from bisect import insort
from collections.abc import Callable, Iterable, Sequence

from scheduler_app.core.placement.holds import Holds
from scheduler_app.core.placement.plan import EPS, HeldShare, Plan
from scheduler_app.core.types import JobView, ServerView

Home = list[tuple[int, tuple[int, ...], float, float]]  # (server position, GPU indices, cores, GB)


def has_shape(home: Sequence[tuple[int, tuple[int, ...], float, float]], shape: tuple[int, int]) -> bool:
    """True when a home (one entry per server) spans exactly `shape` = (servers, GPUs on each)."""
    nodes, per_node = shape
    if len(home) != nodes:
        return False
    if nodes == 1:  # every job of a round under the move guard that fits a server: no generator
        return len(home[0][1]) == per_node
    return all(len(idx) == per_node for _, idx, _, _ in home)


class Claims(Holds):
    """The claim half of RoundState: homes, claimed GPU indices, reserved cores and memory."""

    # Set up by RoundState.__init__ (until claim_current, `_claimed` is None: no claims at all).
    servers: Sequence[ServerView]
    num_servers: int
    server_ids: list[int]
    free_idx: list[list[int]]
    num_free: list[int]
    free_cpus: list[float]
    free_mem_gb: list[float]
    free_gpu_count: int
    total_free_cpus: float
    total_free_mem_gb: float
    _buckets: list[list[int]]
    _home: dict[int, Home]
    _home_plan: dict[int, Plan]
    _claimants: set[int]
    _claimed: list[dict[int, int]] | None
    num_unclaimed: list[int]
    reserved_cpus: list[float]
    reserved_mem_gb: list[float]
    unreserved_cpus: list[float]
    unreserved_mem_gb: list[float]
    _ubuckets: list[list[int]]
    _nodes: dict[int, tuple[int, int]]
    _grown: list[int]
    _unfit: dict[tuple[int, ...], tuple[object, ...]]
    _pos_of: dict[int, int] | None
    uniform: Callable[[float], list[float]]  # RoundState's: a per-GPU value as a per-server vector

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
        # Bound once claims start (_start_claims makes these lists).
        reserved_cpus: list[float] = []
        reserved_mem_gb: list[float] = []
        unreserved_cpus: list[float] = []
        unreserved_mem_gb: list[float] = []
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
                reserved_cpus, reserved_mem_gb = self.reserved_cpus, self.reserved_mem_gb
                unreserved_cpus, unreserved_mem_gb = self.unreserved_cpus, self.unreserved_mem_gb
            assert claimed is not None
            home: Home = []
            num_gpus = 0
            valid = True
            for share in cur.shares:
                i = pos_of.get(share.server_id)
                idx = share.gpu_indices
                if i is None or not idx or (home and any(h[0] == i for h in home)):
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
            if nodes and job_id in nodes and not has_shape(home, nodes[job_id]):
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
                reserved_cpus[i] += cpus
                reserved_mem_gb[i] += mem_gb
                unreserved_cpus[i] -= cpus
                unreserved_mem_gb[i] -= mem_gb
        if claim and claimed is not None:
            # Bucketed once here rather than per claim: a round claims for most of its jobs.
            self.num_unclaimed = [n - len(on) for n, on in zip(self.num_free, claimed, strict=True)]
            self._ubuckets = [[] for _ in self._buckets]
            for i, n in enumerate(self.num_unclaimed):
                self._ubuckets[n].append(i)
            self._unfit.clear()  # the unclaimed counts are a new list, reservations changed

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
        self._unfit.clear()

    def _reserve(self, i: int, cpus: float, mem_gb: float) -> None:
        if cpus < 0 or mem_gb < 0:
            self._grown.append(i)  # a reservation dropped: more unreserved room there
        self.reserved_cpus[i] += cpus
        self.reserved_mem_gb[i] += mem_gb
        self.unreserved_cpus[i] -= cpus
        self.unreserved_mem_gb[i] -= mem_gb

    def _refresh_unclaimed(self, i: int) -> None:
        assert self._claimed is not None
        new = self.num_free[i] - len(self._claimed[i])
        old = self.num_unclaimed[i]
        if new != old:
            if new > old:
                self._grown.append(i)
            self._ubuckets[old].remove(i)
            insort(self._ubuckets[new], i)
            self.num_unclaimed[i] = new

    @property
    def has_claims(self) -> bool:
        """True while some job still claims GPUs (then the unclaimed view differs from the free one)."""
        return bool(self._claimants)

    def _take_home(
        self,
        owner: int,
        home: Home,
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
        reserved_cpus, reserved_mem_gb = self.reserved_cpus, self.reserved_mem_gb
        unreserved_cpus, unreserved_mem_gb = self.unreserved_cpus, self.unreserved_mem_gb
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
            reserved_cpus[i] -= held_cpus
            reserved_mem_gb[i] -= held_mem_gb
            unreserved_cpus[i] += held_cpus - cpus
            unreserved_mem_gb[i] += held_mem_gb - mem_gb
            if held_cpus > cpus or held_mem_gb > mem_gb:
                self._grown.append(i)  # it reserved more than it takes: unreserved room grew
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
