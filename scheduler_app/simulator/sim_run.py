"""One simulation's mutable state: each job's progress and lease, and applying a round's plan to them.

Shared by simulate() (simulation.py) and the forecast (forecast.py). A job's lease is its current
placement's run: it continues while a round keeps the job's GPUs, cores and memory (or changes only
its cores and memory where resizes are made in place), and ends when the job is moved or paused. A
new lease waits its start-up before progressing; where lost work is charged, ending a lease rolls the
job's progress back to its last checkpoint (docs/restarts.md).
"""

from __future__ import annotations

import logging
import math
from collections import defaultdict
from collections.abc import Mapping

from scheduler_app.core.restarts import Change, change_of
from scheduler_app.core.types import JobView, Outcome, Placement, RoundPlan, SensitivityProfile
from scheduler_app.simulator import reapply
from scheduler_app.simulator.metrics import UtilisationSeries
from scheduler_app.simulator.sim_job import Lease, SimJob

logger = logging.getLogger(__name__)

# Relative slack when deciding that a job finishes inside a round (exact mode), against float residue
# such as 1e-12 iterations left over, which would otherwise cost a whole extra round.
_FINISH_REL_TOL = reapply.FINISH_REL_TOL


def first_finish_s(plan: RoundPlan, active: Mapping[int, SimJob], now_s: float, in_place: bool) -> float:
    """When the first job placed by `plan` would finish if nothing changed (event mode's next event)."""
    first = math.inf
    for decision in plan.decisions:
        placement = decision.placement
        if placement is None:
            continue
        job = active[decision.job_id]
        lease = job.lease_of(placement, in_place)
        need_s = job.remaining_after(lease) * job.iter_time_s / placement.speedup
        first = min(first, now_s + job.startup_for(lease) + need_s)
    return first


def _resources(placement: Placement, profile: SensitivityProfile) -> tuple[int, float, float, float, float]:
    """(GPUs, cores, GB) a placement holds, then the cores and GB the job turns into speed.

    Useful = min(allocated, best-case demand) on each server: resources beyond a job's best case buy
    no throughput.
    """
    gpus = 0
    cpus = mem_gb = cpus_used = mem_used = 0.0
    best_cpus = profile.best_cpus_per_gpu
    best_mem = profile.best_mem_gb_per_gpu
    for share in placement.shares:
        n = len(share.gpu_indices)
        gpus += n
        cpus += share.num_cpus
        mem_gb += share.mem_gb
        cpus_used += min(share.num_cpus, best_cpus * n)
        mem_used += min(share.mem_gb, best_mem * n)
    return gpus, cpus, mem_gb, cpus_used, mem_used


def _advance(job: SimJob, placement: Placement, now_s: float, round_s: float, round_end: bool) -> float:
    """Run `job` for one round on `placement` (its start-up first), setting finish_s if it completes;
    return the seconds held."""
    speedup = placement.speedup
    if not speedup > 0:
        raise ValueError(f"allocator gave job {job.job_id} a non-positive speedup {speedup}")
    overhead_s = min(job.startup_left_s, round_s)
    if overhead_s > 0:
        job.startup_left_s -= overhead_s
        if job.restart_lease:
            job.lost_gpu_s += overhead_s * placement.num_gpus
    run_s = round_s - overhead_s
    rate = speedup / job.iter_time_s
    if round_end:
        # The reference credits floor(round / effective iteration time) whole iterations per round
        # and finishes the job when its lease ends.
        if run_s > 0:
            iters = math.floor(run_s / (job.iter_time_s / speedup))
            if job.checkpoint_every_s:
                job.progress(run_s, iters, rate, whole=True)
            else:  # progress() without checkpoints, inlined: this runs for every job every round
                job.done_iters += iters
                job.since_ckpt_s += run_s
        if job.done_iters >= job.total_iters:
            job.done_iters = job.total_iters
            job.finish_s = now_s + round_s
        return round_s
    need_s = (job.total_iters - job.done_iters) / rate
    if need_s <= run_s * (1.0 + _FINISH_REL_TOL):  # reapply.finishes_within, inlined
        job.done_iters = job.total_iters
        job.finish_s = now_s + overhead_s + need_s
        return overhead_s + need_s
    if job.checkpoint_every_s:
        job.progress(run_s, run_s * rate, rate, whole=False)
    else:
        job.done_iters += run_s * rate
        job.since_ckpt_s += run_s
    return round_s


