"""Synergy-OPT: an LP upper bound on the round's throughput, then a placement that follows the LP's shares.

As PAPERS.md section 3.3 describes it (msr-fiddle/synergy, simulator/ Solver: SolveFirstLP,
SolveSecondLP, RoundRobin), in three steps:
1. Runnable set: GPU-only admission in policy order, exactly as proportional and tune do.
2. LP1 treats the admitted jobs' servers as one machine. Variables y[j][p] >= 0 over each job's
   candidate per-GPU points p (grid points, the capped best case and the proportional share, with
   their speeds from throughput.py); sum_p y[j][p] == 1; sum_j g_j * cpu(p) * y <= free cores;
   sum_j g_j * mem(p) * y <= free memory; maximise sum_j w_j * speed(p) * y. Its optimum is the
   bound (`opt_throughput_bound`, `OptAllocator.solve(...).bound`).
3. The LP's fractional shares are rounded to one point per job and placed on servers with the
   shared placement machinery (core/placement). A job that does not fit at its LP point tries the
   slower points below it, then its proportional share, then takes surplus back from peers (as
   tune's step 5 does), so OPT, like tune, never leaves an admitted job unplaced on servers of one
   shape and never gives one less than its proportional speed. Cores and memory still free at the
   end are handed to placed jobs in policy order (the next faster point that fits).

Throughput weighting: the reference maximises the plain sum of speed-ups (every job counts alike).
We weight each job by its GPU count by default (w_j = g_j), so the objective is throughput in
"proportional GPUs": with every job at its proportional share it equals the number of busy GPUs,
and a bound of 170 on 128 GPUs reads as 1.33x the proportional cluster. `weight_by_gpus=False`
gives the reference's objective; `plan_throughput` measures any allocator's plan in either unit,
which is what the bound is compared against.

Where we match the reference: the LP1 rows (one configuration per job, cluster-wide CPU and memory,
GPU demand multiplying per-GPU amounts), the LP relaxation (the reference also runs it with
ilp=False), and the idea of re-placing jobs the LP cannot place whole.
Where we differ, and why:
- Candidate points are restricted to those at least as fast as proportional, instead of one row
  "expected speed >= fair speed": then every point a job can be rounded to keeps the guarantee, and
  the bound is still an upper bound for tune and tune_matrix, whose points are all in the set.
  Dominated points are dropped and identical jobs merged into classes (opt_lp.py), so the LP has
  a few dozen columns whatever the cluster size.
- No second LP: the reference's LP2 is a feasibility LP with fractional x[s][j] whose fractional
  jobs are then re-placed greedily with min(fair, LP) demands, which can fall below the fair share.
  We round LP1's shares per job (the class's floor counts, best points to the jobs first in policy
  order; the one or two leftover jobs get the fastest point within the LP's average use) and place
  greedily on the real servers in tune's order, choosing for each job the server whose leftover
  cores and memory per free GPU stay closest to what the jobs still to be placed need, so heavy
  and light jobs mix on each server as the LP assumed (plain fewest-free-GPUs packing stacks the
  heavy ones and strands GPUs without cores). Like the reference's LP2, and unlike tune, a
  multi-GPU job may be split over servers even when one server holds it, if that keeps servers
  more balanced and costs no speed (placement_penalty <= 1; the paper's LP2 minimises splits,
  the reference's does not): a 4-GPU job asking for a whole server's cores would otherwise strand
  the server's other four GPUs.
- Storage bandwidth is not modelled; cvxpy + GLPK become scipy's HiGHS (dual simplex).
- A job with a node count (`num_nodes` = N) goes on exactly N servers with num_gpus / N GPUs each,
  the balanced choice picking the N servers whose balance suffers least; room is made only on such
  servers, and it stays pending when none hold it (the LP does not see node counts).
- Stickiness (core/placement/claims.py): a job is first offered the GPUs it held last round; the balanced
  choice then looks at unclaimed GPUs and unreserved cores/memory before everything free, and
  room is made on a job's own servers first. The LP and the rounding never see placements.
The bound is guaranteed for servers of one shape (Synergy's assumption) whose free cores and memory
go with their free GPUs, as in round mode: then proportional, tune and tune_matrix place every
admitted job at a point of the LP's candidate set. On uneven servers the LP uses the cluster's
average shape (throughput.cluster_shape), as every speed in this core does, so there it is an
estimate rather than a guarantee.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from scheduler_app.core import reasons
from scheduler_app.core.allocators.base import Allocator, register_allocator
from scheduler_app.core.allocators.opt_balance import find_balanced
from scheduler_app.core.allocators.opt_lp import (
    EPS,
    OperatingPoints,
    ShareSolution,
    candidate_points,
    single_point,
    solve_share_lp,
)
from scheduler_app.core.allocators.opt_room import OptRoom
from scheduler_app.core.placement import PACKED, HeldJob, Plan, has_fixed_demand
from scheduler_app.core.placement.stages import View
from scheduler_app.core.throughput import OperatingPoint, placement_slowdown
from scheduler_app.core.types import ClusterSnapshot, JobView, RoundPlan


@dataclass(frozen=True, slots=True)
class OptResult:
    """A round decided by OPT: the plan, LP1's optimum (the bound) and whether every job fit in LP1."""

    plan: RoundPlan
    bound: float
    all_jobs_fit: bool


