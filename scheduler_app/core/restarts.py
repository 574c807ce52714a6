"""What stopping and starting a running job again costs, and what a round's plan is worth net of it.

A move, a preemption or a resize that needs a new process is a restart: the job's start-up (process,
CUDA and NCCL set-up, data loaders: `JobView.startup_s`) and the work since its last checkpoint,
done again (`lost_work_s`). docs/restarts.md has the formulas; core/move_guard.py uses them to keep
running jobs in place unless a change pays for itself.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum

from scheduler_app.core.types import ClusterSnapshot, JobView, Placement
from scheduler_app.core.waiting_starts import waiting_start_offsets


@dataclass(frozen=True, slots=True)
class RestartPolicy:
    """How a round weighs restarts (the live service reads it from settings, the simulator from options).

    - `min_run_s`: a job is not moved or preempted for another's benefit within this many seconds of
      its lease's start (Slurm's PreemptExemptTime); what must not wait overrides it (move_guard.py).
    - `horizon_s`: the gain of a plan is the work it does over this horizon.
    - `margin`: a plan that restarts jobs is taken only when its gain is at least (1 + margin) times
      the restart costs it causes.
    - `resize_in_place`: a change of cores or memory on the same GPUs costs nothing (the agent applies
      it to the running processes); otherwise it is a restart. `static_servers`: servers whose agents
      cannot (an older agent, a node without the feature): a resize there is a restart all the same.
    - `one_server`: a job that fits on one server (and did not ask for several nodes) runs on one
      server: it is never split across servers, it waits for room instead.
    """

    min_run_s: float = 300.0
    horizon_s: float = 1800.0
    margin: float = 0.5
    resize_in_place: bool = True
    one_server: bool = True
    static_servers: frozenset[int] = frozenset()

    def __post_init__(self) -> None:
        if not self.min_run_s >= 0:
            raise ValueError(f"min_run_s must be >= 0, got {self.min_run_s}")
        if not self.horizon_s > 0:
            raise ValueError(f"horizon_s must be > 0, got {self.horizon_s}")
        if not self.margin >= 0:
            raise ValueError(f"margin must be >= 0, got {self.margin}")


class Change(StrEnum):
    """What a plan does to a job that runs now."""

    KEPT = "kept"  # the same GPUs, cores and memory: the lease continues
    RESIZED = "resized"  # the same GPUs, other cores or memory
    MOVED = "moved"  # other GPUs or servers: a new lease, a restart
    PREEMPTED = "preempted"  # nothing this round: stopped until a later round places it


def change_of(current: Placement | None, new: Placement | None) -> Change | None:
    """What going from `current` to `new` is; None for a job that does not run now."""
    if current is None:
        return None
    if new is None:
        return Change.PREEMPTED
    if new.shares == current.shares:
        return Change.KEPT
    if _gpus_of(new) == _gpus_of(current):
        return Change.RESIZED
    return Change.MOVED


def is_restart(change: Change | None, policy: RestartPolicy, current: Placement | None = None) -> bool:
    """Whether `change` stops the job's processes (costing a start-up and the work since a checkpoint).
    A resize is one unless it can be made live where the job runs (`current`)."""
    if change is Change.RESIZED:
        return not resizes_live(current, policy)
    return change in (Change.MOVED, Change.PREEMPTED)


def resizes_live(current: Placement | None, policy: RestartPolicy) -> bool:
    """Whether a change of cores or memory of a job running at `current` is made without a restart."""
    if not policy.resize_in_place:
        return False
    return current is None or not any(s.server_id in policy.static_servers for s in current.shares)


def lost_work_s(job: JobView, now_s: float) -> float:
    """Seconds of the current lease's run that a restart now would have the job do again.

    With a checkpoint interval: the run since the last checkpoint ((now - start) mod interval);
    without one: the whole run of the lease. 0 for a job that does not run (or whose start is unknown).
    """
    if job.current is None or job.lease_started_s is None:
        return 0.0
    return run_lost_s(max(0.0, now_s - job.lease_started_s), job.checkpoint_every_s)


def run_lost_s(run_s: float, checkpoint_every_s: float | None) -> float:
    """Of a lease's `run_s` seconds, those a restart loses: since the last checkpoint, or all of them."""
    return run_s % checkpoint_every_s if checkpoint_every_s else run_s


def restart_cost_s(job: JobView, now_s: float) -> float:
    """A restart's cost in the job's own seconds: its start-up plus the run done again."""
    return job.startup_s + lost_work_s(job, now_s)


