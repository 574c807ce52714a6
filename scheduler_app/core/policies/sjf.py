"""SJF: shortest predicted (remaining) execution time first (a GENIE baseline, PAPERS.md §2.3 / §5.4).

Predicted time = remaining iterations x iteration time at the GPU-proportional point (see
execution.py): the same for every allocator, so allocators are compared on the same queue. Higher
`priority` first; ties (arrival_s, job_id). QoS targets (deadlines, minimum rates) are ignored.
"""

from __future__ import annotations

from collections.abc import Sequence

from scheduler_app.core.policies.base import Policy, register_policy
from scheduler_app.core.policies.execution import proportional_execution_s
from scheduler_app.core.types import ClusterSnapshot, JobView


@register_policy("sjf")
class SjfPolicy(Policy):
    """Shortest predicted remaining execution time (proportional point) first."""

    def order(self, jobs: Sequence[JobView], snapshot: ClusterSnapshot, now_s: float) -> list[JobView]:
        return sorted(jobs, key=lambda j: (-j.priority, proportional_execution_s(j), j.arrival_s, j.job_id))
