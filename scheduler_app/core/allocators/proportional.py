"""GPU-proportional allocation (Synergy's "+fair" baseline): every GPU brings its server's CPU/memory share.

Reference: msr-fiddle/synergy simulator/schedulers/*_synergy_new.py with `fair=True` and
resources/cluster.py. Admission is GPU-only in policy order (a later, smaller job may be admitted
past a big one that does not fit); each admitted job then gets, on every server it lands on, that
server's cores and memory divided by its GPU count, times the GPUs it holds there.

Placement: the reference's evaluated "+fair" configurations run without "+place", i.e. its first
fit over the free GPUs in cluster order (`_top_synergy_gpus`), so that is our default;
`placement="packed"` selects its placement-sensitive variant (fewest-free-GPU server first).
Fixed-demand jobs (user overrides) get exactly their demand or stay pending (`fragmented`).
Stickiness (core/placement): an admitted job keeps the GPUs it held last round when they still
hold its share, and the others are placed around them when they can be. A job with a node count
(`num_nodes`) is placed on exactly that many servers, or stays pending.
"""

from __future__ import annotations

from collections.abc import Sequence

from scheduler_app.core import reasons
from scheduler_app.core.allocators.base import Allocator, register_allocator
from scheduler_app.core.placement import FIRST_FIT, Score, has_fixed_demand, score_named
from scheduler_app.core.placement.setup import RoundSetup
from scheduler_app.core.types import ClusterSnapshot, JobView, RoundPlan


@register_allocator("proportional")
class ProportionalAllocator(Allocator):
    """Admit by GPU count in policy order; place each admitted job at its GPU-proportional share."""

    waits_unadmitted = True  # a job not admitted only gets its pending decision

    def __init__(self, placement: str | Score = FIRST_FIT) -> None:
        self.placement = score_named(placement)

    def allocate(self, ordered_jobs: Sequence[JobView], snapshot: ClusterSnapshot) -> RoundPlan:
        round_ = RoundSetup(ordered_jobs, snapshot)
        builder, state, demands = round_.builder, round_.state, round_.demands
        infeasible, admitted = round_.infeasible, round_.admitted
        round_.claim_admitted(remember_others=False)
        # One pass deciding every job (not admit() then the admitted): this is the cheapest round.
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
            round_.placed(pos, state.take(plan, dc, dm, job.job_id), speed, reason)
        return builder.build()
