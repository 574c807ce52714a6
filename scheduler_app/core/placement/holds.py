"""Holding running jobs on their GPUs before any claim: the allocators' cheap path for a round's common shape.

Where the jobs that ran last round come first in a round's order and each stays on its GPUs, claiming
them all (claims.py) and sending each home in that order leaves the same state as taking each where it
is, with no claim standing; these take them so, with the same tests and float operations
(tune's `hold_current`, proportional's, tune's extension of a stable plan). The mixin is part of
`RoundState` (state.py), through `Claims`.
"""

from __future__ import annotations

from bisect import insort
from collections.abc import Callable, Iterable, Sequence

from scheduler_app.core.placement.plan import EPS, HeldShare
from scheduler_app.core.types import JobView, Placement, ServerShare, ServerView


class Holds:
    """Taking current placements before any claim (set up by RoundState.__init__)."""

    servers: Sequence[ServerView]
    server_ids: list[int]
    free_idx: list[list[int]]
    num_free: list[int]
    free_cpus: list[float]
    free_mem_gb: list[float]
    free_gpu_count: int
    total_free_cpus: float
    total_free_mem_gb: float
    _buckets: list[list[int]]
    _claimed: list[dict[int, int]] | None
    _pos_of: dict[int, int] | None
    uniform: Callable[[float], list[float]]  # RoundState's: a per-GPU value as a per-server vector

    def server_positions(self) -> dict[int, int]:
        """Server id -> position (made once per round, on first use)."""
        pos_of = self._pos_of
        if pos_of is None:
            pos_of = self._pos_of = {sid: i for i, sid in enumerate(self.server_ids)}
        return pos_of

    def take_current(self, cur: Placement, num_gpus: int, c: float, m: float) -> list[HeldShare] | None:
        """`take_home_now` at the same per-GPU demand (c, m) on every server, asking no more than held."""
        return self.take_home_now(cur, num_gpus, self.uniform(c), self.uniform(m))

    def take_home_now(
        self,
        cur: Placement,
        num_gpus: int,
        dc: Sequence[float],
        dm: Sequence[float],
        unreserved: tuple[list[float], list[float]] | None = None,
        *,
        strict: bool = True,
        bucketed: bool = True,
    ) -> list[HeldShare] | None:
        """Before any claim: take the GPUs of `cur` at per-GPU demand (dc, dm), as `_take_home` would
        for a claimant whose home try (`home_plan`, `strict` or not) holds it there; None (nothing
        taken) where that try might not.

        It holds it when, as `_register` and `home_plan` judge it: `cur` names known servers once each
        and `num_gpus` GPUs free here, and on each server the demand fits what is free and, strictly,
        either asks no more than the share holds, or (given `unreserved`, `current_unreserved`'s
        lists, updated here as `_take_home` updates the state's) fits beside what the other claimants
        reserved. A round whose jobs with a placement all come first in its order, each held this
        way, then leaves no claim standing, and the state is the one claiming and keeping them would
        leave (tune's and proportional's `hold_current`). `bucketed` False leaves the free-GPU
        buckets as they were, for the caller to `rebucket` once it has taken them all.
        """
        assert self._claimed is None, "take_current comes before any claim"
        pos_of = self._pos_of
        if pos_of is None:
            pos_of = self._pos_of = {sid: i for i, sid in enumerate(self.server_ids)}
        free_cpus, free_mem, free_idx = self.free_cpus, self.free_mem_gb, self.free_idx
        if len(cur.shares) == 1:
            return self._take_one_now(cur.shares[0], num_gpus, dc, dm, unreserved, strict, bucketed)
        taken: list[tuple[int, tuple[int, ...], float, float, float, float]] = []
        servers: set[int] = set()
        total = 0
        # Plain loops and local names: this runs for every running job of most rounds.
        for share in cur.shares:
            i = pos_of.get(share.server_id)
            idx = share.gpu_indices
            if i is None or not idx or i in servers:
                return None
            servers.add(i)
            k = len(idx)
            cpus = k * dc[i]
            mem_gb = k * dm[i]
            if cpus > free_cpus[i] + EPS or mem_gb > free_mem[i] + EPS:
                return None
            held_cpus, held_mem_gb = float(share.num_cpus), float(share.mem_gb)
            if strict and (int(cpus + EPS) > held_cpus or mem_gb > held_mem_gb + EPS):
                # Asks more than it held: home_plan's strict try holds it only beside the others.
                if unreserved is None:
                    return None
                if cpus > unreserved[0][i] + held_cpus + EPS or mem_gb > unreserved[1][i] + held_mem_gb + EPS:
                    return None
            free = free_idx[i]
            if k == 1:
                if idx[0] not in free:
                    return None
            elif len(set(idx)) != k or not set(idx).issubset(free):
                return None
            total += k
            taken.append((i, idx, cpus, mem_gb, held_cpus, held_mem_gb))
        if total != num_gpus:
            return None
        buckets, num_free = self._buckets, self.num_free
        shares = []
        for i, idx, cpus, mem_gb, held_cpus, held_mem_gb in taken:
            if unreserved is not None:  # as _take_home: its reservation gone, its demand taken
                unreserved[0][i] += held_cpus - cpus
                unreserved[1][i] += held_mem_gb - mem_gb
            free = free_idx[i]
            for g in idx:
                free.remove(g)
            k = len(idx)
            free_cpus[i] -= cpus
            free_mem[i] -= mem_gb
            self.total_free_cpus -= cpus
            self.total_free_mem_gb -= mem_gb
            old = num_free[i]
            if bucketed:
                buckets[old].remove(i)
                insort(buckets[old - k], i)
            num_free[i] = old - k
            self.free_gpu_count -= k
            shares.append(HeldShare(i, idx, cpus, mem_gb))
        return shares

    def _take_one_now(
        self,
        share: ServerShare,
        num_gpus: int,
        dc: Sequence[float],
        dm: Sequence[float],
        unreserved: tuple[list[float], list[float]] | None,
        strict: bool,
        bucketed: bool,
    ) -> list[HeldShare] | None:
        """`take_home_now` for a placement on one server (most jobs): the same tests and float
        operations in the same order, without the loops' lists."""
        assert self._pos_of is not None
        i = self._pos_of.get(share.server_id)
        idx = share.gpu_indices
        k = len(idx)
        if i is None or not k or k != num_gpus:
            return None
        cpus = k * dc[i]
        mem_gb = k * dm[i]
        if cpus > self.free_cpus[i] + EPS or mem_gb > self.free_mem_gb[i] + EPS:
            return None
        held_cpus, held_mem_gb = float(share.num_cpus), float(share.mem_gb)
        if strict and (int(cpus + EPS) > held_cpus or mem_gb > held_mem_gb + EPS):
            if unreserved is None:
                return None
            if cpus > unreserved[0][i] + held_cpus + EPS or mem_gb > unreserved[1][i] + held_mem_gb + EPS:
                return None
        free = self.free_idx[i]
        if k == 1:
            if idx[0] not in free:
                return None
            free.remove(idx[0])
        else:
            if len(set(idx)) != k or not set(idx).issubset(free):
                return None
            for g in idx:
                free.remove(g)
        if unreserved is not None:  # as _take_home: its reservation gone, its demand taken
            unreserved[0][i] += held_cpus - cpus
            unreserved[1][i] += held_mem_gb - mem_gb
        self.free_cpus[i] -= cpus
        self.free_mem_gb[i] -= mem_gb
        self.total_free_cpus -= cpus
        self.total_free_mem_gb -= mem_gb
        num_free = self.num_free
        old = num_free[i]
        if bucketed:
            self._buckets[old].remove(i)
            insort(self._buckets[old - k], i)
        num_free[i] = old - k
        self.free_gpu_count -= k
        return [HeldShare(i, idx, cpus, mem_gb)]

    def take_kept(self, held: Sequence[tuple[Placement, int, float, float]]) -> bool:
        """`take_home_now(cur, num_gpus, uniform(c), uniform(m))` (strict, no reservations, not
        bucketed) for each (cur, num_gpus, c, m) of `held` in turn, where each is kept exactly: its
        cores and memory on each server (k x c, k x m) are its share's own whole cores and memory, so
        the Placement built for it would be `cur` itself. The same float operations in the same order;
        False at the first that is not so (the state is then part-taken: the caller drops it).
        Rebucket after (`rebucket`)."""
        assert self._claimed is None, "take_kept comes before any claim"
        pos_of = self._pos_of
        if pos_of is None:
            pos_of = self._pos_of = {sid: i for i, sid in enumerate(self.server_ids)}
        free_cpus, free_mem, free_idx = self.free_cpus, self.free_mem_gb, self.free_idx
        num_free, total_cpus, total_mem_gb = self.num_free, self.total_free_cpus, self.total_free_mem_gb
        free_gpus = self.free_gpu_count
        done = True
        # Plain loops and local names: every running job of a round extended with arrivals.
        for cur, num_gpus, c, m in held:
            shares = cur.shares
            if len(shares) != 1:  # a job on several servers: take_home_now's general path
                self.total_free_cpus, self.total_free_mem_gb = total_cpus, total_mem_gb
                self.free_gpu_count = free_gpus
                taken = self.take_home_now(cur, num_gpus, self.uniform(c), self.uniform(m), bucketed=False)
                total_cpus, total_mem_gb = self.total_free_cpus, self.total_free_mem_gb
                free_gpus = self.free_gpu_count
                if taken is None or any(
                    int(t.cpus + EPS) != s.num_cpus or t.mem_gb != s.mem_gb
                    for t, s in zip(taken, shares, strict=True)
                ):
                    done = False
                    break
                continue
            share = shares[0]
            i = pos_of.get(share.server_id)
            idx = share.gpu_indices
            k = len(idx)
            if i is None or k != num_gpus:
                done = False
                break
            cpus = k * c
            mem_gb = k * m
            # Fits what is free (take_home_now), asks no more than held (strict) and is held exactly.
            if (
                cpus > free_cpus[i] + EPS
                or mem_gb > free_mem[i] + EPS
                or int(cpus + EPS) != share.num_cpus
                or mem_gb != share.mem_gb
            ):
                done = False
                break
            free = free_idx[i]
            if k == 1:
                if idx[0] not in free:
                    done = False
                    break
                free.remove(idx[0])
            else:
                if len(set(idx)) != k or not set(idx).issubset(free):
                    done = False
                    break
                for g in idx:
                    free.remove(g)
            free_cpus[i] -= cpus
            free_mem[i] -= mem_gb
            total_cpus -= cpus
            total_mem_gb -= mem_gb
            num_free[i] -= k
            free_gpus -= k
        self.total_free_cpus, self.total_free_mem_gb = total_cpus, total_mem_gb
        self.free_gpu_count = free_gpus
        return done

    def rebucket(self) -> None:
        """Bucket the servers by their free GPUs again, from `num_free` (after `take_home_now` calls
        with `bucketed` False): each bucket in position order, as `insort` keeps it. In place, since
        views hold the lists."""
        buckets = self._buckets
        for bucket in buckets:
            bucket.clear()
        for i, n in enumerate(self.num_free):
            buckets[n].append(i)

    def current_unreserved(self, jobs: Iterable[JobView]) -> tuple[list[float], list[float]]:
        """The cores and memory per server that `claim_current(jobs)` would leave unreserved, for
        `take_current`: what the snapshot has free less each job's current shares, in `jobs`' order
        (the same float operations as `_register`'s). Exact where every one of those placements is
        valid (a round that `take_current` holds whole)."""
        pos_of = self._pos_of
        if pos_of is None:
            pos_of = self._pos_of = {sid: i for i, sid in enumerate(self.server_ids)}
        cpus = [float(s.free_cpus) for s in self.servers]
        mem_gb = [float(s.free_mem_gb) for s in self.servers]
        for job in jobs:
            if job.current is None:
                continue
            for share in job.current.shares:
                i = pos_of.get(share.server_id)
                if i is not None:
                    cpus[i] -= float(share.num_cpus)
                    mem_gb[i] -= float(share.mem_gb)
        return cpus, mem_gb
