"""Rounds and allocations a simulation need not decide again, under any policy and allocator.

Under a static order (fifo) and an allocator blind to progress and the clock, with no restart guard,
the simulator and the forecast reuse a plan that kept every job where it was until a job arrives,
finishes or is dropped (simulation.py, forecast.py). A policy that orders by progress or the clock
(swaf's least slack first and shortest-first tail, its aging; sjf, srtf, las) can change its order
from one round to the next with nothing else changing, genie reads deadlines against the clock, and the
guard weighs lease ages and predicted finishes: there two rules hold, both exact.

**A repeated allocation is answered from memory** (ReusingAllocator). An allocation's plan is a
function of its inputs (the contract's purity); for an allocator that reads neither progress nor the
clock (`Allocator.reads_progress` False) those are the jobs in order, their fixed attributes and last
round's placements, and the snapshot. Genie reads them only through its QoS jobs' needs, and says per
allocation whether it read them only through its `progress_key` (`allocate_keyed`: which of each
deadline job's points meet its need; a reservation, or a need compared with any other speed, reads
more): such an allocation is remembered under (snapshot, every job's fixed attributes and placement in
order, progress_key) and an equal allocation later gets the same plan without deciding. This is what
the guard's repeated allocations hit (the unguarded plan and the pinned ones, each round the guard
keeps running jobs where the order would move them), and what it leaves to compute is its own
weighing, on the round's progress and clock.

**A repeated round is not decided at all** (`reusable`, `holds`). A plan P decided at one round is
the plan of a later round when
1. P kept every job where it was (same placement and speed-up, nobody started, paused or dropped),
   and since then no job arrived, finished, was dropped or was released: the active jobs and where
   each runs are the same;
2. the policy orders the jobs now, on their current progress and the current clock, as P's decisions
   are ordered (always, under a static order): one `Policy.order` call instead of a round;
3. the round made one allocation, remembered under a key (above) whose progress part is what it
   was: the allocator gives the same plan;
4. with a restart guard (core/move_guard.py), P is the unguarded plan: it kept every running job
   without pinning any (no decision `min_run_time` or `restart_cost`: a running job pinned where the
   unguarded plan would restart it always carries one), so the guard returned the allocator's plan
   before reading lease ages, plan values or the aged jobs, and returns it again for the same one.
Then engine.schedule_round (pure) would return P. Every round is still applied one by one, so every
figure is the one deciding each round gives (bench.sim_identity).

**A repeated guarded round replays the guard alone** (`guard_reusable`, `ordered_if_holds`, then
move_guard.guarded_replay; the forecast only). Where P's round pinned or weighed (rule 4 fails), the
guard's trace (core/guard_trace.py) kept the plans it built and what it read of progress and the
clock. A later round gets the plan the guard would give when
1. as above: P kept everyone and nothing arrived, finished, was dropped or was released;
2. as above: the policy orders the jobs as P's decisions are ordered;
3'. every allocation of P's round was decided from its key (none read a reservation), and the
   progress key of the whole order is what it was: each of the guard's allocations is of a
   subsequence of that order (pinned jobs left out, borrowers last) on a snapshot with the same
   servers (GPUs, cores and memory taken out, totals kept), and genie's key is one entry per
   deadline job read from the job, the clock and the servers' totals (genie_needs.need_key), so
   every allocation's key is what it was and it gives the plan it gave;
4'. the running jobs within their minimum run time are those that were (lease ages), so the guard
   builds the same plans; and it redoes on them what reads progress and the clock: the weighing of
   the kept plan against the candidates (restarts.plan_value on this round's views), and the
   pending jobs that cannot wait (deadline slack, `Policy.must_not_wait` asked for the jobs the
   allocator's plan starts and the weighed one does not: whether a job has waited long enough is
   its own).
The guard then returns what its weighing chose, or, where jobs cannot wait, the traced result only
when those jobs are the traced ones (else None: the round is decided). The replayed weighing costs
its plan values; the allocations, the pinned plans and the moves found are not done again.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence

from scheduler_app.core import reasons
from scheduler_app.core.allocators import Allocator
from scheduler_app.core.guard_trace import GuardTrace
from scheduler_app.core.policies import Policy
from scheduler_app.core.restarts import RestartPolicy
from scheduler_app.core.types import ClusterSnapshot, JobView, RoundPlan

# The reasons only the restart guard gives, to running jobs it pins where the unguarded plan moved them.
_PINNED = frozenset({reasons.MIN_RUN_TIME, reasons.RESTART_COST})
# Allocations remembered at once: a round's guard makes up to four; older ones rarely come back.
_MEMO_SIZE = 64


def _fixed(job: JobView) -> tuple:
    """Everything of a JobView but its progress and clock fields (done_iters, attained_service_gpu_s,
    owner_usage_gpu_s, lease_started_s). The profile by identity: the memo keeps the views it was
    decided for, so no other profile takes its id while the entry lives."""
    return (
        job.job_id,
        job.num_gpus,
        job.arrival_s,
        id(job.profile),
        job.total_iters,
        job.cpus_per_gpu_override,
        job.mem_gb_per_gpu_override,
        job.deadline_s,
        job.priority,
        job.current,
        job.team_id,
        job.owner_id,
        job.num_nodes,
        job.min_rate_iters_per_s,
        job.gpu_choices,
        job.startup_s,
        job.checkpoint_every_s,
    )


class ReusingAllocator(Allocator):
    """One simulation's allocator: answers an allocation equal to one it decided from its key with the
    plan it gave then (module docstring); everything else goes to `inner`. `remember` False: it only
    says whether each allocation was decided from its key, and under which progress key (a run
    without the guard repeats an allocation only in a round it does not decide, and the memo's keys
    would cost their hashing for nothing)."""

    def __init__(self, inner: Allocator, *, remember: bool = True) -> None:
        self.inner = inner
        self.remember = remember
        self.name = getattr(inner, "name", type(inner).__name__)  # type: ignore[misc]
        self.reads_progress = inner.reads_progress  # type: ignore[misc]
        self.waits_unadmitted = inner.waits_unadmitted  # type: ignore[misc]
        self._keyed = getattr(inner, "allocate_keyed", None)
        self._progress_key = getattr(inner, "progress_key", None)
        self._memo: dict[Hashable, tuple[RoundPlan, Sequence[JobView]]] = {}
        self.allocations = 0  # since begin_round
        self.last_key: Hashable | None = None  # the last allocation's key, when it was decided from it
        self.decided = 0  # allocations decided by `inner` (the others answered from memory)
        self.unkeyed = 0  # since begin_round: allocations not decided from their key alone

    def begin_round(self) -> None:
        self.allocations = 0
        self.unkeyed = 0
        self.last_key = None

    def progress_key(
        self, ordered_jobs: Sequence[JobView], snapshot: ClusterSnapshot, now_s: float
    ) -> Hashable:
        """The progress part of an allocation's key: the inner allocator's, () for one blind to progress."""
        return () if self._progress_key is None else self._progress_key(ordered_jobs, snapshot, now_s)

    def allocate(self, ordered_jobs: Sequence[JobView], snapshot: ClusterSnapshot) -> RoundPlan:
        return self.allocate_at(ordered_jobs, snapshot, 0.0)

    def extend(
        self, previous: RoundPlan, ordered_jobs: Sequence[JobView], snapshot: ClusterSnapshot
    ) -> RoundPlan | None:
        """The inner allocator's (Allocator.extend): pure, nothing to remember."""
        return self.inner.extend(previous, ordered_jobs, snapshot)

    def allocate_at(
        self, ordered_jobs: Sequence[JobView], snapshot: ClusterSnapshot, now_s: float
    ) -> RoundPlan:
        self.allocations += 1
        self.last_key = None
        if self._keyed is None and self.inner.reads_progress:
            self.decided += 1
            self.unkeyed += 1
            return self.inner.allocate_at(ordered_jobs, snapshot, now_s)
        progress = self.progress_key(ordered_jobs, snapshot, now_s)
        if not self.remember:
            self.decided += 1
            if self._keyed is None:
                plan, keyed = self.inner.allocate_at(ordered_jobs, snapshot, now_s), True
            else:
                plan, keyed = self._keyed(ordered_jobs, snapshot, now_s)
            self.last_key = (None, None, progress) if keyed else None
            self.unkeyed += not keyed
            return plan
        key = (snapshot, tuple(_fixed(j) for j in ordered_jobs), progress)
        hit = self._memo.get(key)
        if hit is not None:
            self.last_key = key
            return hit[0]
        self.decided += 1
        if self._keyed is None:
            plan, keyed = self.inner.allocate_at(ordered_jobs, snapshot, now_s), True
        else:
            plan, keyed = self._keyed(ordered_jobs, snapshot, now_s)
        if keyed:
            if len(self._memo) >= _MEMO_SIZE:
                self._memo.clear()
            self._memo[key] = (plan, ordered_jobs)
            self.last_key = key
        else:
            self.unkeyed += 1
        return plan


