"""FTF (finish-time fairness, Themis): serve the jobs whose finish-time fairness is worst first.

rho = ((now - arrival) + remaining time) / ideal duration, both durations at the GPU-proportional
point (remaining iterations, resp. total iterations, x `profile.iter_time_s`). rho > 1 means the
job is doing worse than it would alone on its proportional share, so Themis serves the LARGEST rho
first; that is our default.

The reference (msr-fiddle/synergy simulator/schedulers/ftf_synergy_new.py, jobs/job.py
`finish_time_fair_metric`) sorts rho ASCENDING (serving the jobs that are doing best), which
reads as a bug against Themis but is what the repository's code does; pass
`repo_order=True` to reproduce it. `speedup_aware=True` divides the remaining time by the job's
best-case speed-up, as the reference does in Synergy mode (see srtf.py). Higher `priority` first
in both orders; ties: (arrival_s, job_id).
"""

from __future__ import annotations

from collections.abc import Sequence

from scheduler_app.core.policies.base import Policy, register_policy
from scheduler_app.core.policies.srtf import remaining_time_s, speedup_shape
from scheduler_app.core.throughput import ServerShape
from scheduler_app.core.types import ClusterSnapshot, JobView


def finish_time_fairness(job: JobView, now_s: float, shape: ServerShape | None = None) -> float:
    """Themis' rho for one job (ideal duration at proportional speed, as in the reference).

    With a `shape`, the remaining time is at the best-case speed-up on it (`speedup_aware`).
    """
    ideal_s = job.total_iters * job.profile.iter_time_s
    elapsed_s = now_s - job.arrival_s
    # A zero-length job has nothing to be unfair about; keep it finite.
    return (elapsed_s + remaining_time_s(job, shape)) / ideal_s if ideal_s > 0 else 0.0


@register_policy("ftf")
class FtfPolicy(Policy):
    """Largest finish-time fairness rho first (Themis); `repo_order=True` sorts ascending."""

    def __init__(self, repo_order: bool = False, speedup_aware: bool = False) -> None:
        self.repo_order = repo_order
        self.speedup_aware = speedup_aware

    def order(self, jobs: Sequence[JobView], snapshot: ClusterSnapshot, now_s: float) -> list[JobView]:
        sign = 1.0 if self.repo_order else -1.0
        shape = speedup_shape(snapshot, self.speedup_aware)
        return sorted(
            jobs,
            key=lambda j: (-j.priority, sign * finish_time_fairness(j, now_s, shape), j.arrival_s, j.job_id),
        )
