"""LAS (least attained service): serve the jobs that have received the fewest GPU-seconds first.

Reference: msr-fiddle/synergy simulator/schedulers/las_synergy_new.py sorts by
(-priority, attained_service_time x gpu_demand, arrival); JobView already carries the product,
`attained_service_gpu_s`. Ties: (arrival_s, job_id).
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence

from scheduler_app.core.policies.base import Policy, register_policy
from scheduler_app.core.types import ClusterSnapshot, JobView


@register_policy("las")
class LasPolicy(Policy):
    """Fewest attained GPU-seconds first."""

    def linear_regime(
        self, jobs: Sequence[JobView], snapshot: ClusterSnapshot, now_s: float
    ) -> Hashable | None:
        """One group: a running job's attained GPU-seconds grow at the rate of the GPUs it holds, a
        waiting job's stay as they are, and priority, arrival and id are fixed."""
        return ()

    def order(self, jobs: Sequence[JobView], snapshot: ClusterSnapshot, now_s: float) -> list[JobView]:
        return sorted(jobs, key=lambda j: (-j.priority, j.attained_service_gpu_s, j.arrival_s, j.job_id))
