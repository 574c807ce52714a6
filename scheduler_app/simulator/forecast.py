"""Forecast: play the live queue forward, with no new arrivals, to predict when each job starts and ends.

The live service's admission feedback (scheduler_app/services/admission.py) and Slurm's `squeue
--start` answer the same question; here it is answered by the same core and the same round loop as
the simulator, so the prediction follows the configured policy and allocator exactly (CPU/memory
speed-ups, stickiness, QoS ordering), not a GPU-count approximation. What it cannot know: later
arrivals (which may overtake under SRTF, EDF or SWAF), failures, and speeds that differ from the
profiles; the service stores each prediction and compares it with what happened.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Collection, Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from scheduler_app.core.allocators import Allocator
from scheduler_app.core.allocators.genie_needs import unchanging_key
from scheduler_app.core.engine import schedule_round
from scheduler_app.core.guard_trace import GuardTrace
from scheduler_app.core.move_guard import guarded_replay, one_server_views
from scheduler_app.core.policies import Policy
from scheduler_app.core.restarts import RestartPolicy
from scheduler_app.core.types import ClusterSnapshot, JobView, RoundPlan
from scheduler_app.simulator.forecast_holds import ForecastHolds
from scheduler_app.simulator.forecast_limits import ForecastLimits
from scheduler_app.simulator.forecast_steady import (
    continuing_rows,
    rounds_before_a_finish,
    skip_steady_rounds,
)
from scheduler_app.simulator.reuse import (
    ReusingAllocator,
    guard_reusable,
    holds,
    ordered_if_holds,
    reusable,
)
from scheduler_app.simulator.sim_run import SimJob, SimRun
from scheduler_app.simulator.simulation import keeps_everyone, resolve_run

# How many of the last rounds' CPU `ForecastRun.play` weighs for the next round's.
RECENT_ROUNDS = 8
# The most rounds one stretch of a reused plan applies (`ForecastRun._jump`). `play` asks its caller's
# budget between stretches as between rounds, and a stretch still applies its rounds one by one, so
# this bounds how far past a CPU budget one stretch can run: at most this many rounds' applying (each
# a fraction of a decided round's cost), plus the check at its end.
STRETCH_MOST_ROUNDS = 64


@dataclass(frozen=True, slots=True)
class JobForecast:
    """Predicted start and finish (seconds on the caller's clock); None: not within the horizon.

    `start_s` is the job's first round in the forecast, or its real start when it already runs.
    `timed_out`: the forecast ended it at its time limit (`finish_s`), its work not done.
    """

    job_id: int
    start_s: float | None
    finish_s: float | None
    timed_out: bool = False


def forecast(
    snapshot: ClusterSnapshot,
    jobs: Sequence[JobView],
    *,
    policy: str | Policy,
    allocator: str | Allocator,
    first_round_s: float,
    round_s: float = 300.0,
    started_s: dict[int, float] | None = None,
    until_finished: Iterable[int] | None = None,
    max_rounds: int = 2016,
    time_budget_s: float | None = None,
    team_quota_gpus: Mapping[int, int] | None = None,
    borrowing_teams: Collection[int] = (),
    after: Mapping[int, Iterable[int]] | None = None,
    array_limits: Mapping[int, tuple[int, Sequence[int]]] | None = None,
    time_left_s: Mapping[int, float] | None = None,
    restarts: RestartPolicy | None = None,
    shortcuts: bool = True,
) -> dict[int, JobForecast]:
    """Run rounds from `first_round_s` on `snapshot` (the live round's input: every resource free that
    the round re-decides, anything held outside it subtracted) until every job of
    `until_finished` (default: all) has finished, no job can be placed, or `max_rounds` have passed
    (2016 rounds of 300 s: one week). Jobs finish at their exact time inside a round.

    `started_s`: real start times of jobs already running (their forecast keeps them).
    `time_budget_s`: stop after this much wall time (a web request's patience); jobs not finished by
    then get no finish time, like those beyond `max_rounds`. Under a static order (FIFO) with
    `until_finished`, jobs ordered after the last target are left out of the forecast and the result.
    `team_quota_gpus`, `borrowing_teams`: as in schedule_round.
    `after`: job id -> ids of the jobs it waits for (Slurm's afterok). Such a job joins the queue in
    the round after the last of them finishes, and never if one of them is not in `jobs` or is dropped.
    `array_limits`: array id -> (its limit on tasks running at once, its live tasks' ids in index
    order): a task past the limit joins the queue when one of its array's finishes (forecast_holds.py).
    `time_left_s`: job id -> the run time its time limit leaves it at `first_round_s`: the forecast
    charges a job's run time while it holds resources and ends it at its limit, as the service does
    (TIMEOUT; forecast_limits.py): its finish is then that time, and a job after it never starts.
    `restarts`: the live rounds' RestartPolicy, passed to every round (running jobs move only when it
    pays); with it the forecast also charges restarts as the simulator does, from each view's
    startup_s, checkpoint_every_s and lease_started_s (on the clock of `first_round_s`): a start waits
    its start-up, a restart loses the run since the last checkpoint. None: free restarts.
    `shortcuts` (where repeated rounds are skipped): without the move guard, a plan that leaves every
    job as it was (no start, no move, no drop) counts as repeated at once: the next round's inputs are
    the same but for the clock, so it is not decided only to be found the same. False: that round
    decided by the core.
    Under other orders (by progress or the clock: swaf, sjf, srtf), or where the allocator may read
    progress, a plan that kept everyone is reused, round by round, while the policy orders the jobs as
    it did and the plan was decided from the order and the placements alone (simulator/reuse.py): each
    such round costs an order instead of an allocation and gives what deciding it would. False: every
    such round decided.

    The same forecast can be played in parts: ForecastRun.
    """
    wall_start = time.perf_counter()
    run = ForecastRun(
        snapshot,
        jobs,
        policy=policy,
        allocator=allocator,
        first_round_s=first_round_s,
        round_s=round_s,
        started_s=started_s,
        until_finished=until_finished,
        max_rounds=max_rounds,
        team_quota_gpus=team_quota_gpus,
        borrowing_teams=borrowing_teams,
        after=after,
        array_limits=array_limits,
        time_left_s=time_left_s,
        restarts=restarts,
        shortcuts=shortcuts,
    )
    if time_budget_s is None:
        run.play()
    else:
        run.play(lambda _round_s: time.perf_counter() - wall_start > time_budget_s)
    return run.results()


class ForecastRun:
    """One forecast (`forecast`'s arguments) played round by round, in as many parts as its caller
    wants: `play` until a caller's budget says stop, then again later, in this process or, pickled, in
    another. The parts give exactly the rounds, and so the forecast, that one call gives: the rounds
    read only the simulated state and clock, never the wall clock.

    Pickled, it leaves out what its allocator remembers of earlier allocations (answered again the
    same, deciding them: the allocators are pure); that memory is keyed partly by object identity,
    which another process does not share.
    """

    def __init__(
        self,
        snapshot: ClusterSnapshot,
        jobs: Sequence[JobView],
        *,
        policy: str | Policy,
        allocator: str | Allocator,
        first_round_s: float,
        round_s: float = 300.0,
        started_s: dict[int, float] | None = None,
        until_finished: Iterable[int] | None = None,
        max_rounds: int = 2016,
        team_quota_gpus: Mapping[int, int] | None = None,
        borrowing_teams: Collection[int] = (),
        after: Mapping[int, Iterable[int]] | None = None,
        array_limits: Mapping[int, tuple[int, Sequence[int]]] | None = None,
        time_left_s: Mapping[int, float] | None = None,
        restarts: RestartPolicy | None = None,
        shortcuts: bool = True,
    ) -> None:
        if not round_s > 0:
            raise ValueError(f"round_s must be positive, got {round_s}")
        policy_obj, allocator_obj, _, _ = resolve_run(policy, allocator)
        started_s = started_s or {}
        views = list(jobs)
        if restarts is not None and restarts.one_server:
            # What the engine does to every round's views, done once (it then leaves them as they are),
            # so that the order reuse.py checks is the order of the views the engine decides.
            views = one_server_views(views, snapshot)
        targets = {v.job_id for v in views} if until_finished is None else set(until_finished)
        self.holds = holds = ForecastHolds.of(after, array_limits)
        # Cutting the queue behind the last target would drop a dependency ordered after it, or an
        # array's task that holds a place within its limit.
        if policy_obj.static_order and until_finished is not None and not holds:
            # The order never changes, so jobs behind the last target can only take what is left:
            # they do not move its start (GPU admission is in policy order) and are not simulated.
            ordered = policy_obj.order(views, snapshot, first_round_s)
            positions = [i for i, v in enumerate(ordered) if v.job_id in targets]
            if positions:
                views = ordered[: max(positions) + 1]
        # With a static order, an allocator that ignores progress and no move guard (it reads lease
        # ages and the clock: a start it holds back while a move does not pay comes rounds later, with
        # nothing else changed), a plan that repeats keeps repeating until a job finishes: those rounds
        # are skipped in one step. Under the guard a repeated plan is replayed by the guard (recheck).
        self.can_skip = policy_obj.static_order and not allocator_obj.reads_progress and restarts is None
        self.recheck = shortcuts and not self.can_skip
        self.shortcuts = shortcuts
        if shortcuts:
            # Without the guard an allocation repeats only in a round reused whole: nothing to remember.
            allocator_obj = ReusingAllocator(allocator_obj, remember=restarts is not None)
        self.snapshot = snapshot
        self.policy = policy_obj
        self.allocator = allocator_obj
        self.restarts = restarts
        self.team_quota_gpus = team_quota_gpus
        self.borrowing_teams = borrowing_teams
        self.first_round_s = first_round_s
        self.round_s = round_s
        self.max_rounds = max_rounds
        costs = restarts is not None
        self.run = run = SimRun(round_s=round_s, round_end=False, in_place=costs and restarts.resize_in_place)
        self.sim_jobs: dict[int, SimJob] = {}
        self.held: dict[int, SimJob] = {}  # jobs waiting for their dependencies, or their array's room
        held_at_start = holds.held_at_start(views) if holds else set()
        for view in sorted(views, key=lambda v: (v.arrival_s, v.job_id)):
            job = SimJob.from_view(view, now_s=first_round_s, costs=costs)
            job.start_s = started_s.get(view.job_id)
            self.sim_jobs[view.job_id] = job
            if view.job_id in held_at_start:
                self.held[view.job_id] = job
                continue
            run.active[view.job_id] = job
            if view.current is not None:
                run.running[view.job_id] = job
        self.waiting_for = targets & set(self.sim_jobs)
        self.limits = ForecastLimits({j: s for j, s in (time_left_s or {}).items() if j in self.sim_jobs})
        self.previous: RoundPlan | None = None
        self.reuse: RoundPlan | None = None  # a plan reuse.py's conditions let the next round reuse
        self.reuse_key: object = None  # its progress key
        self.guard: GuardTrace | None = None  # the guard's trace, where `reuse` was pinned or weighed
        self.k = 0  # rounds played (skipped ones included)
        self.decided = 0  # rounds the core decided (the others reused or skipped)
        self.stopped = False  # nothing fits and nothing will change: no arrivals in a forecast
        # The CPU the last rounds played took (play's `stop` reads them).
        self.recent_round_cpu_s: deque[float] = deque(maxlen=RECENT_ROUNDS)

    @property
    def next_round_s(self) -> float:
        """When the next round to play would be: a job that has not started in the rounds played so far
        starts at this time at the earliest (the lower bound a forecast cut short can still give)."""
        return self.first_round_s + self.k * self.round_s

    @property
    def done(self) -> bool:
        """Every target finished (or dropped), the horizon reached, or nothing left that can change."""
        return self.stopped or not (self.k < self.max_rounds and self.waiting_for and self.run.active)

    def play(self, stop: Callable[[float], bool] | None = None) -> bool:
        """Play rounds until the forecast is done or `stop(round_s)` says stop, asked before each round
        with the CPU seconds (process time) of the costliest of the last RECENT_ROUNDS rounds played,
        in this part or earlier ones (0.0 before the first): a caller with a CPU budget stops where
        the next round, should it cost as much, would overrun it. (A round's cost jumps where finishes
        make the allocator place jobs afresh: at 4,000 GPUs from 0.18 to 0.54 s, and from 0.05 to 0.24
        s later on; the costliest of the last few follows those better than the last one alone.)
        Returns whether the forecast is done."""
        while not self.done:
            if stop is not None and stop(max(self.recent_round_cpu_s, default=0.0)):
                break
            cpu_start = time.process_time()
            self._round()
            self.recent_round_cpu_s.append(time.process_time() - cpu_start)
        return self.done

    def _round(self) -> None:
        run, k, round_s = self.run, self.k, self.round_s
        limits = self.limits
        ran_before = [job_id for job_id in limits.left_s if job_id in run.running] if limits else ()
        allocator_obj, policy_obj, snapshot = self.allocator, self.policy, self.snapshot
        now_s = self.first_round_s + k * round_s
        views = run.views()
        reuse, guard = self.reuse, self.guard
        plan: RoundPlan | None = None
        if reuse is not None and guard is None:
            if holds(reuse, self.reuse_key, views, policy_obj, allocator_obj, snapshot, now_s):
                plan = reuse
        elif reuse is not None and guard is not None:
            ordered = ordered_if_holds(
                reuse, self.reuse_key, views, policy_obj, allocator_obj, snapshot, now_s
            )
            if ordered is not None:
                assert self.restarts is not None
                plan = guarded_replay(
                    guard,
                    ordered,
                    snapshot,
                    now_s,
                    self.restarts,
                    lambda ids: policy_obj.must_not_wait(
                        [j for j in ordered if j.job_id in ids], snapshot, now_s
                    ),
                )
        if plan is not None and guard is None and unchanging_key(self.reuse_key):
            # The order by progress and the clock, checked once for a stretch of rounds, not each.
            k = self._jump(plan, views, k)
            now_s = self.first_round_s + k * round_s
        decided = plan is None
        trace = GuardTrace() if self.recheck and self.restarts is not None else None
        if plan is None:
            if self.shortcuts:
                allocator_obj.begin_round()
            plan = schedule_round(
                snapshot,
                views,
                policy=policy_obj,
                allocator=allocator_obj,
                now_s=now_s,
                team_quota_gpus=self.team_quota_gpus,
                borrowing_teams=self.borrowing_teams,
                restarts=self.restarts,
                guard_trace=trace,
            )
            self.decided += 1
        previous, can_skip = self.previous, self.can_skip
        steady = can_skip and previous is not None and plan.decisions == previous.decisions
        if self.shortcuts and can_skip and not steady:
            steady = keeps_everyone(plan, run.active)
        if steady:
            most = self.max_rounds - 1 - k
            if limits:
                most = min(most, limits.rounds_within(run.running, round_s))
            k += skip_steady_rounds(plan, run.active, round_s, most)
        applied_s = self.first_round_s + k * round_s
        placed, done_now = run.apply(plan, applied_s)
        timed_out = limits.charge(run, ran_before, k - self.k, done_now, applied_s) if limits else []
        released = (
            self.holds.release(self.held, self.sim_jobs, run.active, limits.timed_out) if self.held else []
        )
        if self.recheck:
            # Reused next round while nothing arrives, finishes or is dropped and the order holds.
            kept = run.kept and not done_now and not released and not timed_out
            if not kept:
                self.reuse, self.guard = None, None
            elif decided:
                self.guard = None
                self.reuse_key = reusable(plan, allocator_obj, self.restarts)
                if self.reuse_key is None and trace is not None and trace.recorded:
                    # A plan the guard pinned or weighed: replayed while its inputs hold (reuse.py, 4').
                    by_id = {v.job_id: v for v in views}
                    ordered = [by_id[d.job_id] for d in plan.decisions]
                    self.reuse_key = guard_reusable(trace, allocator_obj, ordered, snapshot, now_s)
                    self.guard = trace if self.reuse_key is not None else None
                self.reuse = plan if self.reuse_key is not None else None
        for job_id in released:
            run.active[job_id] = self.held.pop(job_id)
        # Finished or dropped as infeasible: done; a held job is still to come.
        self.waiting_for.intersection_update(run.active.keys() | self.held.keys())
        if not placed and not released:
            self.stopped = True  # nothing fits and nothing will change: no arrivals in a forecast
        # A new job in the queue, or one ended at its limit: the plan may change.
        self.previous = None if released or timed_out else plan
        self.k = k + 1

    def _jump(self, plan: RoundPlan, views: Sequence[JobView], k: int) -> int:
        """Apply `plan`, reused at round k (`holds` there), to rounds k, k+1, ... without ordering the
        jobs at each, where that gives what playing them does; return the round to play next (k when
        none was applied).

        Where the policy's groups move linearly (Policy.linear_regime), the plan's progress key
        cannot change (genie_needs.unchanging_key) and every placed job continues on its lease
        (`continuing_rows`), rounds k to k+n-1 repeat the plan as long as no job finishes in them
        and, at round k+n, the groups are those of round k and the order holds: linear keys that
        agree at two times agree between them. The n rounds are applied one by one as playing them
        does (every float the same); only the orders of the rounds between are not worked out. n is
        the number of rounds before a job's finish (or the horizon, or STRETCH_MOST_ROUNDS), halved
        until the order holds at its end."""
        run = self.run
        regime = self.policy.linear_regime(views, self.snapshot, self.first_round_s + k * self.round_s)
        if regime is None:
            return k
        rows = continuing_rows(plan, run.active, self.round_s)
        if not rows:
            return k
        most = min(self.max_rounds - 1 - k, STRETCH_MOST_ROUNDS)
        if self.limits:
            most = min(most, self.limits.rounds_within(run.running, self.round_s))
        rounds = rounds_before_a_finish(rows, self.round_s, most)
        while rounds > 1:
            if self._holds_after(plan, rows, regime, k + rounds, rounds):
                round_s, first_round_s = self.round_s, self.first_round_s
                for r in range(k, k + rounds):
                    run.apply(plan, first_round_s + r * round_s)
                return k + rounds
            rounds //= 2
        return k

    def _holds_after(
        self, plan: RoundPlan, rows: list[tuple], regime: Hashable, at_round: int, rounds: int
    ) -> bool:
        """Whether, once `plan` has been applied for `rounds` rounds to the jobs of `rows`
        (`continuing_rows`: the progress and service it adds, in the same float operations, worked out on
        the jobs, then put back as it was), the policy's groups are `regime` and `holds` is true for
        `plan` at round `at_round`."""
        run = self.run
        owner_gained = run.owner_gained_gpu_s
        saved = [(row[0], row[0].done_iters, row[0].attained_gpu_s) for row in rows]
        saved_owners = dict(owner_gained)
        for job, step, _rate, held_gpu_s, owner in rows:
            done, attained = job.done_iters, job.attained_gpu_s
            for _ in range(rounds):
                done += step
                attained += held_gpu_s
            job.done_iters, job.attained_gpu_s, job.view = done, attained, None
            if owner is not None:
                gained = owner_gained[owner]
                for _ in range(rounds):
                    gained += held_gpu_s
                owner_gained[owner] = gained
        try:
            now_s = self.first_round_s + at_round * self.round_s
            views = run.views()
            policy = self.policy
            return policy.linear_regime(views, self.snapshot, now_s) == regime and holds(
                plan, self.reuse_key, views, policy, self.allocator, self.snapshot, now_s
            )
        finally:
            for job, done, attained in saved:
                job.done_iters, job.attained_gpu_s, job.view = done, attained, None
            owner_gained.clear()
            owner_gained.update(saved_owners)

    def settled(self) -> set[int]:
        """The jobs whose forecast no later round changes: finished, or dropped as infeasible (all of
        them once the forecast is done)."""
        if self.done:
            return set(self.sim_jobs)
        return {
            job_id
            for job_id, job in self.sim_jobs.items()
            if job.finish_s is not None or (job_id not in self.run.active and job_id not in self.held)
        }

    def results(self, job_ids: Iterable[int] | None = None) -> dict[int, JobForecast]:
        """Each job's start and finish as played so far (default: every job of the forecast)."""
        jobs, timed_out = self.sim_jobs, self.limits.timed_out
        ids = jobs.keys() if job_ids is None else job_ids
        return {
            job_id: JobForecast(job_id, jobs[job_id].start_s, jobs[job_id].finish_s, job_id in timed_out)
            for job_id in ids
        }

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        allocator = self.allocator
        if isinstance(allocator, ReusingAllocator):
            # Its memory left out (the class docstring); the next round's reuse of the last plan
            # (`holds`) reads only the progress key kept here.
            state["allocator"] = ReusingAllocator(allocator.inner, remember=allocator.remember)
        if self.guard is not None:
            # A guarded plan's trace holds several whole plans: the next part decides that round.
            state["guard"] = state["reuse"] = None
        return state

    def __setstate__(self, state: dict) -> None:
        # A run pickled by a version without time limits (a refresh cycle's part kept across an
        # upgrade) plays on with none.
        state.setdefault("limits", ForecastLimits())
        self.__dict__.update(state)
