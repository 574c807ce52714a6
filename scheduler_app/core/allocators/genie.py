"""GENIE's QoS-aware placement: the smallest allocation that still meets each job's QoS target.

PAPERS.md §2.3 / §5.6: GENIE gives each QoS job the placement that meets its deadline with the fewest
resources, reserves for a job that cannot start now and backfills around the reservation, and drops
jobs that can no longer make it to a best-effort tail. In Attune a job's GPU count is fixed (the user
asked for it), so "fewest resources" is about the CPU cores and memory per GPU and "most
consolidated" about servers. For each job, in the policy's order (SWAF is GENIE's own):

1. A QoS job (it has `deadline_s`) needs speed v = remaining work at the proportional point /
   (slack x (deadline - now)); `slack` < 1 leaves room for the round grid and restarts, and is
   dropped (v = work / (deadline - now)) for a job whose best case meets the deadline only without
   it: an urgent job still has a waiting allowance, and made best effort it ran at the proportional
   share and missed (seen at 4 jobs/h in bench.reproduce_genie). A job with a
   minimum rate (`min_rate_iters_per_s`, GENIE's second QoS kind) needs v = min_rate x iter_time_s
   (speed is relative: iterations/s = speed / iter_time_s); no slack, since the rate is measured
   while it runs. v is a speed after the placement's slowdown (throughput.placement_slowdown: the
   fitted predictor's t(n, k/n, b) / t(1, k, b) when the workload has a GENIE fit, else the learnt
   constant penalty), counted first on the fewest servers that can hold the job.
   - If its best case cannot reach v, it is late: it becomes best effort (pending reason
     `qos_unattainable`, or `min_rate_unattainable` for a rate, when it gets nothing).
   - Else it gets the cheapest point of its sensitivity matrix (cores and memory counted in
     proportional shares) reaching v, packed on the fewest servers (reason `qos_fit`). Points below
     the proportional share are allowed: what the job does not need stays free for others.
   - The point goes on the fewest servers that hold it now; if those are more than the fewest
     possible and the slowdown of spreading brings it below v, the next (faster) point is tried,
     and if none meets v spread, the job waits for a consolidated placement (pending reason
     `qos_needs_fewer_servers`): a deadline job is not spread into missing its deadline.
   - If no such point fits now, it gets a reservation (EASY backfilling, one at a time): the time T
     at which the jobs placed so far in this round will have freed enough GPUs for it, and how many
     GPUs beyond its need will then be free; only if it still meets its deadline when started at T
     (PAPERS §2.3 step 4, t' + E <= D): a reservation it would miss anyway only holds others back.
2. A best-effort job (no deadline, or late) gets its best case where it fits and leaves the jobs
   after it that GPU admission expects to place their proportional share, else the proportional
   share, else the fastest cheaper point that fits (reasons `best_case`, `proportional`,
   `intermediate`): no job waits with GPUs free because an earlier one took their cores; step 4 may
   still grow it.
3. While a reservation stands, a later job is placed only if it finishes (at the point chosen) by T,
   or fits in the GPUs spare at T (reason `backfilled` for either); otherwise it stays pending with
   `reserved_for_qos`.
4. Work conservation (`work_conserving=True`, the default; GENIE's paper is silent): cores and memory
   left over once every job is decided go to the placed jobs, in policy order, each moving to its
   fastest point that the free resources on its own servers allow (reason `leftover`). The next round
   starts again from the smallest points, so a new QoS job can always reclaim them.
Every placement keeps a job on its GPUs of last round where it can (stickiness, placement/claims.py), and
puts a job with a node count (`num_nodes` = N) on exactly N servers (the QoS speed it needs then
counts the placement penalty of N servers).
Unlike the Synergy allocators, GENIE may give a job less than its GPU-proportional share: that is
the point of "fewest resources", and its QoS jobs still meet their deadlines.
A job's candidate points and GPU-count variants live in genie_candidates.py; the speed a QoS job needs
and what a round reads of it (need_key) in genie_needs.py; a placement's speed and interference test
in genie_costs.py; the leftover pass and whether a plan repeats in genie_leftovers.py; a steady round
(every job kept at its best case) told without the search in genie_steady.py; a decided round's running
jobs that go back to their own GPUs at their best case, without the search, in genie_home.py (both read
what genie_kept.py works out once per Placement).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

from scheduler_app.core import reasons
from scheduler_app.core.allocators.base import Allocator, register_allocator
from scheduler_app.core.allocators.genie_candidates import (
    Held,
    Reservation,
    gpu_variant,
    points_by_cost,
)
from scheduler_app.core.allocators.genie_costs import acceptable, avoiding_comm, comm_neighbours, speed_on
from scheduler_app.core.allocators.genie_home import decide_jobs
from scheduler_app.core.allocators.genie_leftovers import hand_out_leftovers, repeats
from scheduler_app.core.allocators.genie_needs import need_key, required_speed
from scheduler_app.core.allocators.genie_points import shape_points
from scheduler_app.core.allocators.genie_steady import steady_plan
from scheduler_app.core.interference import communicates
from scheduler_app.core.placement import PACKED, Plan, has_fixed_demand, pending_reason
from scheduler_app.core.placement.setup import RoundSetup
from scheduler_app.core.throughput import (
    EPS,
    OperatingPoint,
    with_penalty,
)
from scheduler_app.core.types import ClusterSnapshot, JobView, RoundPlan

__all__ = ["GenieAllocator", "GenieRound", "gpu_variant", "points_by_cost"]


class GenieRound(RoundSetup):
    """One call of the GENIE allocator (see the module docstring)."""

    def __init__(
        self,
        ordered_jobs: Sequence[JobView],
        snapshot: ClusterSnapshot,
        now_s: float,
        slack: float,
        work_conserving: bool,
    ) -> None:
        super().__init__(ordered_jobs, snapshot)
        self.now_s = now_s
        self.slack = slack
        self.work_conserving = work_conserving
        # (job, speed) of the jobs placed so far: their predicted finishes, worked out when a
        # reservation needs them (rarely).
        self.releases: list[tuple[JobView, float]] = []
        self.reservation: Reservation | None = None
        self.held: list[Held] = []
        self.comm_on_server: dict[int, list[Held]] = defaultdict(list)  # server position -> jobs
        # Whether a communicating QoS job with an interference term is placed: only such a neighbour
        # can make a placement unacceptable (`acceptable`), so until then none is looked for.
        self.kappa_qos_held = False
        # Option lists (genie_points' memos, by identity, kept alive here) for which no servers were
        # found at any point, for their GPU count: while jobs are being decided resources are only
        # taken, so a search that failed fails again (RoundState.find_uniform's rule), for any owner
        # (a node count's search fails where the plain one does). Uniform demands without a node
        # count only. `found`: whether the last `place` found servers (before its other tests).
        self.unfit: dict[int, list[tuple[OperatingPoint, str]]] = {}
        self.found = False
        self.later_gpus = 0  # GPUs of the jobs after this one that GPU admission expects to place
        self.spread_too_slow = False  # the job being decided found servers, too many for its QoS
        self.interference_blocked = False  # ... or only next to communicating jobs, too slow for a QoS
        # Whether every decision read progress and the clock only through `need_key` (what a
        # simulator may reuse the plan under; GenieAllocator.allocate_keyed).
        self.keyed = True

    def points(self, job: JobView) -> tuple[OperatingPoint, ...]:
        """points_by_cost for the job's workload and GPU count on the cluster shape (a memo across
        rounds by profile identity, genie_points.py: an lru_cache lookup hashes the whole profile)."""
        assert self.shape is not None
        return shape_points(job.profile, job.num_gpus, self.min_servers(job), self.shape).points

    def run(self) -> RoundPlan:
        self.claim_admitted(remember_others=True)
        decide_jobs(self)  # each job in order: `decide`, or the lean path home (genie_home.py)
        if self.work_conserving:
            hand_out_leftovers(self)
        builder = self.builder
        for h in self.held:
            if h.kept:
                builder.kept(h.pos, h.job.current, h.reason)  # what `placed` finds (genie_home.py)
            else:
                self.placed(h.pos, h.shares, h.point.speed, h.reason, h.scale)
        return self.builder.build(stable=repeats(self))

    # -- one job ---------------------------------------------------------------------------------
    def decide(self, pos: int, job: JobView) -> None:
        assert self.shape is not None  # a feasible job implies a non-empty cluster
        if (
            not job.gpu_choices
            and job.deadline_s is None
            and job.min_rate_iters_per_s is None
            and job.cpus_per_gpu_override is None
            and job.mem_gb_per_gpu_override is None
        ):
            self.decide_best_effort(pos, job)
            return
        reserved_before = self.reservation is not None
        self.spread_too_slow = self.interference_blocked = False
        state = self.state
        if not job.gpu_choices:  # one GPU count (gpu_counts): `tries` without its lists
            need = self.required_speed(job)
            if job.num_gpus > state.free_gpu_count:  # every search would fail (may_fit)
                self.wait(pos, job, reserved_before, need)
                return
            tries: Sequence[tuple[JobView, float, float | None]] = ((job, 1.0, need),)
        else:
            tries = self.tries(job)
        for variant, scale, need in tries:
            options, least_cpus, least_mem_gb = self.options(variant, need)
            if not options:
                continue
            if not self.may_fit(variant, least_cpus, least_mem_gb) or id(options) in self.unfit:
                # No option can fit (place would fail at every one): only its first call's release
                # of a GPU-count variant's old claims is kept.
                current = variant.current
                if variant is not job and current is not None and current.num_gpus != variant.num_gpus:
                    state.release(variant.job_id)
                continue
            unfit = True
            for point, reason in options:
                if self.place(pos, variant, point, reason, need, scale, own_count=variant is job):
                    return
                unfit = unfit and not self.found
            if unfit and least_cpus >= 0 and variant.num_nodes is None:
                self.unfit[id(options)] = options
        self.wait(pos, job, reserved_before, tries[0][2] if tries[0][0] is job else self.required_speed(job))

    def decide_best_effort(self, pos: int, job: JobView) -> None:
        """`decide` for a job without a QoS target, GPU-count choices or a fixed demand (most jobs,
        and nearly all of a deep queue's waiting ones): its steps without `tries`, the QoS need and
        the option kinds it cannot have, so that a job that cannot fit waits after two tests."""
        shape = self.shape
        assert shape is not None
        reserved_before = self.reservation is not None
        self.spread_too_slow = self.interference_blocked = False
        state = self.state
        num_gpus = job.num_gpus
        if num_gpus <= state.free_gpu_count:
            servers = job.num_nodes or -(-num_gpus // shape.num_gpus)
            options, least_cpus, least_mem_gb = shape_points(
                job.profile, num_gpus, servers, shape
            ).best_effort_options()
            if id(options) not in self.unfit and state.totals_allow(num_gpus, least_cpus, least_mem_gb):
                unfit = True
                for point, reason in options:
                    if self.place(pos, job, point, reason):
                        return
                    unfit = unfit and not self.found
                if unfit and job.num_nodes is None:
                    self.unfit[id(options)] = options
        self.wait(pos, job, reserved_before, None)

    def wait(self, pos: int, job: JobView, reserved_before: bool, need: float | None) -> None:
        """`job` found no place: its claims go, a QoS job (`need`, at its own GPU count) may reserve,
        and it waits with the reason that kept it out."""
        state = self.state
        state.release(job.job_id)
        if need is not None and not reserved_before:
            self.reserve(job)
        if job.deadline_s is not None and need is None:
            self.builder.pending(pos, reasons.QOS_UNATTAINABLE)
        elif job.min_rate_iters_per_s is not None and need is None:
            self.builder.pending(pos, reasons.MIN_RATE_UNATTAINABLE)
        elif reserved_before:
            self.builder.pending(pos, reasons.RESERVED_FOR_QOS)
        elif self.spread_too_slow:
            self.builder.pending(pos, reasons.QOS_NEEDS_FEWER_SERVERS)
        elif self.interference_blocked:
            self.builder.pending(pos, reasons.QOS_INTERFERENCE)
        else:
            why = pending_reason(job.num_gpus, state.free_gpu_count)
            if job.num_nodes is not None:
                why = state.node_pending_reason(job) or why
            self.builder.pending(pos, why)

    def options(
        self, job: JobView, need: float | None
    ) -> tuple[list[tuple[OperatingPoint, str]], float, float]:
        """The points to try for `job`, in order: its fixed demand; for a QoS need, every Pareto point
        meeting it on the fewest servers, cheapest first; else the best-effort order. With them the
        least cores and GB per GPU any of them asks (-1 for a fixed demand: not uniform). The lists
        are memos: not to be changed."""
        assert self.shape is not None
        if has_fixed_demand(job):
            return [(self.demands.fixed_point(job), reasons.FIXED_DEMAND)], -1.0, -1.0
        if need is None:
            return self.best_effort_options(job)
        return shape_points(job.profile, job.num_gpus, self.min_servers(job), self.shape).qos_options(need)

    def may_fit(self, job: JobView, least_cpus: float, least_mem_gb: float) -> bool:
        """False when no point of `job` asking at least (least_cpus, least_mem_gb) per GPU can be
        found servers now: place's search (RoundState.find_uniform) fails whenever the free totals
        cannot hold the GPUs at the demand, and that holds for every larger demand; any search fails
        with fewer free GPUs than the job needs (a fixed demand's too: least_cpus < 0)."""
        state = self.state
        if job.num_gpus > state.free_gpu_count:
            return False
        return least_cpus < 0 or state.totals_allow(job.num_gpus, least_cpus, least_mem_gb)

    def tries(self, job: JobView) -> list[tuple[JobView, float, float | None]]:
        """(variant, speed scale, QoS need) for each GPU count to try (`gpu_counts`). A QoS job tries
        only the counts at which its target is attainable, and is best effort at its own count when
        none is; a best-effort job tries them all."""
        counts = self.gpu_counts(job)
        if len(counts) == 1:
            return [(job, 1.0, self.required_speed(job))]
        variants = [gpu_variant(job, k) for k in counts]
        if job.deadline_s is None and job.min_rate_iters_per_s is None:
            return [(v, scale, None) for v, scale in variants]
        if job.deadline_s is not None:
            self.keyed = False  # its variants' needs are not in need_key
        feasible = [(v, scale, self.required_speed(v)) for v, scale in variants]
        return [t for t in feasible if t[2] is not None] or [(job, 1.0, None)]

    def gpu_counts(self, job: JobView) -> list[int]:
        """The GPU counts `job` may run on, in the order GENIE tries them (PAPERS §2.3 step 3): a QoS job
        the fewest GPUs first, a best-effort job its own count first ("start fastest"), then fewer;
        a running job keeps its count when it still may (no restart for a count it already has).
        Only its own count with a node count or a fixed demand."""
        if not job.gpu_choices or job.num_nodes is not None or has_fixed_demand(job):
            return [job.num_gpus]
        assert self.shape is not None
        most = self.shape.num_gpus * len(self.snapshot.servers)
        choices = sorted({job.num_gpus, *(k for k in job.gpu_choices if 1 <= k <= most)})
        if job.deadline_s is None and job.min_rate_iters_per_s is None:
            choices = [job.num_gpus, *sorted((k for k in choices if k < job.num_gpus), reverse=True)]
        current = job.current.num_gpus if job.current is not None else None
        if current in choices:
            choices.remove(current)
            choices.insert(0, current)
        return choices

    def min_servers(self, job: JobView) -> int:
        """A node count fixes the servers; otherwise the fewest that could hold the job."""
        assert self.shape is not None
        return job.num_nodes or -(-job.num_gpus // self.shape.num_gpus)

    def best_speed(self, job: JobView) -> float:
        """The job's best-case speed on the fewest servers that can hold it, after their slowdown."""
        assert self.shape is not None
        return shape_points(job.profile, job.num_gpus, self.min_servers(job), self.shape).best_speed

    def required_speed(self, job: JobView) -> float | None:
        """The speed (x proportional, after the placement's slowdown) that meets the job's QoS target,
        or None (required_speed below)."""
        assert self.shape is not None
        return required_speed(job, self.shape, self.now_s, self.slack)

    def best_effort_options(self, job: JobView) -> tuple[list[tuple[OperatingPoint, str]], float, float]:
        """A best-effort job's points: its best case, then the GPU-proportional share, then cheaper
        points, fastest first. A best case above the share is taken only when it leaves the jobs
        after it that GPU admission expects to place their proportional share (`starves_gpus`), so
        that no job waits beside free GPUs because an earlier one took their cores (Synergy's
        guarantee, as tune keeps it); such a job may still grow to it in the leftover pass.
        The list is shared by the jobs of one workload and GPU count (a memo across rounds,
        ShapePoints.best_effort_options): not to be changed; with it the least cores and GB per GPU
        of its points."""
        assert self.shape is not None
        return shape_points(
            job.profile, job.num_gpus, self.min_servers(job), self.shape
        ).best_effort_options()

    def place(
        self,
        pos: int,
        job: JobView,
        point: OperatingPoint,
        reason: str,
        need: float | None = None,
        scale: float = 1.0,
        *,
        own_count: bool = True,
    ) -> bool:
        """Place `job` at `point` on the fewest servers that hold it, unless a reservation forbids it
        or, for a QoS job (`need`), the servers found make it too slow: spread over more servers than
        the fewest, its placement's slowdown (the predictor's t_cross, or the learnt penalty) may
        cost the deadline; then False, and `spread_too_slow` says why. `job` may be a GPU-count
        variant (gpu_variant, `own_count` False), whose speed `scale` turns into the job's own."""
        state = self.state
        self.found = False
        owner: int | None = job.job_id
        if not own_count and job.current is not None and job.current.num_gpus != job.num_gpus:
            state.release(job.job_id)  # another GPU count: its old GPUs are not a home for this one
            owner = None
        fixed = has_fixed_demand(job)
        if fixed:
            dc, dm = state.fixed_demand(job)
            plan = state.find(PACKED, job.num_gpus, dc, dm, owner)
        else:
            plan = state.find_uniform(PACKED, job.num_gpus, point.cpus_per_gpu, point.mem_gb_per_gpu, owner)
        if plan is None:
            return False
        self.found = True
        if not fixed:
            dc, dm = state.uniform(point.cpus_per_gpu), state.uniform(point.mem_gb_per_gpu)
        if reason == reasons.BEST_CASE and self.starves_gpus(plan, point):
            return False  # the proportional share next, where this best case would idle GPUs
        speed = speed_on(self, job, point, plan)
        if not acceptable(self, job, plan, speed, need) and comm_neighbours(self, job, plan):
            # Interference in the way: the same point away from every communicating job, if it fits.
            far = state.find(PACKED, job.num_gpus, *avoiding_comm(self, dc, dm), owner)
            if far is not None:
                plan, speed = far, speed_on(self, job, point, far)
        if need is not None and job.deadline_s is not None and self.keyed:
            # need_key holds which points meet the need at the point's own speed on the fewest
            # servers: a comparison of the need with another speed (a spread, interference, a fixed
            # demand's point, a GPU-count variant's) is not in it.
            base = with_penalty(point.speed, job.profile, self.min_servers(job), job.num_gpus)
            if speed != base or not own_count or fixed:
                self.keyed = False
        if not acceptable(self, job, plan, speed, need):
            if need is not None and with_penalty(point.speed, job.profile, len(plan), job.num_gpus) < need:
                self.spread_too_slow = True
            else:
                self.interference_blocked = True
            return False
        backfill = False
        finish_s = 0.0
        if self.reservation is not None:
            res = self.reservation
            finish_s = self.finish_s(job, speed)
            if finish_s <= res.start_s + EPS or job.num_gpus <= res.spare_gpus:
                backfill = True
            else:
                return False
        shares = state.take(plan, dc, dm, owner)
        if backfill:
            res = self.reservation
            assert res is not None
            if finish_s > res.start_s + EPS:
                res.spare_gpus -= job.num_gpus
            reason = reasons.BACKFILLED
        self.releases.append((job, speed))
        self.held.append(Held(pos, job, shares, point, reason, fixed, need, scale))
        if communicates(job.num_gpus):
            for i, _ in plan:
                self.comm_on_server[i].append(self.held[-1])
            if need is not None and job.profile.interference_kappa > 0:
                self.kappa_qos_held = True
        return True

    def finish_s(self, job: JobView, speed: float) -> float:
        """When `job` finishes at `speed` from now (the reservation's clock)."""
        return self.now_s + job.remaining_iters * job.profile.iter_time_s / max(speed, EPS)

    def starves_gpus(self, plan: Plan, point: OperatingPoint) -> bool:
        """Whether `point` on `plan` would leave the cluster fewer cores or GB than the proportional
        share of the GPUs that GPU admission still expects to place after this job (`later_gpus`):
        a best case above the share would then keep those jobs off free GPUs, as tune never does."""
        assert self.shape is not None
        c, m = self.shape.cpus_per_gpu, self.shape.mem_gb_per_gpu
        if self.later_gpus <= 0 or (point.cpus_per_gpu <= c + EPS and point.mem_gb_per_gpu <= m + EPS):
            return False
        state = self.state
        gpus = sum(k for _, k in plan)
        free_cpus = sum(state.free_cpus) - gpus * point.cpus_per_gpu
        free_mem_gb = sum(state.free_mem_gb) - gpus * point.mem_gb_per_gpu
        return free_cpus < self.later_gpus * c - EPS or free_mem_gb < self.later_gpus * m - EPS

    def reserve(self, job: JobView) -> None:
        """Reserve for `job`: the earliest time the jobs placed so far free enough GPUs for it."""
        self.keyed = False  # from the placed jobs' predicted finishes: progress and the clock
        free = self.state.free_gpu_count
        start_s = self.now_s
        for finish_s, gpus in sorted((self.finish_s(j, v), j.num_gpus) for j, v in self.releases):
            if free >= job.num_gpus:
                break
            free += gpus
            start_s = finish_s
        if free >= job.num_gpus and self.meets_deadline_from(job, start_s):
            self.reservation = Reservation(start_s, free - job.num_gpus)

    def meets_deadline_from(self, job: JobView, start_s: float) -> bool:
        """Whether `job`, started at `start_s` at its best case on the fewest servers, still meets its
        deadline (with the round's slack): PAPERS §2.3 step 4 reserves only then."""
        if job.deadline_s is None:
            return True
        best = self.best_speed(job)
        work_s = job.remaining_iters * job.profile.iter_time_s
        return work_s <= best * (job.deadline_s - start_s) * self.slack + EPS


@register_allocator("genie")
class GenieAllocator(Allocator):
    """QoS-aware placement: the fewest cores and memory per GPU that meet each QoS target (see above)."""

    reads_progress = True

    def __init__(self, slack: float = 0.8, *, work_conserving: bool = True) -> None:
        if not 0 < slack <= 1:
            raise ValueError(f"slack must be in (0, 1], got {slack!r}")
        self.slack = slack
        self.work_conserving = work_conserving

    def progress_key(
        self, ordered_jobs: Sequence[JobView], snapshot: ClusterSnapshot, now_s: float
    ) -> tuple[tuple[int, int | None], ...]:
        """need_key for this allocator's slack: see allocate_keyed."""
        return need_key(ordered_jobs, snapshot, now_s, self.slack)

    def allocate_keyed(
        self, ordered_jobs: Sequence[JobView], snapshot: ClusterSnapshot, now_s: float
    ) -> tuple[RoundPlan, bool]:
        """allocate_at's plan, and whether it was decided from the order, the jobs' fixed attributes,
        last round's placements and `progress_key` alone (what lets a simulator reuse it for the same
        inputs at another time, with other progress: simulator/reuse.py). GENIE reads progress and
        the clock only through QoS needs: a deadline's (remaining work over the time left), whose
        effect progress_key holds while each need is compared only with its points' own speeds, and
        the EASY reservation that an unplaced QoS job makes (its start is when the placed jobs
        finish), which the key does not hold (False then). A minimum rate's need is a constant."""
        steady = steady_plan(ordered_jobs, snapshot)
        if steady is not None:
            return steady, True  # read nothing of progress or the clock (genie_steady.py)
        genie_round = GenieRound(ordered_jobs, snapshot, now_s, self.slack, self.work_conserving)
        plan = genie_round.run()
        return plan, genie_round.keyed

    def allocate(self, ordered_jobs: Sequence[JobView], snapshot: ClusterSnapshot) -> RoundPlan:
        """Without a clock every deadline is measured from time 0; the engine calls allocate_at."""
        return self.allocate_at(ordered_jobs, snapshot, 0.0)

    def allocate_at(
        self, ordered_jobs: Sequence[JobView], snapshot: ClusterSnapshot, now_s: float
    ) -> RoundPlan:
        steady = steady_plan(ordered_jobs, snapshot)
        if steady is not None:
            return steady  # every job kept at its best case (genie_steady.py)
        return GenieRound(ordered_jobs, snapshot, now_s, self.slack, self.work_conserving).run()
