"""FIFO: serve jobs in arrival order.

Reference: msr-fiddle/synergy simulator/schedulers/fifo_synergy_new.py (sorts by arrival time only).
Like every Attune policy, a higher `priority` goes first (0 for everyone unless set); ties are
broken by (arrival_s, job_id).
"""

from __future__ import annotations

from collections.abc import Sequence

from scheduler_app.core.policies.base import Policy, register_policy
from scheduler_app.core.types import ClusterSnapshot, JobView


@register_policy("fifo")
class FifoPolicy(Policy):
    """Earliest arrival first."""

    static_order = True

    def order(self, jobs: Sequence[JobView], snapshot: ClusterSnapshot, now_s: float) -> list[JobView]:
        return sorted(jobs, key=lambda j: (-j.priority, j.arrival_s, j.job_id))
