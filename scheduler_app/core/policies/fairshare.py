"""Fair share: the user who has used the least GPU time recently goes first, one job at a time.

Not in the papers: what a shared lab cluster needs once one user can queue hundreds of jobs (an array).
Each job gets a virtual start, as in weighted fair queueing: its owner's recent usage
(`owner_usage_gpu_s`, decayed by the live service, e.g. Slurm's 7-day half-life) plus the GPU-seconds
its owner's jobs ahead of it in arrival order still need (remaining iterations at the proportional
speed x GPUs). Jobs run in order of virtual start, so users interleave: a user with 200 queued jobs
gets their first one before another user's second, not all 200 before it. A higher `priority` still
goes first; ties by (arrival_s, job_id). Jobs with no owner each count as their own user with no
usage, so without owners (traces) this is FIFO.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

from scheduler_app.core.policies.base import Policy, register_policy
from scheduler_app.core.types import ClusterSnapshot, JobView


def remaining_gpu_s(job: JobView) -> float:
    """GPU-seconds the job still needs at its proportional speed."""
    return job.remaining_iters * job.profile.iter_time_s * job.num_gpus


@register_policy("fairshare")
class FairSharePolicy(Policy):
    """Least recent usage first, interleaving users job by job."""

    reads_owner_usage = True

    def order(self, jobs: Sequence[JobView], snapshot: ClusterSnapshot, now_s: float) -> list[JobView]:
        ahead: dict[int, float] = defaultdict(float)  # owner -> GPU-seconds of their earlier jobs
        virtual_start: dict[int, float] = {}
        for job in sorted(jobs, key=lambda j: (j.arrival_s, j.job_id)):
            if job.owner_id is None:
                virtual_start[job.job_id] = 0.0
                continue
            virtual_start[job.job_id] = job.owner_usage_gpu_s + ahead[job.owner_id]
            ahead[job.owner_id] += remaining_gpu_s(job)
        return sorted(jobs, key=lambda j: (-j.priority, virtual_start[j.job_id], j.arrival_s, j.job_id))
