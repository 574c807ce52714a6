"""SWAF: shortest waiting allowance first (GENIE's order, PAPERS.md §2.3 / §5.4).

Waiting allowance WA = deadline_s - now - E_best, where E_best is the job's remaining execution time
at the best case it could get on this cluster (execution.best_execution_s: best-case Synergy
speed-up, consolidated). The order, after a higher `priority` (GENIE's "emergency" flag):
1. QoS jobs that can still make their deadline (WA >= 0), WA ascending (least slack first);
2. minimum-rate jobs (`min_rate_iters_per_s`) whose rate the best case reaches, by arrival;
3. deadline jobs that could still make it but lose their guarantee under overload (guarantees.py:
   Moore and Hodgson's rule over the cluster's capacity up to each deadline), shortest E_best first:
   they run on what the guaranteed jobs leave and may still finish in time;
4. QoS jobs that cannot make their target (WA < 0, or a minimum rate above the best case): the
   best-effort tail, shortest E_best first;
5. jobs without a QoS target, shortest remaining execution time (proportional point) first, as SJF
   orders them: Chronus (PAPERS §2.4) runs its best-effort jobs SRTF, and on a trace without QoS
   targets SWAF is then SJF (docs/reproduction.md, "One default for both papers").
Aging (aging.py; docs/genie.md, "Policies"): a job of the tail 5 whose time in the queue passes
max(k x its remaining proportional execution time, a floor), capped at a maximum wait when one is
set, moves between 1 and 2, in arrival order among such jobs, and the engine starts it at the next
round even where restart costs would keep running jobs in place (Policy.must_not_wait):
jobs without a QoS target then wait a bounded time. QoS jobs do not age (measured: aging the late ones cost
GENIE's workload average JCT and makespan and met no more deadlines).
Ties everywhere: (arrival_s, job_id). Where jobs without a deadline go relative to the late QoS jobs
is our choice (PAPERS says only "best-effort tail"): the late jobs were promised a latency, so they
keep precedence over jobs that were promised none. Where minimum-rate jobs go is ours too (GENIE's
paper is silent): a rate promises a speed while running, not a start time, so such a job has no
waiting allowance; it comes after the deadline jobs that still have one to lose, and before every
job that was promised nothing (or can no longer get what it was promised).
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from operator import itemgetter

from scheduler_app.core.policies.aging import DEFAULT_AGING, Aging, aged_if_linear
from scheduler_app.core.policies.base import Policy, register_policy
from scheduler_app.core.policies.execution import (
    best_execution_s,
    best_rate_iters_per_s,
    proportional_execution_s,
    snapshot_shape,
)
from scheduler_app.core.policies.guarantees import DEFAULT_PLANNABLE_SHARE, unguaranteed_jobs
from scheduler_app.core.throughput import EPS, ServerShape
from scheduler_app.core.types import ClusterSnapshot, JobView

FEASIBLE, AGED, MIN_RATE, UNGUARANTEED, LATE, NO_DEADLINE = 0, 1, 2, 3, 4, 5


def waiting_allowance_s(job: JobView, now_s: float, shape: ServerShape | None) -> float | None:
    """deadline - now - E_best, or None for a job without a deadline."""
    if job.deadline_s is None:
        return None
    return job.deadline_s - now_s - best_execution_s(job, shape)


@register_policy("swaf")
class SwafPolicy(Policy):
    """Least waiting allowance first; then minimum-rate jobs; unguaranteed, then late jobs, each a
    shortest-first tail; jobs without a QoS target last, shortest remaining first.

    `plannable_share`: the share of the cluster's GPU capacity up to a deadline that guaranteed
    deadline jobs may plan for (guarantees.py); None guarantees every job that can still make it
    (GENIE's SWAF as PAPERS §2.3 states it).
    `aging`: the bound on the wait of a job without a QoS target (aging.py); None orders them
    shortest-first without one (GENIE's SWAF, which can starve a long job under a stream of short
    ones)."""

    ages = True

    def __init__(
        self, plannable_share: float | None = DEFAULT_PLANNABLE_SHARE, aging: Aging | None = DEFAULT_AGING
    ) -> None:
        if plannable_share is not None and not 0 < plannable_share <= 1:
            raise ValueError(f"plannable_share must be in (0, 1] or None, got {plannable_share!r}")
        self.plannable_share = plannable_share
        self.aging = aging

    def must_not_wait(
        self, jobs: Sequence[JobView], snapshot: ClusterSnapshot, now_s: float
    ) -> frozenset[int]:
        """The aged jobs (aging.py) among those without a QoS target."""
        aging = self.aging
        if aging is None:
            return frozenset()
        return frozenset(j.job_id for j in jobs if _without_qos_target(j) and aging.is_aged(j, now_s))

    def linear_regime(
        self, jobs: Sequence[JobView], snapshot: ClusterSnapshot, now_s: float
    ) -> Hashable | None:
        """The aged jobs, where every deadline job is late (WA < 0: tail 4) and aging is linear
        (aging.aged_if_linear: with a rule, every running job on the GPUs it asked for); None
        otherwise. Then every key is linear or constant: E_prop and E_best in a job's progress
        (constant while it waits), WA = deadline - now - E_best too, so a job late at two times is
        late between them; a minimum-rate job's group (2, by arrival, or the late tail where its best
        case falls short) is fixed; a job without a QoS target ages at most once and stays aged. Jobs
        that can still make their deadlines are ordered by the guarantees' pass, not by a key."""
        shape = None
        for j in jobs:
            if j.deadline_s is not None:
                if shape is None:
                    shape = snapshot_shape(snapshot)
                wa = waiting_allowance_s(j, now_s, shape)
                if wa is None or wa >= 0:
                    return None
        return aged_if_linear(jobs, self.aging, self.must_not_wait(jobs, snapshot, now_s))

    def order(self, jobs: Sequence[JobView], snapshot: ClusterSnapshot, now_s: float) -> list[JobView]:
        ordered = _order_without_qos_targets(jobs, now_s, self.aging)
        if ordered is not None:
            return ordered
        shape = snapshot_shape(snapshot)
        unguaranteed: set[int] = set()
        if self.plannable_share is not None:
            # Jobs past their deadline or without one need no capacity there (deadline_need_gpu_s).
            unguaranteed = unguaranteed_jobs(jobs, snapshot, shape, now_s, self.plannable_share)
        aged = self.must_not_wait(jobs, snapshot, now_s)

        def key(j: JobView) -> tuple[int, int, float, float, int]:
            if j.job_id in aged:
                return (-j.priority, AGED, 0.0, j.arrival_s, j.job_id)
            wa = waiting_allowance_s(j, now_s, shape)
            if wa is None and j.min_rate_iters_per_s is not None:
                if _rate_reachable(j, shape):
                    return (-j.priority, MIN_RATE, 0.0, j.arrival_s, j.job_id)
                return (-j.priority, LATE, best_execution_s(j, shape), j.arrival_s, j.job_id)
            if wa is None:
                return (-j.priority, NO_DEADLINE, proportional_execution_s(j), j.arrival_s, j.job_id)
            if wa < 0:
                return (-j.priority, LATE, best_execution_s(j, shape), j.arrival_s, j.job_id)
            if j.job_id in unguaranteed:
                return (-j.priority, UNGUARANTEED, best_execution_s(j, shape), j.arrival_s, j.job_id)
            return (-j.priority, FEASIBLE, wa, j.arrival_s, j.job_id)

        return sorted(jobs, key=key)

    def submitted_tail_ahead(self, job: JobView) -> TailAhead | None:
        """For `job` just submitted (arrival now, nothing run) without a QoS target: which pending jobs
        certainly come before it in `order` now (TailAhead); None for a job with a QoS target, whose
        place follows its waiting allowance and the guarantees of the others (a forecast's to say)."""
        if not _without_qos_target(job):
            return None
        return TailAhead(priority=job.priority, proportional_s=proportional_execution_s(job))