def plan_throughput(plan: RoundPlan, *, weight_by_gpus: bool = True) -> float:
    """Total throughput of any allocator's plan in OPT's units: sum of speed-ups, times GPUs if weighted."""
    return plan.throughput(weight_by_gpus=weight_by_gpus)


def opt_throughput_bound(
    ordered_jobs: Sequence[JobView], snapshot: ClusterSnapshot, *, weight_by_gpus: bool = True
) -> float:
    """LP1's optimum for the jobs that GPU-only admission takes from `ordered_jobs` (policy order).

    An upper bound on `plan_throughput` of any plan that places all those jobs at points at least
    as fast as proportional (proportional, tune, tune_matrix, opt itself) on servers of one shape;
    see the module docstring for when that holds.
    """
    round_ = _OptRound(ordered_jobs, snapshot, weight_by_gpus)
    return round_.solve_lp(round_.admit_and_claim()).bound


class _OptRound(OptRoom):
    """One OPT decision: admission, LP1, rounding, placement, clean-up of leftovers."""

    def __init__(
        self, ordered_jobs: Sequence[JobView], snapshot: ClusterSnapshot, weight_by_gpus: bool
    ) -> None:
        super().__init__(ordered_jobs, snapshot)
        self.weight_by_gpus = weight_by_gpus
        self.points: dict[int, OperatingPoints] = {}
        self.target: dict[int, OperatingPoint | None] = {}
        self.held: list[HeldJob] = []
        self.on_server: list[list[HeldJob]] = [[] for _ in range(self.state.num_servers)]
        # Cores and memory that the jobs not yet placed will ask for at their LP points.
        self.rest_cpus = 0.0
        self.rest_mem_gb = 0.0

    # -- steps 1 and 2 -------------------------------------------------------------------------
    def admit_and_claim(self) -> list[int]:
        """Decide the infeasible and not-admitted jobs; return the admitted positions, which claim
        their GPUs of last round."""
        out = self.admit()
        self.claim_admitted(remember_others=False)
        return out

    def solve_lp(self, admitted: Sequence[int]) -> ShareSolution:
        """Build every admitted job's candidate points and solve LP1 over them."""
        state, shape = self.state, self.shape
        usable = [i for i in range(state.num_servers) if state.num_free[i] > 0]
        # Cores and memory of a server without a free GPU can serve no job this round.
        cpus_total = sum(state.free_cpus[i] for i in usable)
        mem_gb_total = sum(state.free_mem_gb[i] for i in usable)
        max_cpus = max((state.free_cpus[i] for i in usable), default=0.0)
        max_mem_gb = max((state.free_mem_gb[i] for i in usable), default=0.0)
        memo: dict[tuple[int, int], OperatingPoints] = {}
        points: list[OperatingPoints] = []
        for pos in admitted:
            job = self.jobs[pos]
            if has_fixed_demand(job):
                fixed = self.demands.fixed_point(job)
                pts = single_point(fixed.cpus_per_gpu, fixed.mem_gb_per_gpu, fixed.speed)
            else:
                key = (id(job.profile), job.num_gpus)
                pts = memo.get(key)
                if pts is None:
                    assert shape is not None, "an admitted job implies a non-empty cluster"
                    pts = memo[key] = candidate_points(
                        job.profile,
                        job.num_gpus,
                        shape,
                        max_cpus_per_gpu=max_cpus,
                        max_mem_gb_per_gpu=max_mem_gb,
                    )
            self.points[pos] = pts
            points.append(pts)
        num_gpus = [self.jobs[pos].num_gpus for pos in admitted]
        weights = [float(g) if self.weight_by_gpus else 1.0 for g in num_gpus]
        return solve_share_lp(num_gpus, points, weights, cpus_total=cpus_total, mem_gb_total=mem_gb_total)

    def run(self) -> OptResult:
        admitted = self.admit_and_claim()
        solution = self.solve_lp(admitted)
        shape = self.shape
        for k, pos in enumerate(admitted):
            idx = solution.chosen[k]
            job = self.jobs[pos]
            if has_fixed_demand(job) or idx < 0:
                target = None  # fixed demands are handled apart; -1: the relaxed LP left it out
            else:
                pts = self.points[pos]
                target = OperatingPoint(
                    float(pts.cpus_per_gpu[idx]), float(pts.mem_gb_per_gpu[idx]), float(pts.tput[idx])
                )
                assert shape is not None
                if _same_resources(target, shape.cpus_per_gpu, shape.mem_gb_per_gpu):
                    target = None  # the LP chose the proportional share: each server's own
            self.target[pos] = target
            g = job.num_gpus
            c, m = self._demand_per_gpu(pos)
            self.rest_cpus += g * c
            self.rest_mem_gb += g * m
        # Tune's order: GPU demand desc, then (LP) cores, then memory; ties keep policy order.
        order = sorted(
            admitted, key=lambda p: (-self.jobs[p].num_gpus, *(-x for x in self._demand_per_gpu(p)), p)
        )
        for pos in order:
            g = self.jobs[pos].num_gpus
            c, m = self._demand_per_gpu(pos)
            self.rest_cpus -= g * c
            self.rest_mem_gb -= g * m
            self.place_job(pos)
        self.hand_out_leftovers()
        for h in self.held:
            self.placed(h.pos, h.shares, h.speed, h.reason)
        return OptResult(self.builder.build(), solution.bound, solution.all_jobs_fit)

    def _demand_per_gpu(self, pos: int) -> tuple[float, float]:
        """The per-GPU cores and memory the LP planned for this job (cluster shape if proportional)."""
        target = self.target[pos]
        if target is not None:
            return target.cpus_per_gpu, target.mem_gb_per_gpu
        pts = self.points[pos]
        if has_fixed_demand(self.jobs[pos]):
            return float(pts.cpus_per_gpu[0]), float(pts.mem_gb_per_gpu[0])
        assert self.shape is not None
        return self.shape.cpus_per_gpu, self.shape.mem_gb_per_gpu

    # -- step 3: one job -----------------------------------------------------------------------
    def place_job(self, pos: int) -> None:
        job, state = self.jobs[pos], self.state
        if has_fixed_demand(job):
            dc, dm = state.fixed_demand(job)
            fixed = self.demands.fixed_point(job)
            point = OperatingPoint(fixed.cpus_per_gpu, fixed.mem_gb_per_gpu, fixed.speed)
            fixed_args = (pos, dc, dm, point, reasons.FIXED_DEMAND)
            if not self.try_place(*fixed_args, revertible=False, per_server=True):
                self.make_room_and_place(*fixed_args, revertible=False, per_server=True)
            return
        target = self.target[pos]
        fallback_is_target = False
        if target is not None:
            for point in (target, *self.lower_points(pos, target)):
                reason = reasons.LP_SHARE if point is target else reasons.INTERMEDIATE
                dc, dm = state.uniform(point.cpus_per_gpu), state.uniform(point.mem_gb_per_gpu)
                if self.try_place(pos, dc, dm, point, reason, revertible=True):
                    return
            # A point asking no more than proportional anywhere is cheaper than the proportional share.
            fallback_is_target = all(
                target.cpus_per_gpu <= state.prop_cpus[i] + EPS
                and target.mem_gb_per_gpu <= state.prop_mem_gb[i] + EPS
                for i in range(state.num_servers)
            )
        if fallback_is_target:
            assert target is not None
            dc, dm = state.uniform(target.cpus_per_gpu), state.uniform(target.mem_gb_per_gpu)
            point, reason, revertible = target, reasons.LP_SHARE, True
        else:
            dc, dm = state.prop_cpus, state.prop_mem_gb
            point, reason, revertible = None, reasons.PROPORTIONAL, False
            if self.try_place(pos, dc, dm, point, reason, revertible=revertible):
                return
        self.make_room_and_place(pos, dc, dm, point, reason, revertible=revertible)

    def lower_points(self, pos: int, target: OperatingPoint) -> list[OperatingPoint]:
        """The job's points faster than proportional, slower than `target`, and no larger anywhere."""
        pts = self.points[pos]
        out = []
        for c, m, s in zip(pts.cpus_per_gpu, pts.mem_gb_per_gpu, pts.tput, strict=True):
            if (
                s < target.speed - EPS
                and s > 1.0 + EPS
                and c <= target.cpus_per_gpu + EPS
                and m <= target.mem_gb_per_gpu + EPS
            ):
                out.append(OperatingPoint(float(c), float(m), float(s)))
        return out

    def try_place(
        self,
        pos: int,
        dc: Sequence[float],
        dm: Sequence[float],
        point: OperatingPoint | None,
        reason: str,
        *,
        revertible: bool,
        per_server: bool = False,
    ) -> bool:
        """Place the job at demand (dc, dm) if some servers hold it; `point` None = proportional."""
        job, state = self.jobs[pos], self.state
        num_gpus, owner = job.num_gpus, job.job_id
        if point is not None and not per_server:
            if not state.totals_allow(num_gpus, point.cpus_per_gpu, point.mem_gb_per_gpu):
                return False
            may_split = placement_slowdown(job.profile, num_gpus, 2) <= 1.0
            c, m = point.cpus_per_gpu, point.mem_gb_per_gpu
            shape = state.node_shape(owner)

            def balanced(view: View, num_gpus: int, dc: Sequence[float], dm: Sequence[float]) -> Plan | None:
                rest = (self.rest_cpus, self.rest_mem_gb)
                return find_balanced(state, view, num_gpus, c, m, may_split, rest, shape=shape)

            plan = state.walk(owner, num_gpus, dc, dm, (balanced,))
        else:
            plan = state.find(PACKED, num_gpus, dc, dm, owner)
        if plan is None:
            return False
        shares = state.take(plan, dc, dm, owner)
        weight = float(num_gpus) if self.weight_by_gpus else 1.0
        held = HeldJob(
            job,
            pos,
            len(self.held),
            shares,
            point,
            1.0 if point is None else point.speed,
            reason,
            revertible,
            weight,
        )
        if per_server:
            held.point = None  # fixed demands are never resized
        self.held.append(held)
        for share in shares:
            self.on_server[share.server_pos].append(held)
        return True

    # -- what is left ---------------------------------------------------------------------------
    def hand_out_leftovers(self) -> None:
        """Give cores/memory still free to placed jobs, in policy order: each moves to its fastest
        point that fits (rounding and fallbacks leave some unused, and idle cores help nobody)."""
        state = self.state
        for h in sorted(self.held, key=lambda h: h.pos):
            if has_fixed_demand(h.job):
                continue
            pts = self.points[h.pos]
            for c, m, s in zip(pts.cpus_per_gpu, pts.mem_gb_per_gpu, pts.tput, strict=True):
                if s <= h.speed + EPS:
                    break  # points are sorted fastest first
                if all(
                    sh.num_gpus * c - sh.cpus <= state.free_cpus[sh.server_pos] + EPS
                    and sh.num_gpus * m - sh.mem_gb <= state.free_mem_gb[sh.server_pos] + EPS
                    for sh in h.shares
                ):
                    for sh in h.shares:
                        state.adjust(sh, sh.num_gpus * float(c), sh.num_gpus * float(m))
                    point = OperatingPoint(float(c), float(m), float(s))
                    target = self.target[h.pos]
                    same = target is not None and _same_resources(target, float(c), float(m))
                    h.point, h.speed = point, point.speed
                    h.reason = reasons.LP_SHARE if same else reasons.INTERMEDIATE
                    h.revertible = True
                    break


def _same_resources(point: OperatingPoint, cpus_per_gpu: float, mem_gb_per_gpu: float) -> bool:
    return abs(point.cpus_per_gpu - cpus_per_gpu) <= EPS and abs(point.mem_gb_per_gpu - mem_gb_per_gpu) <= EPS


@register_allocator("opt")
class OptAllocator(Allocator):
    """Synergy-OPT (see the module docstring): LP1 bound, rounded shares, placed without leaving jobs out."""

    def __init__(self, *, weight_by_gpus: bool = True) -> None:
        self.weight_by_gpus = weight_by_gpus

    def solve(self, ordered_jobs: Sequence[JobView], snapshot: ClusterSnapshot) -> OptResult:
        """The plan together with LP1's optimum (the round's throughput bound)."""
        return _OptRound(ordered_jobs, snapshot, self.weight_by_gpus).run()

    def allocate(self, ordered_jobs: Sequence[JobView], snapshot: ClusterSnapshot) -> RoundPlan:
        return self.solve(ordered_jobs, snapshot).plan
