"""Tune's rounds that repeat: which plans are stable, and holding the running jobs without claims."""

from __future__ import annotations

from collections.abc import Sequence

from scheduler_app.core import reasons
from scheduler_app.core.placement import EPS, HeldJob, HeldShare, Plan, has_fixed_demand
from scheduler_app.core.placement.plan import DemandCache
from scheduler_app.core.placement.setup import running_first
from scheduler_app.core.placement.state import RoundState
from scheduler_app.core.throughput import ServerShape, with_penalty
from scheduler_app.core.types import ClusterSnapshot, JobView


class SteadyRound:
    """The part of tune's round (TuneRound) that keeps its plan's `stable` word and takes its
    common shape cheaply: set up by TuneRound (`settled` starts True, `hold` keeps it up to date)."""

    jobs: Sequence[JobView]
    snapshot: ClusterSnapshot
    state: RoundState
    demands: DemandCache
    held: list[HeldJob]
    on_server: list[list[HeldJob]]
    settled: bool
    left_out: list[int]
    shape: ServerShape | None

    def hold_current(self, order: list[int]) -> int:
        """The common round, cheaply: where the jobs that ran last round come first in `order` and
        keep_home would keep each on its GPUs without making room (its strict tries, or its fallback
        demand on what is free there: `RoundState.take_home_now`), hold them there without claims,
        as claiming them and keeping each home would: in this order that leaves the same state and
        no claim standing. A job that asks more than it held (under the move guard every running job
        is seen holding its proportional floor) is judged beside what the others' claims reserved,
        worked out as `_register` and `_take_home` would (`unreserved_now`); a job with a node count
        (the move guard's one server) only where its placement has that shape, as `_register` wants.
        Returns how many jobs of `order` it held; 0 (nothing changed) where the round does not have
        that shape (a fixed demand, a newcomer before a running job, room to be made, a stale home)."""
        jobs, state = self.jobs, self.state
        count = running_first(jobs, order)
        if not count:
            return 0
        best_of, held, on_server = self.demands.best, self.held, self.on_server
        nodes = state.has_node_counts
        unreserved: tuple[list[float], list[float]] | None = None
        take, uniform, home_points = state.take_home_now, state.uniform, self.home_points
        # Tune's own rounds try only the best case at home (`home_points` says so with `best_only`):
        # then a job on one server is held by the strict try inlined below, as take_home_now's
        # `_take_one_now` would hold it (the same tests, float operations and order), without the
        # calls and lists; any other job, or one that try does not hold, takes the general path.
        best_only = getattr(type(self).home_points, "best_only", False) and not nodes
        pos_of = state.server_positions()
        free_cpus, free_mem, free_idx = state.free_cpus, state.free_mem_gb, state.free_idx
        num_free = state.num_free
        best_case = reasons.BEST_CASE
        fallback_demand = self.fallback_demand
        for pos in order[:count]:
            job = jobs[pos]
            if job.cpus_per_gpu_override is not None or job.mem_gb_per_gpu_override is not None:
                return self.undo_holds()  # a fixed demand
            shape = state.node_shape(job.job_id) if nodes else None
            if shape is not None:
                shares_now = job.current.shares  # type: ignore[union-attr]
                if len(shares_now) != shape[0] or any(len(s.gpu_indices) != shape[1] for s in shares_now):
                    return self.undo_holds()  # not its shape: no home in the walk (claims.py `_register`)
                self.settled = False  # as settles() judges a job with a node count
            best = best_of(job)
            cur = job.current
            assert cur is not None
            if best_only and len(cur.shares) == 1:
                share = cur.shares[0]
                i = pos_of.get(share.server_id)
                idx = share.gpu_indices
                k = len(idx)
                if i is not None and k and k == job.num_gpus:
                    cpus = k * best.cpus_per_gpu
                    mem_gb = k * best.mem_gb_per_gpu
                    held_cpus, held_mem_gb = float(share.num_cpus), float(share.mem_gb)
                    fits = not (cpus > free_cpus[i] + EPS or mem_gb > free_mem[i] + EPS)
                    if fits and (int(cpus + EPS) > held_cpus or mem_gb > held_mem_gb + EPS):
                        # Asks more than it held: beside the others' reservations, once they are
                        # worked out (the general path below does that first).
                        fits = unreserved is not None and not (
                            cpus > unreserved[0][i] + held_cpus + EPS
                            or mem_gb > unreserved[1][i] + held_mem_gb + EPS
                        )
                    free = free_idx[i]
                    own_gpus = (len(set(idx)) == k and set(idx).issubset(free)) if k > 1 else idx[0] in free
                    point, speed, reason = best, best.speed, best_case
                    if own_gpus and not fits and unreserved is not None:
                        # The general path's strict try fails here as this one did (the others'
                        # reservations are worked out already), so it takes the fallback demand on
                        # what is free there, not strictly: inlined too (a job held below its best
                        # case last round, most of a round where cores are short).
                        dc, dm, point, speed, reason = fallback_demand(best)
                        cpus, mem_gb = k * dc[i], k * dm[i]
                        if cpus > free_cpus[i] + EPS or mem_gb > free_mem[i] + EPS:
                            return self.undo_holds()
                        fits = True
                        if reason != best_case:
                            self.settled = False  # as settles() judges a job below its best case
                    if fits and own_gpus:
                        for g in idx:
                            free.remove(g)
                        if unreserved is not None:  # as _take_home: its reservation gone, its demand taken
                            unreserved[0][i] += held_cpus - cpus
                            unreserved[1][i] += held_mem_gb - mem_gb
                        free_cpus[i] -= cpus
                        free_mem[i] -= mem_gb
                        state.total_free_cpus -= cpus
                        state.total_free_mem_gb -= mem_gb
                        num_free[i] -= k
                        state.free_gpu_count -= k
                        shares = [HeldShare(i, idx, cpus, mem_gb)]
                        h = HeldJob(job, pos, len(held), shares, point, speed, reason, point is not None)
                        held.append(h)
                        on_server[i].append(h)
                        continue
            # keep_home's tries, in its order: each home point strictly, beside the others' claims.
            shares, point, reason = None, None, reasons.BEST_CASE
            for point in home_points(job, best):
                dc, dm = uniform(point.cpus_per_gpu), uniform(point.mem_gb_per_gpu)
                shares = take(cur, job.num_gpus, dc, dm, unreserved, bucketed=False)
                if shares is None and unreserved is None:
                    # It may ask more than it held (under the move guard every job holds its
                    # proportional floor): then it stays beside what the others reserved, if that fits.
                    unreserved = self.unreserved_now(order[:count])
                    shares = take(cur, job.num_gpus, dc, dm, unreserved, bucketed=False)
                if shares is not None:
                    reason = reasons.BEST_CASE if point is best else reasons.INTERMEDIATE
                    break
            if shares is not None:
                assert point is not None
                speed, revertible = point.speed, True
            else:
                # Then its fallback demand on what is free there (no room made: that walks instead).
                dc, dm, point, speed, reason = self.fallback_demand(best)
                shares = take(cur, job.num_gpus, dc, dm, unreserved, strict=False, bucketed=False)
                if shares is None:
                    return self.undo_holds()
                revertible = point is not None
            if reason != reasons.BEST_CASE:
                self.settled = False  # as settles() judges a job below its best case
            elif len(shares) > 1 and with_penalty(speed, job.profile, len(shares), job.num_gpus) != speed:
                self.settled = False  # as settles() judges a spread job
            h = HeldJob(job, pos, len(held), shares, point, speed, reason, revertible)
            held.append(h)
            for share in shares:
                on_server[share.server_pos].append(h)
        state.rebucket()
        return count

    def unreserved_now(self, running: list[int]) -> tuple[list[float], list[float]]:
        """The cores and memory per server the claims of the jobs at `running` (this round's prefix,
        all to be held) would leave unreserved at this point of `hold_current`: each claims its current
        shares in policy order (claim_admitted), and each job held since took its own back and its
        demand instead, in hold order, the same float operations as the walk's."""
        jobs = self.jobs
        cpus, mem_gb = self.state.current_unreserved([jobs[pos] for pos in sorted(running)])
        for h in self.held:
            for share, before in zip(h.shares, h.job.current.shares, strict=True):  # type: ignore[union-attr]
                i = share.server_pos
                cpus[i] += float(before.num_cpus) - share.cpus
                mem_gb[i] += float(before.mem_gb) - share.mem_gb
        return cpus, mem_gb

    def undo_holds(self) -> int:
        """Forget what hold_current held: the round starts again from its fresh state."""
        self.state = RoundState(self.snapshot, self.jobs)
        self.held = []
        self.on_server = [[] for _ in range(self.state.num_servers)]
        self.settled = True
        return 0

    def settles(
        self,
        pos: int,
        plan: Plan,
        dc: Sequence[float],
        dm: Sequence[float],
        speed: float,
        reason: str,
        at_home: bool,
    ) -> bool:
        """Whether holding the job at `pos` on `plan` keeps the round's plan stable (RoundPlan.stable).

        Why a plan whose every admitted job is held at its best case (no peer shrunk, none left
        out, no node count, no spread penalty) repeats: in the next round each job claims these
        GPUs and is taken in the same order (GPU count, then policy order). Every job before it was
        taken the same, so the cores and memory free at its turn are the same, down to the float
        operations; keep_home's first try then holds it here at its best case again if that demand
        is at most what is free on each server (checked below; keep_home's strict try checked it
        already), the "no more than held" test passing since it holds exactly that demand. The plan
        then has every job at its best-case speed, which is also the bound of the repack test, so
        the sticky plan stands. With some jobs gone, every job after them finds as much free or
        more (a chain of float subtractions with terms left out is never smaller), every job is
        still admitted when all were placed, and the same holds.
        """
        if reason != reasons.BEST_CASE:
            return False
        job = self.jobs[pos]
        if len(plan) > 1 and with_penalty(speed, job.profile, len(plan), job.num_gpus) != speed:
            return False
        state = self.state
        if state.node_shape(job.job_id) is not None:
            return False
        if at_home:
            return True
        free_cpus, free_mem_gb = state.free_cpus, state.free_mem_gb
        return all(k * dc[i] <= free_cpus[i] + EPS and k * dm[i] <= free_mem_gb[i] + EPS for i, k in plan)

    def best_case_throughput(self) -> float:
        """After `run`: an upper bound on the throughput of any tune plan for the same round, every
        job that GPU admission took (placed, or left pending by step 5) at its best-case speed."""
        if self.shape is None:
            return 0.0
        demands, total = self.demands, 0.0
        for pos in sorted([h.pos for h in self.held] + self.left_out):  # policy order, as the plan
            job = self.jobs[pos]
            point = demands.fixed_point(job) if has_fixed_demand(job) else demands.best(job)
            total += point.speed * job.num_gpus
        return total

    def throughput_bound(self) -> float | None:
        """After `run`: an upper bound on the throughput of any tune plan of this round, tighter than
        `best_case_throughput` where cores or memory are short (None where it does not apply).

        Every plan places some of the admitted jobs, each at one of its points (`home_points`: the
        best case, tune_matrix's intermediate ones), at proportional (speed 1), or not at all, and
        together they take no more cores and memory than the snapshot has free. For any prices
        lam, mu >= 0 on a core and a GB, the plan's throughput is then at most lam x cores + mu x GB
        free plus, per job, the most that one of its choices is worth less its cores and GB at those
        prices (Lagrangian duality). Only for rounds where every admitted job runs on one server (the
        move guard's node count: no spread penalty) at a per-GPU demand (no fixed demand); a job at
        proportional takes at least the smallest server's share per GPU, and each placement may
        overrun a server by EPS, so that much more is counted free.
        """
        servers = self.snapshot.servers
        if self.shape is None or not servers or any(s.num_gpus <= 0 for s in servers):
            return None
        state, jobs, demands = self.state, self.jobs, self.demands
        prop_cpus = min(s.num_cpus / s.num_gpus for s in servers)
        prop_mem_gb = min(s.mem_gb / s.num_gpus for s in servers)
        groups: dict[tuple[tuple[float, float, float], ...], int] = {}
        admitted = [h.pos for h in self.held] + self.left_out
        for pos in admitted:
            job = jobs[pos]
            g = job.num_gpus
            if has_fixed_demand(job) or state.node_shape(job.job_id) != (1, g):
                return None
            points = self.home_points(job, demands.best(job))
            choices = (
                *((g * p.speed, g * p.cpus_per_gpu, g * p.mem_gb_per_gpu) for p in points),
                (float(g), g * prop_cpus, g * prop_mem_gb),  # proportional
                (0.0, 0.0, 0.0),  # left pending
            )
            groups[choices] = groups.get(choices, 0) + 1
        slack = EPS * (len(admitted) + 1)
        cpus = sum(float(s.free_cpus) for s in servers) + slack
        mem_gb = sum(float(s.free_mem_gb) for s in servers) + slack
        items = list(groups.items())

        def bound(lam: float, mu: float) -> float:
            total = lam * cpus + mu * mem_gb
            for choices, n in items:
                total += n * max(v - lam * c - mu * m for v, c, m in choices)
            return total

        def prices(lam: float, mu: float, on_cores: bool) -> list[float]:
            """0 and the prices where two choices of a job are worth the same (the bound's kinks)."""
            out = {0.0}
            for choices, _ in items:
                for v1, c1, m1 in choices:
                    for v2, c2, m2 in choices:
                        if on_cores and c1 > c2:
                            x = (v1 - mu * m1 - v2 + mu * m2) / (c1 - c2)
                        elif not on_cores and m1 > m2:
                            x = (v1 - lam * c1 - v2 + lam * c2) / (m1 - m2)
                        else:
                            continue
                        if x > 0:
                            out.add(x)
            return sorted(out)

        lam = mu = 0.0
        best = bound(lam, mu)
        for on_cores in (True, False, True):
            for x in prices(lam, mu, on_cores):
                value = bound(x, mu) if on_cores else bound(lam, x)
                if value < best:
                    best = value
                    lam, mu = (x, mu) if on_cores else (lam, x)
        return best
