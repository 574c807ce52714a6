"""SJF: shortest predicted (remaining) execution time first (a GENIE baseline, PAPERS.md §2.3 / §5.4).

Predicted time = remaining iterations x iteration time at the GPU-proportional point (see
execution.py): the same for every allocator, so allocators are compared on the same queue. Higher
`priority` first; ties (arrival_s, job_id). QoS targets (deadlines, minimum rates) are ignored.
With an aging rule (aging.py; None by default, the paper's baseline; the live service passes its
configured one) the jobs that have waited past their threshold go first, by arrival.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence

from scheduler_app.core.policies.aging import Aging, aged_ids, aged_if_linear
from scheduler_app.core.policies.base import Policy, register_policy
from scheduler_app.core.policies.execution import proportional_execution_s
from scheduler_app.core.types import ClusterSnapshot, JobView


@register_policy("sjf")
class SjfPolicy(Policy):
    """Shortest predicted remaining execution time (proportional point) first; aged jobs before them."""

    ages = True

    def __init__(self, aging: Aging | None = None) -> None:
        self.aging = aging

    def must_not_wait(
        self, jobs: Sequence[JobView], snapshot: ClusterSnapshot, now_s: float
    ) -> frozenset[int]:
        return aged_ids(jobs, self.aging, now_s)

    def linear_regime(
        self, jobs: Sequence[JobView], snapshot: ClusterSnapshot, now_s: float
    ) -> Hashable | None:
        """The aged jobs (aging.aged_if_linear): a job's predicted execution time (remaining
        iterations x iteration time) is linear in its progress, and constant while it waits; the
        aged go first by arrival."""
        return aged_if_linear(jobs, self.aging, aged_ids(jobs, self.aging, now_s))

    def order(self, jobs: Sequence[JobView], snapshot: ClusterSnapshot, now_s: float) -> list[JobView]:
        aged = aged_ids(jobs, self.aging, now_s)

        def key(j: JobView) -> tuple[int, bool, float, float, int]:
            length_s = 0.0 if j.job_id in aged else proportional_execution_s(j)
            return (-j.priority, j.job_id not in aged, length_s, j.arrival_s, j.job_id)

        return sorted(jobs, key=key)