def plan_value(
    placements: Mapping[int, Placement],
    ordered: Sequence[JobView],
    now_s: float,
    policy: RestartPolicy,
    *,
    charge_restarts: bool = True,
    snapshot: ClusterSnapshot | None = None,
) -> float:
    """What a plan is worth: minus the sum over jobs (`ordered`: the policy's order) of their predicted
    finish times (seconds from now, `finish_offset_s`) if the plan held over the horizon H, weighted by
    the policy's order. The higher, the better.

    Finish times are what average JCT adds up: a restart's start-up and redone work delay its job's
    finish by as many seconds whatever its length, and a faster placement brings a finish forward by
    the work it adds within the horizon (after it, every job is taken at its present speed: a plan
    does not hold for ever). The weight, 1 + (n - rank) / n from 2 for the policy's first job down to
    just above 1 for its last, makes the policy's choice win between jobs of equal work (a higher
    priority, an earlier arrival) without letting the order outweigh the work. Every start waits its
    start-up; with `charge_restarts`, a job the plan restarts also does its lost work again first. A
    job the plan does not run makes no progress within the horizon (a preempted one owes its start-up
    and its lost work after it).

    A job with a deadline (a QoS target) that the plan has it meet counts a horizon's worth of finish
    time less (`_deadline_bonus_s`): deadlines, which the QoS policies order by, outweigh a few
    seconds of average JCT, so a move that saves a deadline pays and a restart that loses one costs.

    With the round's `snapshot`, a job the plan leaves waiting starts within the horizon when the
    plan's jobs finish and free its GPUs (core/waiting_starts.py), at its proportional speed: so a
    plan that keeps every running job is not taken to starve its queue for the whole horizon.
    """
    return PlanValuer(ordered, now_s, policy, snapshot).value(placements, charge_restarts=charge_restarts)


# A job's part of a plan's value where the plan leaves it waiting (valued after the plan's own jobs).
_WAITS: tuple = ("waits",)


