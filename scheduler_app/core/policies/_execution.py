"""Execution-time estimates shared by the QoS policies (EDF, SJF, SWAF), from a job's Synergy profile.

GENIE predicts execution time from its fitted model (core/predictor.py); in the core a job carries
only its SensitivityProfile, so the policies estimate with it: remaining iterations x seconds per
iteration at the GPU-proportional point (`profile.iter_time_s`), divided by a speed-up.
- `proportional_execution_s`: speed 1.0, independent of the cluster and of the allocator.
- `best_execution_s`: the best case the job could get on this cluster, i.e. divided by its best-case
  Synergy speed-up on the cluster's server shape (capped as throughput.best_case caps it), and by
  the placement penalty when it needs more GPUs than one server has. This is GENIE's
  "min over placements of E(p)": with a fixed GPU count, the fastest placement is the most
  consolidated one with the best-case CPU/memory.
"""

from __future__ import annotations

from scheduler_app.core.throughput import ServerShape, best_case, cluster_shape, with_penalty
from scheduler_app.core.types import ClusterSnapshot, JobView


def proportional_execution_s(job: JobView) -> float:
    """Remaining iterations x iteration time at the GPU-proportional point."""
    return job.remaining_iters * job.profile.iter_time_s


def best_execution_s(job: JobView, shape: ServerShape | None) -> float:
    """Remaining execution time at the best case the job could get on `shape` (proportional if None)."""
    if shape is None:
        return proportional_execution_s(job)
    speed = best_case(job.profile, job.num_gpus, shape).speed
    min_servers = -(-job.num_gpus // shape.num_gpus)
    speed = with_penalty(speed, job.profile, min_servers)
    return proportional_execution_s(job) / speed


def snapshot_shape(snapshot: ClusterSnapshot) -> ServerShape | None:
    """The server shape best cases are measured on (None for an empty cluster)."""
    return cluster_shape(snapshot)
