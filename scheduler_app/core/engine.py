"""The one entry point both drivers call: order the jobs with a policy, place them with an allocator."""

from __future__ import annotations

from collections.abc import Sequence

from scheduler_app.core.allocators import ALLOCATORS, Allocator
from scheduler_app.core.policies import POLICIES, Policy
from scheduler_app.core.types import ClusterSnapshot, JobView, RoundPlan


def schedule_round(
    snapshot: ClusterSnapshot,
    jobs: Sequence[JobView],
    *,
    policy: str | Policy,
    allocator: str | Allocator,
    now_s: float,
) -> RoundPlan:
    """Decide one round: every job in `jobs` gets exactly one Decision in the returned plan.

    `policy` and `allocator` are registered names or ready instances (for non-default options).
    Unknown names raise UnknownNameError listing the valid ones. Pure: same inputs, same plan.
    """
    policy_obj = POLICIES.get(policy)() if isinstance(policy, str) else policy
    allocator_obj = ALLOCATORS.get(allocator)() if isinstance(allocator, str) else allocator
    ordered = policy_obj.order(jobs, snapshot, now_s)
    return allocator_obj.allocate_at(ordered, snapshot, now_s)
