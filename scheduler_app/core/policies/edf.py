"""EDF: earliest deadline first (a GENIE baseline, PAPERS.md §2.3 / §5.4).

Jobs with a deadline (`deadline_s`, absolute) by deadline ascending; then minimum-rate jobs
(`min_rate_iters_per_s`, which have no deadline: our choice, the paper is silent), by arrival; jobs
without a QoS target after them, by arrival. Higher `priority` first (GENIE's "emergency" flag); ties
(arrival_s, job_id).
"""

from __future__ import annotations

from collections.abc import Sequence

from scheduler_app.core.policies.base import Policy, register_policy
from scheduler_app.core.types import ClusterSnapshot, JobView


@register_policy("edf")
class EdfPolicy(Policy):
    """Earliest deadline first; then minimum-rate jobs, then jobs without a QoS target, by arrival."""

    def order(self, jobs: Sequence[JobView], snapshot: ClusterSnapshot, now_s: float) -> list[JobView]:
        def key(j: JobView) -> tuple[int, int, float, float, int]:
            if j.deadline_s is None:
                kind = 1 if j.min_rate_iters_per_s is not None else 2
                return (-j.priority, kind, 0.0, j.arrival_s, j.job_id)
            return (-j.priority, 0, j.deadline_s, j.arrival_s, j.job_id)

        return sorted(jobs, key=key)
