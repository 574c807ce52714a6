"""Synergy-TUNE: best-case CPU/memory where it fits, proportional where not, never worse than proportional.

As PAPERS.md section 3.3 and the reference implement it (msr-fiddle/synergy, simulator/
resources/cluster.py `allocate_synergy_tune`, `_tune`, `_get_underutilized_servers`,
`_reallocate_peer`, `_make_fair_share`; schedulers/las_synergy_new.py for the runnable set):
1. Runnable set: GPU-only admission in policy order (`gpu_admission`; a job with a node count
   only when enough servers have its GPUs free).
2. Sort it by GPU demand, descending (stable: ties keep policy order). PAPERS.md notes that the
   paper's text then sorts by CPU and memory demand; the reference code does not, and measuring
   both (docs/reproduction.md) that secondary sort packs the CPU-hungriest jobs together, which
   step 5 then has to revert: `order="demand"` keeps it as an option.
3. Try the best-case vector (capped at the server size, throughput.best_case). Placement: a
   multi-GPU job goes whole onto the server with the fewest free GPUs that fits it, else is spread
   GPU by GPU from the servers with the fewest free GPUs; a split job gets CPU/memory proportional
   to its GPUs on each server.
4. If that fails, downgrade the job to the GPU-proportional share (speed-up 1) and retry. A job
   whose best case asks no more than proportional in any dimension keeps its own demand.
5. If it still fails, pick servers with enough free GPUs (multi-GPU: the first server holding all
   of them; else servers by fewest free GPUs), and on each take back the surplus of peers holding
   more than their proportional share, in the order (fewest servers spanned, most CPU per GPU,
   most memory per GPU), reverting them whole to proportional until the job's need is covered;
   then place the job at proportional.
With servers of one shape and no fixed demands, step 5 always succeeds, so every admitted job is
placed: tune never idles a GPU that the proportional allocator would use, and never gives a job
less than its proportional speed.
A job with a node count (`num_nodes` = N) is placed on exactly N servers with num_gpus / N GPUs each
(core/placement), and step 5 makes room only on such servers; it may stay pending where others
would be placed, so "every admitted job is placed" holds for jobs without one.
Stickiness (core/placement): every try of steps 3-5 first offers a job the GPUs it held last round,
and places the others around them when it can; step 5 makes room on a job's own servers when its
GPUs there are still free. Before steps 3-5, a job still holding its GPUs of last round stays on
them whenever they hold it at proportional or better (`keep_home`): at its best case (tune_matrix:
or an intermediate point) beside what its neighbours there reserved, else at proportional, making
room there by step 5 if need be. It moves only when none of that fits. Without this rule a job
that ran at proportional left its GPUs for its best case wherever an ended job had freed cores,
and the job whose cores it took moved in turn: at 1,000 servers, 20 jobs ending moved 310 to 564
running ones per round (docs/performance.md, "Moves per round"). A move is a restart on a real
cluster (checkpoint, requeue, reload), so it is not worth a better operating point for one round.
Keeping placements can cost packing: the round is then also planned without claims, and that plan
wins when its throughput (sum of speed-ups x GPUs) beats the sticky one by more than
`repack_gain` (default 5 %; None: always sticky), so stickiness saves restarts without costing
more than that much throughput.

Deliberate differences from the reference:
- The reference's evaluated "+tune" runs use its first-fit GPU scan (no "+place"); PAPERS.md and
  our brief specify the placement-sensitive variant above, so that is the default and
  `placement="first_fit"` gives the reference's benchmark behaviour.
- The reference exits the process when step 5 fails; we leave the job pending (`fragmented`). That
  can only happen with fixed-demand jobs or uneven servers.
- Peers whose allocation would not change (no surplus on that server) are not touched and keep
  their reason; the reference "reverts" them to the identical allocation.
- A peer whose revert would need *more* of a resource on one of its servers than is free there
  (a best case below proportional in one dimension and above in another, on uneven servers) is
  skipped rather than over-committing that server.
- Fixed-demand jobs get exactly their demand (no downgrade); step 5 may make room for them too,
  but they are never reverted as peers. Storage bandwidth is not modelled.
- The reference's lowest-index choice within a server takes the highest free GPU index (list pop);
  we take the lowest, for stable, readable placements.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from scheduler_app.core import reasons
from scheduler_app.core.allocators.base import Allocator, register_allocator
from scheduler_app.core.allocators.tune_extend import extend_stable
from scheduler_app.core.allocators.tune_fresh import single_gpu_fresh_throughput
from scheduler_app.core.allocators.tune_repack import FreshThroughputs, held_speed, repacked
from scheduler_app.core.allocators.tune_steady import SteadyRound
from scheduler_app.core.placement import (
    EPS,
    PACKED,
    HeldJob,
    HeldShare,
    Plan,
    Score,
    has_fixed_demand,
    score_named,
)
from scheduler_app.core.placement.setup import RoundSetup
from scheduler_app.core.throughput import OperatingPoint, needs_downgrade
from scheduler_app.core.types import ClusterSnapshot, JobView, RoundPlan

ORDER_GPUS = "gpus"  # GPU demand, descending; ties keep policy order (the reference's code)
ORDER_DEMAND = "demand"  # then best-case CPU and memory per GPU, descending (the paper's text)
ORDERS = (ORDER_GPUS, ORDER_DEMAND)


class TuneRound(SteadyRound, RoundSetup):
    """One call of the tune allocator: the round's state and the steps of the algorithm."""

    def __init__(
        self,
        ordered_jobs: Sequence[JobView],
        snapshot: ClusterSnapshot,
        placement: str | Score,
        *,
        order: str = ORDER_GPUS,
        sticky: bool = True,
        keep_homes: bool = True,
        like: RoundSetup | None = None,
        admission: tuple[list[str | None], list[bool]] | None = None,
    ) -> None:
        super().__init__(ordered_jobs, snapshot, like, admission=admission)
        self.placement = score_named(placement)
        self.order = order
        self.sticky = sticky
        self.keep_homes = sticky and keep_homes
        self.held: list[HeldJob] = []
        self.left_out: list[int] = []  # admitted, but left pending by step 5 (positions)
        self.on_server: list[list[HeldJob]] = [[] for _ in range(self.state.num_servers)]
        # Whether the plan repeats (RoundPlan.stable), kept up to date as jobs are held (`hold`).
        self.settled = True

    def run(self) -> RoundPlan:
        self.place_admitted()
        for h in self.held:
            self.placed(h.pos, h.shares, h.speed, h.reason)
        return self.builder.build(stable=self.settled and not self.left_out)

    def place_admitted(self) -> None:
        """The round up to its plan: admission, tune's order, the holds and placements (`held`)."""
        jobs = self.jobs
        admitted = self.admit()
        if self.order == ORDER_DEMAND:
            runnable: list[tuple[int, float, float, int]] = []
            for pos in admitted:
                job = jobs[pos]
                point = self.demands.fixed_point(job) if has_fixed_demand(job) else self.demands.best(job)
                runnable.append((-job.num_gpus, -point.cpus_per_gpu, -point.mem_gb_per_gpu, pos))
            # Per-GPU and total CPU/memory order alike within one GPU count; pos keeps policy order.
            runnable.sort()
            order = [item[3] for item in runnable]
        else:
            # More GPUs first, ties in policy order: a stable sort of the positions (in policy order).
            order = sorted(admitted, key=lambda pos: -jobs[pos].num_gpus)
        start = 0
        if self.sticky:
            start = self.hold_current(order) if self.keep_homes else 0
            if not start:
                self.claim_admitted(remember_others=False)
        for pos in order[start:]:
            self.place_job(pos)

    def runs_as_tune(self) -> bool:
        """Whether this round's plan is tune's own `run` (tune_repack.py may then plan it without
        building it, and remember the fresh plan's throughput, which reads no current placement). A
        round class with its own `run` may decide otherwise: the bench's policy-order tune claims the
        current placements in every plan, the fresh one too."""
        return type(self).run is TuneRound.run

    def planned_throughput(self) -> float:
        """`run().throughput()` without building the plan (tune_repack.py): the same speeds, spread
        penalty included, summed over the placed jobs in policy order, as RoundPlan.throughput sums
        them; `stable` is not worked out (`settles` decides nothing)."""
        if not self.runs_as_tune():
            return self.run().throughput()
        if type(self) is TuneRound and self.order == ORDER_GPUS:
            lean = single_gpu_fresh_throughput(self)  # single-GPU jobs only: the walk on plain lists
            if lean is not None:
                return lean
        self.settled = False
        self.place_admitted()
        held = sorted(self.held, key=lambda h: h.pos)
        return sum(held_speed(h) * sum(s.num_gpus for s in h.shares) for h in held)

    # -- one job -------------------------------------------------------------------------------
    def place_job(self, pos: int) -> None:
        job = self.jobs[pos]
        state = self.state
        if has_fixed_demand(job):
            dc, dm = state.fixed_demand(job)
            speed = self.demands.fixed_point(job).speed
            if self.try_place(pos, dc, dm, None, speed, reasons.FIXED_DEMAND):
                return
            self.make_room_and_place(pos, dc, dm, None, speed, reasons.FIXED_DEMAND)
            return
        best = self.demands.best(job)
        if self.keep_homes and self.keep_home(pos, job, best):
            return
        bc, bm = state.uniform(best.cpus_per_gpu), state.uniform(best.mem_gb_per_gpu)
        if self.try_place(pos, bc, bm, best, best.speed, reasons.BEST_CASE):
            return
        if self.try_intermediate(pos, job, best):
            return
        dc, dm, point, speed, reason = self.fallback_demand(best)
        if point is None and self.try_place(pos, dc, dm, point, speed, reason):
            return  # downgraded to proportional; a job asking no more retried nothing new
        self.make_room_and_place(pos, dc, dm, point, speed, reason)

    def fallback_demand(
        self, best: OperatingPoint
    ) -> tuple[Sequence[float], Sequence[float], OperatingPoint | None, float, str]:
        """(cores, memory, point, speed, reason) once the best case did not fit: proportional, or,
        for a job whose best case asks no more than proportional, that best case again (the
        reference retries the same vector)."""
        state = self.state
        assert self.shape is not None
        if needs_downgrade(best, self.shape):
            return state.prop_cpus, state.prop_mem_gb, None, 1.0, reasons.PROPORTIONAL
        bc, bm = state.uniform(best.cpus_per_gpu), state.uniform(best.mem_gb_per_gpu)
        return bc, bm, best, best.speed, reasons.BEST_CASE

    def keep_home(self, pos: int, job: JobView, best: OperatingPoint) -> bool:
        """Place a job on its GPUs of last round if they hold it at proportional or better; False
        (nothing changed but peers shrunk by step 5 there) when they do not, or it has none.

        In order: each of `home_points` (best case first) beside what the other claimants there
        reserved (`home_plan`, strict: taking their cores would move them instead); proportional on
        what is free there (or the best case, for a job asking no more than proportional); the same
        after step 5 took surplus back from peers on those servers.
        """
        state = self.state
        job_id = job.job_id
        if job.current is None:
            return False  # no home (the common case of a new job: no lookups)
        # home_plan is None wherever home_servers is (no home, or its GPUs claimed by others), so the
        # homes are looked up only once the strict tries failed (in a steady round most jobs stay).
        for point in self.home_points(job, best):
            dc, dm = state.uniform(point.cpus_per_gpu), state.uniform(point.mem_gb_per_gpu)
            plan = state.home_plan(job_id, dc, dm, strict=True)
            if plan is not None:
                reason = reasons.BEST_CASE if point is best else reasons.INTERMEDIATE
                self.hold(pos, plan, dc, dm, point, point.speed, reason, at_home=True)
                return True
        home = state.home_servers(job_id)
        if home is None:
            return False
        dc, dm, point, speed, reason = self.fallback_demand(best)
        plan = state.home_plan(job.job_id, dc, dm, strict=False)
        if plan is None:
            self.take_back(home, dc, dm)
            plan = state.home_plan(job.job_id, dc, dm, strict=False)
        if plan is None:
            return False
        self.hold(pos, plan, dc, dm, point, speed, reason)
        return True

    def home_points(self, job: JobView, best: OperatingPoint) -> list[OperatingPoint]:
        """The operating points `keep_home` tries before proportional, fastest first. Tune: the best case."""
        return [best]

    home_points.best_only = True  # type: ignore[attr-defined]  # hold_current's inlined try (tune_steady.py)

    def make_room_and_place(
        self,
        pos: int,
        dc: Sequence[float],
        dm: Sequence[float],
        point: OperatingPoint | None,
        speed: float,
        reason: str,
    ) -> None:
        """Step 5: take surplus back, then place; pending (`fragmented`) if it still does not fit.

        Without claims this is the reference's step 5. With claims, room is made first on the
        job's own servers (when its GPUs there are free), then on servers chosen by their unclaimed
        GPUs, and only then on the reference's servers, each try only if the one before did not
        let the job in: making room where the free GPUs are someone's would just move them.
        """
        job = self.jobs[pos]
        tried: list[Plan] = []
        for servers in self.room_candidates(job):
            if servers in tried:
                continue
            tried.append(servers)
            self.take_back(servers, dc, dm)
            if self.try_place(pos, dc, dm, point, speed, reason):
                return
        self.pending(pos)

    def room_candidates(self, job: JobView) -> Iterator[Plan]:
        """Where step 5 makes room, best first (computed lazily: each try changes the state)."""
        state = self.state
        home = state.home_servers(job.job_id)
        if home is not None:
            yield home
        if state.node_shape(job.job_id) is not None:
            yield from self.node_room_candidates(job)
            return
        if state.has_claims:
            servers = self.underutilized_servers(job.num_gpus, state.num_unclaimed)
            if sum(k for _, k in servers) == job.num_gpus:
                yield servers
        yield self.underutilized_servers(job.num_gpus, state.num_free)

    def node_room_candidates(self, job: JobView) -> Iterator[Plan]:
        """Step 5's servers for a job with a node count: N servers with its per-server GPUs
        unclaimed, then free (fewest first); room made anywhere else could not let it in."""
        state = self.state
        if state.has_claims:
            servers = state.node_servers(job.job_id, state.num_unclaimed)
            if servers is not None:
                yield servers
        servers = state.node_servers(job.job_id, state.num_free)
        if servers is not None:
            yield servers

    def pending(self, pos: int) -> None:
        """Leave the job pending (`fragmented`, or why its node count found no servers) and drop its
        claim on its GPUs of last round."""
        job = self.jobs[pos]
        self.state.release(job.job_id)
        self.left_out.append(pos)
        self.builder.pending(pos, self.state.node_pending_reason(job) or reasons.FRAGMENTED)

    def try_intermediate(self, pos: int, job: JobView, best: OperatingPoint) -> bool:
        """Hook for tune_matrix: place between best case and proportional. Tune has no such step."""
        return False

    def try_place(
        self,
        pos: int,
        dc: Sequence[float],
        dm: Sequence[float],
        point: OperatingPoint | None,
        speed: float,
        reason: str,
    ) -> bool:
        job = self.jobs[pos]
        num_gpus, owner = job.num_gpus, job.job_id
        state = self.state
        if point is not None:  # a uniform per-GPU demand (best case or a matrix point)
            plan = state.find_uniform(
                self.placement, num_gpus, point.cpus_per_gpu, point.mem_gb_per_gpu, owner
            )
        else:
            plan = state.find(self.placement, num_gpus, dc, dm, owner)
        if plan is None:
            return False
        self.hold(pos, plan, dc, dm, point, speed, reason)
        return True

    def hold(
        self,
        pos: int,
        plan: Plan,
        dc: Sequence[float],
        dm: Sequence[float],
        point: OperatingPoint | None,
        speed: float,
        reason: str,
        *,
        at_home: bool = False,
    ) -> None:
        """Commit `plan` for the job at `pos` at this demand, operating point and reason (`at_home`:
        keep_home's first try found it, strictly, on its GPUs of last round)."""
        if self.settled:
            self.settled = self.settles(pos, plan, dc, dm, speed, reason, at_home)
        shares = self.state.take(plan, dc, dm, self.jobs[pos].job_id)
        revertible = point is not None and reason != reasons.FIXED_DEMAND
        held = HeldJob(self.jobs[pos], pos, len(self.held), shares, point, speed, reason, revertible)
        self.held.append(held)
        for share in shares:
            self.on_server[share.server_pos].append(held)

    # -- step 5: take surplus back from peers -------------------------------------------------
    def underutilized_servers(self, num_gpus: int, num_free: Sequence[int]) -> Plan:
        """Servers whose free GPUs the job will use (resources/cluster.py `_get_underutilized_servers`).

        Multi-GPU: the first server (lowest position) with all the GPUs free. Otherwise servers
        by fewest free GPUs (the reference's min-heap), taking all their free GPUs until covered.
        `num_free`: the free GPUs per server, or the unclaimed ones.
        """
        if num_gpus > 1:
            for i, n in enumerate(num_free):
                if n >= num_gpus:
                    return [(i, num_gpus)]
        chosen: Plan = []
        need = num_gpus
        for n, i in sorted((n, i) for i, n in enumerate(num_free) if n > 0):
            if n >= need:
                chosen.append((i, need))
                return chosen
            chosen.append((i, n))
            need -= n
        return chosen

    def take_back(self, servers: Plan, dc: Sequence[float], dm: Sequence[float]) -> None:
        """Shrink peers on `servers` until each covers its part (k GPUs) of the job's need."""
        for i, k in servers:
            need_cpus, need_mem_gb = self.shortfall(i, k, dc, dm)
            if need_cpus <= EPS and need_mem_gb <= EPS:
                continue
            for peer in sorted(self.on_server[i], key=HeldJob.peer_key):
                if not peer.revertible:
                    continue
                self.settled = False  # a peer may leave its best case
                share = next(s for s in peer.shares if s.server_pos == i)
                freed_cpus, freed_mem_gb = self.shrink_peer(peer, share, need_cpus, need_mem_gb)
                need_cpus -= freed_cpus
                need_mem_gb -= freed_mem_gb
                if need_cpus <= EPS and need_mem_gb <= EPS:
                    break

    def shrink_peer(
        self, peer: HeldJob, share: HeldShare, need_cpus: float, need_mem_gb: float
    ) -> tuple[float, float]:
        """Revert a peer whole to proportional; return what that freed on `share`'s server."""
        return self.revert_to_proportional(peer, share)

    def surplus(self, share: HeldShare) -> tuple[float, float]:
        """What a share holds above its server's proportional share (may be negative)."""
        i, k = share.server_pos, share.num_gpus
        return share.cpus - k * self.state.prop_cpus[i], share.mem_gb - k * self.state.prop_mem_gb[i]

    def revert_to_proportional(self, peer: HeldJob, share: HeldShare) -> tuple[float, float]:
        surplus_cpus, surplus_mem_gb = self.surplus(share)
        if surplus_cpus <= EPS and surplus_mem_gb <= EPS:
            return 0.0, 0.0
        state = self.state
        targets = [
            (s, s.num_gpus * state.prop_cpus[s.server_pos], s.num_gpus * state.prop_mem_gb[s.server_pos])
            for s in peer.shares
        ]
        for s, cpus, mem_gb in targets:
            # A revert must never need more than is free on any of the peer's servers.
            if cpus - s.cpus > state.free_cpus[s.server_pos] + EPS:
                return 0.0, 0.0
            if mem_gb - s.mem_gb > state.free_mem_gb[s.server_pos] + EPS:
                return 0.0, 0.0
        for s, cpus, mem_gb in targets:
            state.adjust(s, cpus, mem_gb)
        peer.point, peer.speed, peer.revertible = None, 1.0, False
        peer.reason = reasons.REVERTED_TO_PROPORTIONAL
        return surplus_cpus, surplus_mem_gb