class PlanValuer:
    """`plan_value` of several plans of one round (the same jobs in order, clock, policy and snapshot):
    each job's part is worked out once per placement it has among them (a round's guard values up to
    five plans that differ in a few hundred of thousands of jobs), with the same operations in the
    same order, so every value is the float `plan_value` gives."""

    def __init__(
        self,
        ordered: Sequence[JobView],
        now_s: float,
        policy: RestartPolicy,
        snapshot: ClusterSnapshot | None = None,
    ) -> None:
        self.now_s = now_s
        self.policy = policy
        self.snapshot = snapshot
        n = len(ordered)
        # The jobs that count, in order: (job, weight, remaining iterations, present rate).
        self._jobs: list[tuple[JobView, float, float, float]] = []
        for rank, job in enumerate(ordered):
            remaining = job.remaining_iters
            if remaining <= 0 or job.profile.iter_time_s <= 0:
                continue
            weight = 1.0 + (n - rank) / n
            # Its present speed (a job not running: its proportional one), the speed after the horizon.
            now_rate = (job.current.speedup if job.current is not None else 1.0) / job.profile.iter_time_s
            self._jobs.append((job, weight, remaining, now_rate))
        self._ids = [job.job_id for job, _, _, _ in self._jobs]
        # Per job (as _jobs): the parts worked out, (placement, charge_restarts or None for either,
        # part), the first one apart (most plans a guard compares share most placements, as objects).
        # A part: _WAITS, or (weight x (finish - deadline bonus), (finish, GPUs per server) or None).
        self._first: list[tuple[Placement | None, bool | None, tuple] | None] = [None] * len(self._jobs)
        self._more: dict[int, list[tuple[Placement | None, bool | None, tuple]]] = {}

    def value(self, placements: Mapping[int, Placement], *, charge_restarts: bool = True) -> float:
        """`plan_value(placements, ordered, now_s, policy, charge_restarts=..., snapshot=...)`."""
        return self._value(placements, charge_restarts, {})

    def pair(self, placements: Mapping[int, Placement]) -> tuple[float, float]:
        """`value(placements, charge_restarts=False)` and `value(placements)`: where the two differ only
        in finishes after the horizon, the waiting jobs' starts are worked out once (they read the
        finishes within it alone: core/waiting_starts.py)."""
        starts_memo: dict[tuple, dict[int, float]] = {}
        return self._value(placements, False, starts_memo), self._value(placements, True, starts_memo)

    def _value(
        self,
        placements: Mapping[int, Placement],
        charge_restarts: bool,
        starts_memo: dict[tuple, dict[int, float]],
    ) -> float:
        horizon_s, now_s, snapshot = self.policy.horizon_s, self.now_s, self.snapshot
        value = 0.0
        finishes: dict[int, tuple[float, tuple[tuple[int, int], ...]]] = {}
        within: list[tuple[int, float, tuple[tuple[int, int], ...]]] = []
        waiting: list[tuple[JobView, float]] = []
        ids, first = self._ids, self._first
        get = placements.get
        for k, placement in enumerate([get(job_id) for job_id in ids]):
            entry = first[k]
            if (
                entry is not None
                and entry[0] is placement
                and (entry[1] is None or entry[1] == charge_restarts)
            ):
                part = entry[2]
            else:
                part = self._part_of(k, placement, charge_restarts)
            if part is _WAITS:
                job, weight, _, _ = self._jobs[k]
                waiting.append((job, weight))
                continue
            value -= part[0]
            finish = part[1]
            if snapshot is not None and finish is not None:
                finishes[ids[k]] = finish
                if finish[0] <= horizon_s:
                    within.append((ids[k], *finish))
        if snapshot is not None and waiting:
            key = tuple(within)
            starts = starts_memo.get(key)
            if starts is None:
                starts = starts_memo[key] = waiting_start_offsets(
                    finishes, [job for job, _ in waiting], snapshot, horizon_s
                )
        else:
            starts = {}
        for job, weight in waiting:
            rate = 1.0 / job.profile.iter_time_s
            at_s = starts.get(job.job_id, horizon_s)  # not within the horizon: after it
            finish_s = finish_offset_s(at_s + job.startup_s, job.remaining_iters, rate, rate, horizon_s)
            value -= weight * (finish_s - _deadline_bonus_s(job, now_s + finish_s, horizon_s))
        return value

    def _part_of(self, k: int, placement: Placement | None, charge_restarts: bool) -> tuple:
        """The part of the job at `k` (in _jobs) under `placement`: one worked out before for an equal
        placement and the same charge (or where the placement restarts nothing), else worked out."""
        entries = self._more.setdefault(k, [])
        first = self._first[k]
        for seen, charge, part in entries if first is None else [first, *entries]:
            if (charge is None or charge == charge_restarts) and (
                seen is placement or (seen is not None and placement is not None and seen == placement)
            ):
                return part
        job, weight, remaining, now_rate = self._jobs[k]
        part, a_restart = self._part(job, weight, remaining, now_rate, placement, charge_restarts)
        entry = (placement, charge_restarts if a_restart else None, part)
        if first is None:
            self._first[k] = entry
        else:
            entries.append(entry)
        return part

    def _part(
        self,
        job: JobView,
        weight: float,
        remaining: float,
        now_rate: float,
        placement: Placement | None,
        charge_restarts: bool,
    ) -> tuple[tuple, bool]:
        """The job's part of a plan that gives it `placement`, and whether that placement restarts it
        (charged or not)."""
        policy, now_s, horizon_s = self.policy, self.now_s, self.policy.horizon_s
        change = change_of(job.current, placement)
        a_restart = is_restart(change, policy, job.current)
        restarted = charge_restarts and a_restart
        redo_iters = lost_work_s(job, now_s) * now_rate if restarted and job.current is not None else 0.0
        rate = placement.speedup / job.profile.iter_time_s if placement is not None else 0.0
        if placement is None or rate <= 0:
            if placement is None and job.current is None:
                return _WAITS, a_restart
            owed_s = job.startup_s if restarted else 0.0
            finish_s = horizon_s + owed_s + (remaining + redo_iters) / now_rate
            return (
                weight * (finish_s - _deadline_bonus_s(job, now_s + finish_s, horizon_s)),
                None,
            ), a_restart
        started = job.current is None or restarted
        delay_s = job.startup_s if started else 0.0
        finish_s = finish_offset_s(delay_s, remaining + redo_iters, rate, now_rate, horizon_s)
        term = weight * (finish_s - _deadline_bonus_s(job, now_s + finish_s, horizon_s))
        shares = tuple((share.server_id, len(share.gpu_indices)) for share in placement.shares)
        return (term, (finish_s, shares)), a_restart


def _deadline_bonus_s(job: JobView, finish_at_s: float, horizon_s: float) -> float:
    """What meeting its deadline is worth to a job with one, in seconds of finish time: a horizon's
    (a plan that makes a deadline is preferred to one that only finishes jobs sooner)."""
    return horizon_s if job.deadline_s is not None and finish_at_s <= job.deadline_s else 0.0


def finish_offset_s(
    delay_s: float, work_iters: float, rate: float, after_rate: float, horizon_s: float
) -> float:
    """When a job finishes, in seconds from now: no progress for `delay_s`, then `rate` iterations a
    second until the horizon and `after_rate` after it, for `work_iters` iterations."""
    if delay_s >= horizon_s:
        return delay_s + work_iters / after_rate
    within = rate * (horizon_s - delay_s)
    if work_iters <= within:
        return delay_s + work_iters / rate
    return horizon_s + (work_iters - within) / after_rate


def _gpus_of(placement: Placement) -> tuple[tuple[int, tuple[int, ...]], ...]:
    return tuple((share.server_id, share.gpu_indices) for share in placement.shares)
