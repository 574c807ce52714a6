"""SRTF: serve the job with the shortest remaining time first.

Remaining time = remaining iterations x iteration time at the GPU-proportional point
(`profile.iter_time_s`). The reference (msr-fiddle/synergy simulator/schedulers/
srtf_synergy_new.py, jobs/job.py `remaining_duration`) divides by the job's Synergy speed-up when
it runs a Synergy allocator (fair=False), using whatever speed-up the previous round left on the
job object. We default to the proportional estimate so the order does not depend on the
allocator or on last round's placement (every allocator then sees the same queue, which keeps
comparisons between allocators fair); `speedup_aware=True` divides by the job's best-case
speed-up on this cluster (capped as the reference caps it) to approximate the reference's Synergy
mode. Higher `priority` first; ties: (arrival_s, job_id). With an aging rule (aging.py; None by
default, the reference's behaviour; the live service passes its configured one) the jobs that have
waited past their threshold go first, by arrival.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence

from scheduler_app.core.policies.aging import Aging, aged_ids, aged_if_linear
from scheduler_app.core.policies.base import Policy, register_policy
from scheduler_app.core.throughput import ServerShape, best_case, cluster_shape
from scheduler_app.core.types import ClusterSnapshot, JobView


def remaining_time_s(job: JobView, shape: ServerShape | None = None) -> float:
    """Remaining iterations x iteration time at proportional speed; with a `shape`, at best-case speed."""
    remaining_s = job.remaining_iters * job.profile.iter_time_s
    if shape is not None:
        remaining_s /= best_case(job.profile, job.num_gpus, shape).speed
    return remaining_s


def speedup_shape(snapshot: ClusterSnapshot, speedup_aware: bool) -> ServerShape | None:
    """The shape to take best-case speed-ups on, or None for proportional-speed estimates."""
    return cluster_shape(snapshot) if speedup_aware else None


@register_policy("srtf")
class SrtfPolicy(Policy):
    """Shortest remaining time (at proportional speed, or best-case speed if asked) first."""

    ages = True

    def __init__(self, speedup_aware: bool = False, aging: Aging | None = None) -> None:
        self.speedup_aware = speedup_aware
        self.aging = aging

    def must_not_wait(
        self, jobs: Sequence[JobView], snapshot: ClusterSnapshot, now_s: float
    ) -> frozenset[int]:
        return aged_ids(jobs, self.aging, now_s)

    def linear_regime(
        self, jobs: Sequence[JobView], snapshot: ClusterSnapshot, now_s: float
    ) -> Hashable | None:
        """The aged jobs (aging.aged_if_linear): a job's remaining time (remaining iterations x
        iteration time, over its fixed best case where asked) is linear in its progress, and constant
        while it waits; the aged go first by arrival."""
        return aged_if_linear(jobs, self.aging, aged_ids(jobs, self.aging, now_s))

    def order(self, jobs: Sequence[JobView], snapshot: ClusterSnapshot, now_s: float) -> list[JobView]:
        shape = speedup_shape(snapshot, self.speedup_aware)
        aged = aged_ids(jobs, self.aging, now_s)
        if shape is None and not aged:
            # The common case (the reference's), with remaining_time_s and remaining_iters inlined
            # (the same float operations): a simulation orders every job every round.
            return sorted(
                jobs,
                key=lambda j: (
                    -j.priority,
                    True,
                    max(0.0, j.total_iters - j.done_iters) * j.profile.iter_time_s,
                    j.arrival_s,
                    j.job_id,
                ),
            )

        def key(j: JobView) -> tuple[int, bool, float, float, int]:
            length_s = 0.0 if j.job_id in aged else remaining_time_s(j, shape)
            return (-j.priority, j.job_id not in aged, length_s, j.arrival_s, j.job_id)

        return sorted(jobs, key=key)
