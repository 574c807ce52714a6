"""Aging: a bound on how long a shortest-first order can keep a job waiting (docs/genie.md, "Policies").

A shortest-first order (SWAF's tails) serves a stream of short jobs before a long one for as long
as the stream lasts. The rule: a job whose time in the queue exceeds its threshold

    wait_s(j)      = now - arrival_s - attained_service_gpu_s / num_gpus   (time not spent running)
    threshold_s(j) = max(k x E_prop(j), floor_s), capped at max_wait_s when that is set

(E_prop: its remaining execution time at the GPU-proportional point, execution.py) is *aged*: the
policy moves it ahead of the shortest-first tails, in arrival order among the aged jobs, and the
engine treats it as a job that must not wait (move_guard.py): running jobs holding the GPUs it
needs are stopped for it, young ones too, as for a deadline that cannot wait out the minimum run
time. Once aged a job stays aged while it runs (its wait no longer grows, its remaining work
shrinks), so no later arrival stops it; only an aged job that arrived before it can. Running aged
jobs do not go first: under overload short jobs age too, and a chain of them would then take every
GPU freed before a wide aged job fits. `floor_s` keeps the shortest-first order among short jobs: a
job of a few minutes is not promoted over the others after a few minutes of queueing.
SWAF ages the jobs without a QoS target (swaf.py); `sjf` and `srtf`, which ignore QoS targets, age
every job when given a rule (the live service gives them the configured one; their constructors'
default, None, keeps the papers' baselines as published).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from scheduler_app.core.policies.execution import proportional_execution_s
from scheduler_app.core.types import JobView

DEFAULT_AGING_FACTOR = 4.0
DEFAULT_AGING_FLOOR_S = 3600.0


@dataclass(frozen=True, slots=True)
class Aging:
    """The aging rule's parameters (module docstring): `factor` k, `floor_s`, and `max_wait_s` (None:
    no cap, the bound is k x the job's own remaining length or the floor)."""

    factor: float = DEFAULT_AGING_FACTOR
    floor_s: float = DEFAULT_AGING_FLOOR_S
    max_wait_s: float | None = None

    def __post_init__(self) -> None:
        if not self.factor > 0:
            raise ValueError(f"aging factor must be > 0, got {self.factor!r}")
        if not self.floor_s >= 0:
            raise ValueError(f"aging floor_s must be >= 0, got {self.floor_s!r}")
        if self.max_wait_s is not None and not self.max_wait_s > 0:
            raise ValueError(f"aging max_wait_s must be > 0 or None, got {self.max_wait_s!r}")

    def threshold_s(self, job: JobView) -> float:
        """How long `job` may wait before it is aged: max(k x E_prop, floor), capped at max_wait_s."""
        return self.threshold_for_s(proportional_execution_s(job))

    def threshold_for_s(self, proportional_s: float) -> float:
        """threshold_s for a job whose E_prop is `proportional_s` (a caller that has it already)."""
        threshold = max(self.factor * proportional_s, self.floor_s)
        return threshold if self.max_wait_s is None else min(threshold, self.max_wait_s)

    def is_aged(self, job: JobView, now_s: float) -> bool:
        """Whether `job` has waited longer than its threshold."""
        return wait_s(job, now_s) > self.threshold_s(job)


DEFAULT_AGING = Aging()


def wait_s(job: JobView, now_s: float) -> float:
    """Seconds since arrival not spent running (attained GPU-seconds over its GPUs: its run time)."""
    ran_s = job.attained_service_gpu_s / job.num_gpus if job.num_gpus > 0 else 0.0
    return max(0.0, now_s - job.arrival_s - ran_s)


def aged_ids(jobs: Sequence[JobView], aging: Aging | None, now_s: float) -> frozenset[int]:
    """The ids of the aged jobs of `jobs` (none without a rule): what sjf and srtf, which ignore QoS
    targets, put first and the engine must not keep waiting."""
    if aging is None:
        return frozenset()
    return frozenset(j.job_id for j in jobs if aging.is_aged(j, now_s))


def aged_if_linear(
    jobs: Sequence[JobView], aging: Aging | None, aged_ids_now: frozenset[int]
) -> frozenset[int] | None:
    """`aged_ids_now` (the jobs of `jobs` aged now) where being aged switches at most once and never
    back while no job arrives, finishes, starts or stops (Policy.linear_regime), else None. A job's
    wait, now - arrival - run time, is then constant while it runs on the GPUs it asked for (its
    attained GPU-seconds over its GPUs grow with the clock) and grows while it waits, and its
    threshold, max(k x E_prop, floor) capped, never grows. On more or fewer GPUs than asked its wait
    would fall or rise against a falling threshold, which may cross twice; a subclass's threshold is
    its own."""
    if aging is None:
        return aged_ids_now
    if type(aging) is not Aging:
        return None
    for j in jobs:
        current = j.current
        if current is not None and current.num_gpus != j.num_gpus:
            return None
    return aged_ids_now
