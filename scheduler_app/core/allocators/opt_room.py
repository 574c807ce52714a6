"""opt's making of room (tune's step 5): surplus taken back from the cheapest peers on the servers a
job will go to, so that it is placed; part of opt's round (allocators/opt.py)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from scheduler_app.core import reasons
from scheduler_app.core.allocators.opt_lp import EPS
from scheduler_app.core.placement import HeldJob, Plan
from scheduler_app.core.placement.setup import RoundSetup
from scheduler_app.core.throughput import OperatingPoint
from scheduler_app.core.types import JobView


class OptRoom(RoundSetup):
    """The room-making half of opt's round (`_OptRound`), which provides these attributes."""

    on_server: list[list[HeldJob]]

    # opt's own (allocators/opt.py): a job's points below `target`; placing it at a demand.
    lower_points: Callable[[int, OperatingPoint], list[OperatingPoint]]
    try_place: Callable[..., bool]

    def make_room_and_place(
        self,
        pos: int,
        dc: Sequence[float],
        dm: Sequence[float],
        point: OperatingPoint | None,
        reason: str,
        *,
        revertible: bool,
        per_server: bool = False,
    ) -> None:
        """Take surplus back, then place; else pending. With claims, room is made on the job's own
        servers first, then on servers chosen by unclaimed GPUs, then as without claims (as tune)."""
        job, state = self.jobs[pos], self.state
        home = state.home_servers(job.job_id)
        tried: list[Plan] = []
        for where in ("home", "unclaimed", "free"):
            if where == "home":
                if home is None:
                    continue
                servers = home
            elif where == "unclaimed":
                if not state.has_claims:
                    continue
                servers = self.room_servers(job, dc, dm, state.num_unclaimed)
                if sum(k for _, k in servers) < job.num_gpus:
                    continue
            else:
                servers = self.room_servers(job, dc, dm, state.num_free)
                if not servers and job.num_nodes is not None:
                    continue  # too few servers for its node count
            if servers in tried:
                continue
            tried.append(servers)
            self.take_back(servers, dc, dm)
            if self.try_place(pos, dc, dm, point, reason, revertible=revertible, per_server=per_server):
                return
        state.release(job.job_id)
        self.builder.pending(pos, state.node_pending_reason(job) or reasons.FRAGMENTED)

    # -- tune's step 5, choosing the cheapest peers --------------------------------------------
    def take_back(self, servers: Plan, dc: Sequence[float], dm: Sequence[float]) -> None:
        """Free cores/memory on `servers` (k GPUs each), shrinking peers that hold more than proportional."""
        for i, k in servers:
            need_cpus, need_mem_gb = self.shortfall(i, k, dc, dm)
            if need_cpus <= EPS and need_mem_gb <= EPS:
                continue
            while need_cpus > EPS or need_mem_gb > EPS:
                peer = self.cheapest_peer(i, need_cpus, need_mem_gb)
                if peer is None:
                    break
                freed_cpus, freed_mem_gb = self.shrink(peer, i, need_cpus, need_mem_gb)
                need_cpus -= freed_cpus
                need_mem_gb -= freed_mem_gb

    def room_servers(
        self, job: JobView, dc: Sequence[float], dm: Sequence[float], num_free: Sequence[int]
    ) -> Plan:
        """Where the job will go once room is made: the server holding all its GPUs that lacks the
        least (multi-GPU), else servers by fewest free GPUs (tune's choice). A job with a node count
        N: the N servers with num_gpus / N GPUs that lack the least (none if fewer have them).
        `num_free`: the free GPUs per server, or the unclaimed ones."""
        state = self.state
        num_gpus = job.num_gpus
        shape = state.node_shape(job.job_id)
        if shape is not None:
            return self._node_room_servers(shape, dc, dm, num_free)
        if num_gpus > 1:
            servers = range(state.num_servers)
            whole = [(self._lacking(i, num_gpus, dc, dm), i) for i in servers if num_free[i] >= num_gpus]
            if whole:
                return [(min(whole)[1], num_gpus)]
        chosen: Plan = []
        need = num_gpus
        for n, i in sorted((n, i) for i, n in enumerate(num_free) if n > 0):
            chosen.append((i, min(n, need)))
            need -= min(n, need)
            if need == 0:
                break
        return chosen

    def _node_room_servers(
        self, shape: tuple[int, int], dc: Sequence[float], dm: Sequence[float], num_free: Sequence[int]
    ) -> Plan:
        """`room_servers` for a node count: the N servers with num_gpus / N GPUs lacking least, or []."""
        nodes, per_node = shape
        servers = range(self.state.num_servers)
        lacking = sorted((self._lacking(i, per_node, dc, dm), i) for i in servers if num_free[i] >= per_node)
        if len(lacking) < nodes:
            return []
        return sorted((i, per_node) for _, i in lacking[:nodes])

    def _lacking(self, i: int, k: int, dc: Sequence[float], dm: Sequence[float]) -> float:
        """The cores and memory server i lacks for k GPUs at (dc, dm), in proportional shares."""
        state = self.state
        short_cpus = max(0.0, k * dc[i] - state.free_cpus[i])
        short_mem_gb = max(0.0, k * dm[i] - state.free_mem_gb[i])
        return short_cpus / max(state.prop_cpus[i], EPS) + short_mem_gb / max(state.prop_mem_gb[i], EPS)

    def cheapest_peer(self, i: int, need_cpus: float, need_mem_gb: float) -> HeldJob | None:
        """The revertible peer on server i that frees the most of the need per unit of throughput lost."""
        state = self.state
        best: tuple[float, int] | None = None
        best_peer = None
        for peer in self.on_server[i]:
            if not peer.revertible:
                continue
            share = next(s for s in peer.shares if s.server_pos == i)
            surplus_cpus = share.cpus - share.num_gpus * state.prop_cpus[i]
            surplus_mem_gb = share.mem_gb - share.num_gpus * state.prop_mem_gb[i]
            covered = 0.0
            if need_cpus > EPS:
                covered += max(0.0, min(surplus_cpus, need_cpus)) / need_cpus
            if need_mem_gb > EPS:
                covered += max(0.0, min(surplus_mem_gb, need_mem_gb)) / need_mem_gb
            if covered <= EPS:
                continue
            key = (peer.weight * (peer.speed - 1.0) / covered, peer.seq)
            if best is None or key < best:
                best, best_peer = key, peer
        return best_peer

    def shrink(self, peer: HeldJob, i: int, need_cpus: float, need_mem_gb: float) -> tuple[float, float]:
        """Step the peer down to its fastest lower point covering the need on server i, else revert
        it whole to proportional; return what that freed on server i (a peer that cannot revert
        without over-committing one of its servers is marked non-revertible and frees nothing)."""
        state = self.state
        share = next(s for s in peer.shares if s.server_pos == i)
        current = peer.point
        assert current is not None
        k = share.num_gpus
        for point in self.lower_points(peer.pos, current):
            freed_cpus = k * (current.cpus_per_gpu - point.cpus_per_gpu)
            freed_mem_gb = k * (current.mem_gb_per_gpu - point.mem_gb_per_gpu)
            if freed_cpus + EPS >= need_cpus and freed_mem_gb + EPS >= need_mem_gb:
                for s in peer.shares:
                    state.adjust(s, s.num_gpus * point.cpus_per_gpu, s.num_gpus * point.mem_gb_per_gpu)
                peer.point, peer.speed, peer.reason = point, point.speed, reasons.INTERMEDIATE
                return freed_cpus, freed_mem_gb
        targets = [
            (s, s.num_gpus * state.prop_cpus[s.server_pos], s.num_gpus * state.prop_mem_gb[s.server_pos])
            for s in peer.shares
        ]
        if any(
            cpus - s.cpus > state.free_cpus[s.server_pos] + EPS
            or mem_gb - s.mem_gb > state.free_mem_gb[s.server_pos] + EPS
            for s, cpus, mem_gb in targets
        ):
            peer.revertible = False
            return 0.0, 0.0
        before_cpus, before_mem_gb = share.cpus, share.mem_gb
        for s, cpus, mem_gb in targets:
            state.adjust(s, cpus, mem_gb)
        peer.point, peer.speed, peer.revertible = None, 1.0, False
        peer.reason = reasons.REVERTED_TO_PROPORTIONAL
        return before_cpus - share.cpus, before_mem_gb - share.mem_gb