class SimRun:
    """The mutable state of one simulation: who is active and running, and the running totals.

    `in_place`: a change of cores or memory on the same GPUs continues the lease (no restart).
    `progress_blind`: the rounds read neither progress nor the clock (a static order, an allocator
    that does not read progress, no restart guard: what lets simulate() reuse a plan), so a job's
    JobView is built again only when its placement changes, not after every round it runs.
    """

    def __init__(
        self, *, round_s: float, round_end: bool, in_place: bool = False, progress_blind: bool = False
    ) -> None:
        self.round_s = round_s
        self.round_end = round_end
        self.in_place = in_place
        self.progress_blind = progress_blind
        self.kept = False  # the last plan applied left every job as it was (see apply)
        self.active: dict[int, SimJob] = {}  # arrived and unfinished, in arrival order
        self.running: dict[int, SimJob] = {}  # placed in the previous round, unfinished
        self.infeasible = 0
        # Resource-seconds: GPUs, cores, GB allocated; cores and GB turned into speed.
        self.totals = [0.0, 0.0, 0.0, 0.0, 0.0]
        self.series = UtilisationSeries()
        # GPU-seconds each owner's jobs attained in this run (fair share; no decay within a run).
        self.owner_gained_gpu_s: dict[int, float] = defaultdict(float)
        self._last_plan: RoundPlan | None = None  # the plan applied last
        self._template: reapply.Template | None = None  # its template, once applied again (reapply.py)
        self._template_plan: RoundPlan | None = None  # the plan _template was built for (None: none fits)

    def views(self) -> list[JobView]:
        views = []
        gained = self.owner_gained_gpu_s
        for job in self.active.values():
            if job.owner_id is None:
                views.append(job.view if job.view is not None else job.job_view())
            else:  # the owner's usage moves whenever any of their jobs runs
                views.append(job.job_view(job.owner_base_usage_gpu_s + gained[job.owner_id]))
        return views

    def apply(
        self, plan: RoundPlan, now_s: float, interval_s: float | None = None
    ) -> tuple[int, list[SimJob]]:
        """Apply one round's plan for `interval_s` (default: a round); returns how many jobs were
        placed and those that finished. Sets `kept`: whether the plan left every job as it was
        (keeps_everyone, found on the way)."""
        active = self.active
        if interval_s is None:
            if plan is self._last_plan:
                if self._template_plan is not plan:
                    self._template_plan = plan
                    self._template = reapply.build(plan, active, self.round_s, self.round_end)
                if self._template is not None:
                    return self._reapply(self._template, now_s)
            elif self._template is not None:
                # The template of the plan applied last (less the jobs that finished then) may be
                # this plan's: the same plan less those jobs' decisions, or with arrivals waiting.
                template = reapply.adopt(self._template, plan, active)
                if template is not None:
                    self._last_plan = self._template_plan = plan
                    self._template = template
                    return self._reapply(template, now_s)
        prefix = self._template
        covered = None
        if prefix is not None and interval_s is None:
            # Or its rows are this plan's first decisions, and arrivals are placed after them.
            covered = reapply.adopt_prefix(prefix, plan, active)
        self._last_plan = self._template_plan = self._template = None
        round_end, in_place, blind = self.round_end, self.in_place, self.progress_blind
        round_s = self.round_s if interval_s is None else interval_s
        new_running: dict[int, SimJob] = {}
        done_now: list[SimJob] = []
        sums = [0.0, 0.0, 0.0, 0.0, 0.0]  # this round's GPUs, cores, GB, useful cores, useful GB
        totals = self.totals
        owner_gained = self.owner_gained_gpu_s
        kept = len(plan.decisions) == len(active)
        decisions = plan.decisions
        if covered is not None:
            assert prefix is not None
            # The rows first, as _reapply applies them (the same operations in the same order), then
            # the decisions after them one by one below, their sums added to the rows'.
            done_now = reapply.run(prefix, now_s, totals, owner_gained, blind)
            sums = list(prefix.sums)
            for row in prefix.rows:
                job = row[0]
                if job.finish_s is None:
                    new_running[job.job_id] = job
            decisions = decisions[covered:]
        for decision in decisions:
            placement = decision.placement
            if placement is None:
                if decision.outcome is Outcome.INFEASIBLE:
                    kept = False
                    self._drop(decision.job_id, decision.reason)
                elif kept and active[decision.job_id].current is not None:
                    kept = False  # paused
                continue
            job = active[decision.job_id]
            previous = job.current
            if placement is previous:
                # A reused plan holds the very Placement applied last round: the lease continues.
                if job.start_s is None:
                    job.start_s = now_s  # a live job's first simulated round (the forecast)
                if job.startup_left_s or job.checkpoint_every_s:
                    held_s = _advance(job, placement, now_s, round_s, round_end)
                elif round_end:
                    # _advance without a start-up or checkpoints, inlined (the same float operations):
                    # most jobs of most rounds; its speed-up was checked when it was first applied.
                    if round_s > 0:
                        job.done_iters += math.floor(round_s / (job.iter_time_s / placement.speedup))
                        job.since_ckpt_s += round_s
                    if job.done_iters >= job.total_iters:
                        job.done_iters = job.total_iters
                        job.finish_s = now_s + round_s
                    held_s = round_s
                else:
                    rate = placement.speedup / job.iter_time_s
                    need_s = (job.total_iters - job.done_iters) / rate
                    if need_s <= round_s * (1.0 + _FINISH_REL_TOL):  # reapply.finishes_within
                        job.done_iters = job.total_iters
                        job.finish_s = now_s + 0.0 + need_s
                        held_s = 0.0 + need_s
                    else:
                        job.done_iters += round_s * rate
                        job.since_ckpt_s += round_s
                        held_s = round_s
                resources = job.resources
                if resources is None:
                    resources = job.resources = _resources(placement, job.profile)
                if not blind:
                    job.view = None  # its progress is out of date
            else:
                same = previous is not None and placement.shares == previous.shares
                if not same or placement.speedup != previous.speedup:  # type: ignore[union-attr]
                    kept = False
                lease = Lease.CONTINUES if same else job.lease_of(placement, in_place)
                if lease is not Lease.CONTINUES:
                    if previous is not None:  # the scheduler ends its lease: moved or restarted to resize
                        job.preemptions += 1
                        if change_of(previous, placement) is Change.MOVED:
                            job.moves += 1
                        job.end_lease()
                    job.begin_lease(lease, now_s)
                if job.start_s is None:
                    job.start_s = now_s
                held_s = _advance(job, placement, now_s, round_s, round_end)
                resources = job.resources
                if not same or resources is None:
                    resources = job.resources = _resources(placement, job.profile)
                job.current = placement
                job.has_run = True
                if not (blind and same and placement.speedup == previous.speedup):  # type: ignore[union-attr]
                    # Its view's progress and placement are out of date (a blind round reads only
                    # the placement, and an equal one is as good as the one the view holds).
                    job.view = None
            gpus, cpus, mem_gb, cpus_used, mem_used = resources  # type: ignore[misc]
            # The GPUs it holds (a job with GPU choices may run on fewer or more than it asked for).
            job.attained_gpu_s += held_s * gpus
            if job.owner_id is not None:
                owner_gained[job.owner_id] += held_s * gpus
            sums[0] += gpus
            sums[1] += cpus
            sums[2] += mem_gb
            sums[3] += cpus_used
            sums[4] += mem_used
            totals[0] += gpus * held_s
            totals[1] += cpus * held_s
            totals[2] += mem_gb * held_s
            totals[3] += cpus_used * held_s
            totals[4] += mem_used * held_s
            if job.finish_s is not None:
                done_now.append(job)
            else:
                new_running[job.job_id] = job

        # Jobs that ran last round and got nothing this round are preempted (paused).
        for job_id, job in self.running.items():
            if job_id not in new_running and job.finish_s is None and job_id in active:
                job.preemptions += 1
                job.end_lease()
                job.current = None
                job.view = None
        self.running = new_running
        self.kept = kept
        placed = len(new_running) + len(done_now)
        self.series.append(now_s, int(sums[0]), *sums[1:], placed, len(active) - placed)
        if covered is not None:
            assert prefix is not None
            # The plan's template for its next application: the rows', then the jobs it started.
            started = [active[d.job_id] for d in decisions if d.placement is not None]
            template = reapply.with_started(prefix, plan, started, active)
            if template is not None and done_now:
                template = reapply.without(template, done_now)  # adopted (or not) by the next plan
            elif template is not None:
                self._template_plan = plan
            self._template = template
        for job in done_now:
            del active[job.job_id]
            job.current = None
        self._last_plan = plan if covered is None or not done_now else None
        return placed, done_now

    def _reapply(self, template: reapply.Template, now_s: float) -> tuple[int, list[SimJob]]:
        """apply() of the plan applied last, again, from its template: every placed job continues (so
        none is paused: `running` holds them all) and the round's sums are the template's."""
        done_now = reapply.run(template, now_s, self.totals, self.owner_gained_gpu_s, self.progress_blind)
        self.kept = True
        placed, sums = template.placed, template.sums
        self.series.append(now_s, int(sums[0]), *sums[1:], placed, len(self.active) - placed)
        if done_now:
            # The next plan is another one; it may be adopted by this template less their rows.
            self._last_plan = self._template_plan = None
            self._template = reapply.without(template, done_now)
            for job in done_now:
                del self.active[job.job_id]
                del self.running[job.job_id]
                job.current = None
        return placed, done_now

    def end(self, job_id: int) -> None:
        """Take a running job out of the run between rounds (the forecast ends it at its time limit):
        the plans remembered for reapplying held it, so none is reapplied."""
        job = self.active.pop(job_id)
        self.running.pop(job_id, None)
        job.current = None
        self._last_plan = self._template_plan = self._template = None

    def _drop(self, job_id: int, reason: str) -> None:
        job = self.active.pop(job_id)
        self.running.pop(job_id, None)
        self.infeasible += 1
        logger.warning(
            "job %d (%s, %d GPUs) can never run on this cluster (%s); dropped",
            job.job_id,
            job.model,
            job.num_gpus,
            reason,
        )
