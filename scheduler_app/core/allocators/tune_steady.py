"""Tune's rounds that repeat: which plans are stable, and holding the running jobs without claims."""

from __future__ import annotations

from collections.abc import Sequence

from scheduler_app.core import reasons
from scheduler_app.core.placement import EPS, HeldJob, Plan, has_fixed_demand
from scheduler_app.core.placement.plan import DemandCache
from scheduler_app.core.placement.state import RoundState
from scheduler_app.core.throughput import with_penalty
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

    def hold_current(self, order: list[int]) -> int:
        """The common round, cheaply: where the jobs that ran last round come first in `order` and
        each of their placements holds it at its best case (`RoundState.take_current`), hold them
        there without claims, as claiming them and keeping each home would (keep_home's first try,
        in this order, leaves the same state and no claim standing). Returns how many jobs of
        `order` it held; 0 (nothing changed) where the round does not have that shape."""
        jobs, state = self.jobs, self.state
        if state.has_node_counts:
            return 0
        count = 0
        for pos in order:
            if jobs[pos].current is None:
                break
            count += 1
        if not count or any(jobs[pos].current is not None for pos in order[count:]):
            return 0
        best_of, held, on_server = self.demands.best, self.held, self.on_server
        for pos in order[:count]:
            job = jobs[pos]
            if has_fixed_demand(job):
                return self.undo_holds()
            best = best_of(job)
            shares = state.take_current(job.current, job.num_gpus, best.cpus_per_gpu, best.mem_gb_per_gpu)  # type: ignore[arg-type]
            if shares is None:
                return self.undo_holds()
            if (
                len(shares) > 1
                and with_penalty(best.speed, job.profile, len(shares), job.num_gpus) != best.speed
            ):
                self.settled = False  # as settles() judges a spread job
            h = HeldJob(job, pos, len(held), shares, best, best.speed, reasons.BEST_CASE, True)
            held.append(h)
            for share in shares:
                on_server[share.server_pos].append(h)
        return count

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