class RememberingPolicy(Policy):
    """One simulation's policy: an order of the very views it ordered last, on the same snapshot at
    the same time, is answered with the order it gave then (pure: the same inputs, the same order).
    A round whose steady plan no longer holds (`holds` ordered its views) is then decided on them
    without ordering them again. Everything else is the inner policy's."""

    def __init__(self, inner: Policy) -> None:
        self.inner = inner
        self.name = getattr(inner, "name", type(inner).__name__)  # type: ignore[misc]
        self.static_order = inner.static_order  # type: ignore[misc]
        self.reads_owner_usage = inner.reads_owner_usage  # type: ignore[misc]
        self.ages = inner.ages  # type: ignore[misc]
        self._last: tuple[tuple[JobView, ...], ClusterSnapshot, float, list[JobView]] | None = None

    def must_not_wait(
        self, jobs: Sequence[JobView], snapshot: ClusterSnapshot, now_s: float
    ) -> frozenset[int]:
        return self.inner.must_not_wait(jobs, snapshot, now_s)

    def order(self, jobs: Sequence[JobView], snapshot: ClusterSnapshot, now_s: float) -> list[JobView]:
        last = self._last
        if (
            last is not None
            and last[1] is snapshot
            and last[2] == now_s
            and len(last[0]) == len(jobs)
            and all(a is b for a, b in zip(last[0], jobs, strict=True))
        ):
            return list(last[3])
        ordered = self.inner.order(jobs, snapshot, now_s)
        # The views are kept with it, so that no other object takes one's identity meanwhile.
        self._last = (tuple(jobs), snapshot, now_s, ordered)
        return list(ordered)