@dataclass(frozen=True, slots=True)
class TailAhead:
    """The pending jobs that certainly come before a job of SWAF's last tail (5: no QoS target) just
    submitted, in `order` now. Such a job is not aged (its wait, 0, is within any threshold), so ahead
    of it are: every job of a higher `priority`; at its priority, every job with a QoS target (tails 1
    to 4) and every aged one (tail 2's place), and every job without a target whose remaining
    proportional execution time E_prop (execution.proportional_execution_s: remaining iterations x
    profile.iter_time_s) is below `proportional_s`, its own. Counting only those, with E_prop strictly
    below (the jobs of an equal E_prop arrived before it and come before it too), gives at most the
    number of jobs ahead of it: a lower bound, never more."""

    priority: int
    proportional_s: float


def _rate_reachable(job: JobView, shape: ServerShape | None) -> bool:
    """Whether a minimum-rate job's best case reaches its rate."""
    assert job.min_rate_iters_per_s is not None
    return best_rate_iters_per_s(job, shape) + EPS >= job.min_rate_iters_per_s


def _order_without_qos_targets(
    jobs: Sequence[JobView], now_s: float, aging: Aging | None
) -> list[JobView] | None:
    """`SwafPolicy.order` where no job has a QoS target (a Synergy trace, a lab without deadlines), or
    None when one has: only the aged tail (2) and the shortest-first tail (5), each job's E_prop
    worked out once for its key and its aging test. The arithmetic is proportional_execution_s's,
    aging.wait_s's and Aging.threshold_for_s's, inline (every job of every round comes here): the
    same floats, the same order. The guarantees' pass has nothing to do without deadlines."""
    keyed: list[tuple[tuple[int, int, float, float, int], JobView]] = []
    append = keyed.append
    if aging is not None and type(aging) is not Aging:
        aging_s = aging.threshold_for_s  # a subclass: its own threshold
        factor = floor_s = 0.0
        max_wait_s = None
    else:
        aging_s = None
        factor = aging.factor if aging is not None else 0.0
        floor_s = aging.floor_s if aging is not None else 0.0
        max_wait_s = aging.max_wait_s if aging is not None else None
    for j in jobs:
        if j.deadline_s is not None or j.min_rate_iters_per_s is not None:
            return None
        remaining = j.total_iters - j.done_iters  # JobView.remaining_iters
        e_prop_s = (remaining if remaining > 0.0 else 0.0) * j.profile.iter_time_s
        if aging is not None:
            num_gpus = j.num_gpus
            ran_s = j.attained_service_gpu_s / num_gpus if num_gpus > 0 else 0.0
            waited_s = max(0.0, now_s - j.arrival_s - ran_s)  # wait_s
            if aging_s is not None:
                threshold_s = aging_s(e_prop_s)
            else:
                threshold_s = max(factor * e_prop_s, floor_s)
                if max_wait_s is not None:
                    threshold_s = min(threshold_s, max_wait_s)
            if waited_s > threshold_s:
                append(((-j.priority, AGED, 0.0, j.arrival_s, j.job_id), j))
                continue
        append(((-j.priority, NO_DEADLINE, e_prop_s, j.arrival_s, j.job_id), j))
    keyed.sort(key=itemgetter(0))  # the key alone: ties never compare JobViews
    return [j for _, j in keyed]


def _without_qos_target(job: JobView) -> bool:
    """The jobs that may age: those without a QoS target (docs/genie.md, "Policies": Aging, for why
    late QoS jobs do not)."""
    return job.deadline_s is None and job.min_rate_iters_per_s is None
