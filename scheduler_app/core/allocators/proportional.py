"""GPU-proportional allocation (Synergy's "+fair" baseline): every GPU brings its server's CPU/memory share.

Reference: msr-fiddle/synergy simulator/schedulers/*_synergy_new.py with `fair=True` and
resources/cluster.py. Admission is GPU-only in policy order (a later, smaller job may be admitted
past a big one that does not fit); each admitted job then gets, on every server it lands on, that
server's cores and memory divided by its GPU count, times the GPUs it holds there.

Placement: the reference's evaluated "+fair" configurations run without "+place", i.e. its first
fit over the free GPUs in cluster order (`_top_synergy_gpus`), so that is our default;
`placement="packed"` selects its placement-sensitive variant (fewest-free-GPU server first).
Fixed-demand jobs (user overrides) get exactly their demand or stay pending (`fragmented`).
Stickiness (_placement.py): an admitted job keeps the GPUs it held last round when they still
hold its share, and the others are placed around them when they can be. A job with a node count
(`num_nodes`) is placed on exactly that many servers, or stays pending.
"""

from __future__ import annotations

from collections.abc import Sequence

from scheduler_app.core import reasons
from scheduler_app.core.allocators._placement import (
    FIRST_FIT,
    PLACEMENT_STRATEGIES,
    DemandCache,
    PlanBuilder,
    RoundState,
    gpu_admission,
    has_fixed_demand,
    infeasible_reasons,
)
from scheduler_app.core.allocators.base import Allocator, register_allocator
from scheduler_app.core.throughput import cluster_shape, with_penalty
from scheduler_app.core.types import ClusterSnapshot, JobView, RoundPlan


@register_allocator("proportional")
class ProportionalAllocator(Allocator):
    """Admit by GPU count in policy order; place each admitted job at its GPU-proportional share."""

    def __init__(self, placement: str = FIRST_FIT) -> None:
        if placement not in PLACEMENT_STRATEGIES:
            raise ValueError(f"placement must be one of {PLACEMENT_STRATEGIES}, got {placement!r}")
        self.placement = placement

    def allocate(self, ordered_jobs: Sequence[JobView], snapshot: ClusterSnapshot) -> RoundPlan:
        builder = PlanBuilder(ordered_jobs)
        state = RoundState(snapshot, ordered_jobs)
        demands = DemandCache(cluster_shape(snapshot))
        infeasible = infeasible_reasons(ordered_jobs, snapshot)
        admitted = gpu_admission(ordered_jobs, infeasible, state.free_gpu_count, snapshot)
        state.claim_current(job for pos, job in enumerate(ordered_jobs) if admitted[pos])
        for pos, job in enumerate(ordered_jobs):
            why = infeasible[pos]
            if why is not None:
                builder.infeasible(pos, why)
                continue
            if not admitted[pos]:
                builder.pending(pos, reasons.INSUFFICIENT_GPUS)
                continue
            if has_fixed_demand(job):
                dc, dm = state.fixed_demand(job)
                speed, reason = demands.fixed_point(job).speed, reasons.FIXED_DEMAND
            else:
                dc, dm = state.prop_cpus, state.prop_mem_gb
                speed, reason = 1.0, reasons.PROPORTIONAL
            plan = state.find(self.placement, job.num_gpus, dc, dm, job.job_id)
            if plan is None:
                # Only possible when fixed demands (or uneven servers) ate other jobs' shares, or
                # when the job's node count (num_nodes) finds too few servers with its GPUs free.
                state.release(job.job_id)
                builder.pending(pos, state.node_pending_reason(job) or reasons.FRAGMENTED)
                continue
            held = state.take(plan, dc, dm, job.job_id)
            speed = with_penalty(speed, job.profile, len(held), job.num_gpus)
            builder.placed(pos, state.server_shares(held), speed, reason)
        return builder.build()