def reusable(plan: RoundPlan, allocator: ReusingAllocator, restarts: RestartPolicy | None) -> Hashable | None:
    """Conditions 3 and 4 for `plan`, just decided (condition 1 is the caller's: the plan kept everyone
    and nothing arrived, finished or was dropped): the progress part of its allocation's key, under
    which a later round may reuse it (`holds`); None when it may not."""
    if allocator.allocations != 1 or allocator.last_key is None:
        return None
    if restarts is not None and any(d.reason in _PINNED for d in plan.decisions):
        return None
    return allocator.last_key[2]  # type: ignore[index]


def guard_reusable(
    trace: GuardTrace,
    allocator: ReusingAllocator,
    ordered: Sequence[JobView],
    snapshot: ClusterSnapshot,
    now_s: float,
) -> Hashable | None:
    """Condition 4' for a plan the guard pinned or weighed, just decided with `trace` (condition 1 is
    the caller's; `ordered`: the round's views in the plan's order): the progress key of the whole
    order, under which a later round may replay the guard on it (`ordered_if_holds`, then
    move_guard.guarded_replay); None when it may not (an allocation of the round not decided from
    its key alone)."""
    if not trace.recorded or allocator.allocations == 0 or allocator.unkeyed:
        return None
    return allocator.progress_key(ordered, snapshot, now_s)


def holds(
    plan: RoundPlan,
    progress: Hashable,
    jobs: Sequence[JobView],
    policy: Policy,
    allocator: ReusingAllocator,
    snapshot: ClusterSnapshot,
    now_s: float,
) -> bool:
    """Conditions 2 and 3 now, for `plan` reusable under `progress`: the policy orders `jobs` as the
    plan's decisions are ordered, and the allocator's progress key for them is `progress`."""
    if policy.static_order and progress == ():
        return len(plan.decisions) == len(jobs)
    return ordered_if_holds(plan, progress, jobs, policy, allocator, snapshot, now_s) is not None


def ordered_if_holds(
    plan: RoundPlan,
    progress: Hashable,
    jobs: Sequence[JobView],
    policy: Policy,
    allocator: ReusingAllocator,
    snapshot: ClusterSnapshot,
    now_s: float,
) -> Sequence[JobView] | None:
    """`jobs` in the policy's order when conditions 2 and 3 hold now for `plan` (`holds`), else None."""
    decisions = plan.decisions
    if len(decisions) != len(jobs):
        return None
    if policy.static_order:
        by_id = {j.job_id: j for j in jobs}
        ordered: Sequence[JobView] = [by_id[d.job_id] for d in decisions]
        if progress == ():
            return ordered
    else:
        ordered = policy.order(jobs, snapshot, now_s)
        if any(d.job_id != j.job_id for d, j in zip(decisions, ordered, strict=True)):
            return None
    if progress == () or allocator.progress_key(ordered, snapshot, now_s) == progress:
        return ordered
    return None