@register_allocator("tune")
class TuneAllocator(Allocator):
    """Synergy-TUNE (see the module docstring for the steps and where we differ from the reference)."""

    round_class: type[TuneRound] = TuneRound
    # Only admitted jobs claim, are placed, count in a plan's throughput or its best case.
    waits_unadmitted = True

    def __init__(
        self, placement: str | Score = PACKED, *, order: str = ORDER_GPUS, repack_gain: float | None = 0.05
    ) -> None:
        placement = score_named(placement)
        if order not in ORDERS:
            raise ValueError(f"order must be one of {ORDERS}, got {order!r}")
        if repack_gain is not None and repack_gain < 0:
            raise ValueError(f"repack_gain must be >= 0 (None: never repack), got {repack_gain!r}")
        self.placement = placement
        self.order = order
        self.repack_gain = repack_gain
        self._fresh = FreshThroughputs()  # the last round's fresh plan's throughput (tune_repack.py)

    def __getstate__(self) -> dict[str, object]:
        # Pickled with a forecast's run: its memory of a round (a snapshot, the jobs' profiles) left out.
        state = dict(self.__dict__)
        state["_fresh"] = FreshThroughputs()
        return state

    def __setstate__(self, state: dict[str, object]) -> None:
        state.setdefault("_fresh", FreshThroughputs())  # pickled before it had one
        self.__dict__.update(state)

    def extend(
        self, previous: RoundPlan, ordered_jobs: Sequence[JobView], snapshot: ClusterSnapshot
    ) -> RoundPlan | None:
        """Allocator.extend: the stable plan with the arrivals placed at their best case behind its
        jobs (allocators/tune_extend.py). Only tune's own rounds and order: a subclass that decides
        otherwise (its own `allocate`) decides every round."""
        if self.order != ORDER_GPUS or type(self).allocate is not TuneAllocator.allocate:
            return None
        placement, round_class = self.placement, self.round_class

        def make_round(
            jobs: Sequence[JobView], snap: ClusterSnapshot, admission: tuple[list[str | None], list[bool]]
        ) -> TuneRound:
            return round_class(jobs, snap, placement, admission=admission)

        return extend_stable(make_round, previous, ordered_jobs, snapshot)

    def allocate(self, ordered_jobs: Sequence[JobView], snapshot: ClusterSnapshot) -> RoundPlan:
        """The plan that keeps the most jobs where they run among those within `repack_gain` of the
        fastest: every job kept home (`keep_home`); else jobs moved only where their own operating
        point gains (stickiness without `keep_home`); else the plan without claims."""
        sticky_round = self.round_class(ordered_jobs, snapshot, self.placement, order=self.order)
        sticky = sticky_round.run()
        if self.repack_gain is None or sticky.stable:
            # A stable plan has every job at its best case: its throughput is the bound below, summed
            # in the same order, so the repack test would keep it (SteadyRound.settles).
            return sticky
        if not any(job.current is not None for job in ordered_jobs):
            return sticky

        def make_round(sticky: bool, keep_homes: bool) -> TuneRound:
            # The fresh and loose plans share the sticky one's set-up (the same jobs on the same snapshot).
            return self.round_class(
                ordered_jobs,
                snapshot,
                self.placement,
                order=self.order,
                sticky=sticky,
                keep_homes=keep_homes,
                like=sticky_round,
            )

        return repacked(sticky_round, sticky, self.repack_gain, self._fresh, make_round)
