"""The Allocator contract: turn an ordered job list into a RoundPlan; registered by name."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import ClassVar

from scheduler_app.core.registry import Registry
from scheduler_app.core.types import ClusterSnapshot, JobView, RoundPlan


class Allocator(ABC):
    """Places jobs on the free resources of a snapshot, in the order the policy gave.

    Output: a RoundPlan with exactly one Decision per input job, in input order: a Placement, or
    Pending / Infeasible with a reason code from reasons.py. Invariants kept by every allocator
    (tests/scheduler_app/core/test_allocator_contracts.py checks them all at once):
    - no server is over-committed in GPUs, CPU cores or memory (counting only its free resources);
    - a job gets all its GPUs or none;
    - Synergy allocators never give a job less throughput than its GPU-proportional share;
    - the same inputs give the same plan (no randomness, no dict-order or clock dependence).
    """

    name: ClassVar[str]
    # True when decisions depend on jobs' progress or on the clock (QoS deadlines), not only on
    # which jobs there are and where they ran: a forecast cannot skip rounds for such an allocator.
    reads_progress: ClassVar[bool] = False
    # True when a job that Synergy's GPU admission leaves out (placement.gpu_admission) is answered
    # pending (`insufficient_gpus`) and changes no other job's decision: a simulator may then add
    # such a job, arrived behind the others, to the round's plan without deciding it again.
    waits_unadmitted: ClassVar[bool] = False

    @abstractmethod
    def allocate(self, ordered_jobs: Sequence[JobView], snapshot: ClusterSnapshot) -> RoundPlan:
        """Decide every job of `ordered_jobs` for this round."""

    def allocate_at(
        self, ordered_jobs: Sequence[JobView], snapshot: ClusterSnapshot, now_s: float
    ) -> RoundPlan:
        """Decide the round at `now_s` (the engine's entry point). Only QoS-aware allocators, which
        compare deadlines with the clock, override this; the others do not read the time."""
        return self.allocate(ordered_jobs, snapshot)

    def extend(
        self, previous: RoundPlan, ordered_jobs: Sequence[JobView], snapshot: ClusterSnapshot
    ) -> RoundPlan | None:
        """`allocate(ordered_jobs, snapshot)` where the allocator can tell it from `previous`, a stable
        plan (RoundPlan.stable) whose jobs come first in `ordered_jobs`, each running on the Placement
        `previous` gives it, the others having arrived since; None where it cannot (the caller then
        decides the round). The same plan as `allocate`, stable flag included, or None: never an
        approximation. Default: None (tune: allocators/tune_extend.py)."""
        return None


ALLOCATORS: Registry[Allocator] = Registry("allocator")
register_allocator = ALLOCATORS.register
