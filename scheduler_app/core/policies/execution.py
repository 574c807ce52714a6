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
- `best_rate_iters_per_s`: iterations per second at that best case (on the job's `num_nodes` servers
  when it fixes them, as the genie allocator counts), against a minimum-rate target.
"""

from __future__ import annotations

from scheduler_app.core.allocators.genie_points import shape_points
from scheduler_app.core.throughput import ServerShape, cluster_shape
from scheduler_app.core.types import ClusterSnapshot, JobView


def proportional_execution_s(job: JobView) -> float:
    """Remaining iterations x iteration time at the GPU-proportional point."""
    return job.remaining_iters * job.profile.iter_time_s


def _best_speed(job: JobView, shape: ServerShape | None, *, count_nodes: bool) -> float:
    """The best-case speed (x proportional) on `shape` (1.0 if None), penalty included; `count_nodes`:
    on the job's `num_nodes` servers when it fixes them (as the genie allocator counts them)."""
    if shape is None:
        return 1.0
    min_servers = -(-job.num_gpus // shape.num_gpus)
    if count_nodes and job.num_nodes:
        min_servers = job.num_nodes
    # best_case's speed after the slowdown of those servers, worked out once per workload (memo).
    return shape_points(job.profile, job.num_gpus, min_servers, shape).best_speed


def best_execution_s(job: JobView, shape: ServerShape | None) -> float:
    """Remaining execution time at the best case the job could get on `shape` (proportional if None)."""
    return proportional_execution_s(job) / _best_speed(job, shape, count_nodes=False)


def best_rate_iters_per_s(job: JobView, shape: ServerShape | None) -> float:
    """Iterations per second at that best case (what a minimum-rate target is compared with)."""
    return _best_speed(job, shape, count_nodes=True) / job.profile.iter_time_s


def snapshot_shape(snapshot: ClusterSnapshot) -> ServerShape | None:
    """The server shape best cases are measured on (None for an empty cluster)."""
    return cluster_shape(snapshot)
