"""Synergy-GREEDY: give each job its best-case CPU/memory demand, first fit, skip what does not fit.

Reference: msr-fiddle/synergy simulator/schedulers/*_synergy_new.py with `fair=False, tune=False`
and resources/cluster.py `allocate_synergy_random` / `_top_synergy_gpus`. Jobs are taken in policy
order with no admission step: a job is tried whenever its GPU count fits the GPUs still free, and
skipped (left pending) when it cannot get all its GPUs each with its per-GPU share. This is the
baseline that fragments the cluster (GPUs idle while cores or memory run out) and lets skipped
jobs starve. Best-case demands are capped at the server size as the reference caps them.

Placement: first fit over the free GPUs in cluster order (the reference's default, and PAPERS.md
section 3.3); `placement="packed"` selects the placement-sensitive variant. Stickiness
(core/placement): the jobs that GPU-only admission would take claim the GPUs they held last round,
so each keeps them when they still hold its demand and the others are placed around them.
Reasons: `best_case`, `fixed_demand`; pending `insufficient_gpus` when fewer GPUs than the job
needs were free at its turn, `fragmented` when the GPUs were free but not with its CPU/memory. A
job with a node count (`num_nodes` = N) goes on exactly N servers (core/placement); its GPUs count
as free only on servers with num_gpus / N of them.
"""

from __future__ import annotations

from collections.abc import Sequence

from scheduler_app.core import reasons
from scheduler_app.core.allocators.base import Allocator, register_allocator
from scheduler_app.core.placement import FIRST_FIT, Score, has_fixed_demand, pending_reason, score_named
from scheduler_app.core.placement.setup import RoundSetup
from scheduler_app.core.throughput import with_penalty
from scheduler_app.core.types import ClusterSnapshot, JobView, RoundPlan


@register_allocator("greedy")
class GreedyAllocator(Allocator):
    """In policy order, place each job at its best-case demand where it fits; skip it otherwise."""

    def __init__(self, placement: str | Score = FIRST_FIT) -> None:
        self.placement = score_named(placement)

    def allocate(self, ordered_jobs: Sequence[JobView], snapshot: ClusterSnapshot) -> RoundPlan:
        round_ = RoundSetup(ordered_jobs, snapshot)
        builder, state, demands, infeasible = round_.builder, round_.state, round_.demands, round_.infeasible
        # Greedy has no admission step; the jobs GPU-only admission would take are those likely to
        # run, so only their current GPUs are worth keeping free for them.
        round_.claim_admitted(remember_others=True)
        for pos, job in enumerate(ordered_jobs):
            why = infeasible[pos]
            if why is not None:
                builder.infeasible(pos, why)
                continue
            num_gpus = job.num_gpus
            if num_gpus > state.free_gpu_count:
                state.release(job.job_id)
                builder.pending(pos, reasons.INSUFFICIENT_GPUS)
                continue
            if has_fixed_demand(job):
                dc, dm = state.fixed_demand(job)
                speed, reason = demands.fixed_point(job).speed, reasons.FIXED_DEMAND
                plan = state.find(self.placement, num_gpus, dc, dm, job.job_id)
            else:
                best = demands.best(job)
                dc, dm = state.uniform(best.cpus_per_gpu), state.uniform(best.mem_gb_per_gpu)
                speed, reason = best.speed, reasons.BEST_CASE
                plan = state.find_uniform(
                    self.placement, num_gpus, best.cpus_per_gpu, best.mem_gb_per_gpu, job.job_id
                )
            if plan is None:
                state.release(job.job_id)
                why = pending_reason(num_gpus, state.free_gpu_count)
                if job.num_nodes is not None:  # (most jobs have none: this loop is hot)
                    why = state.node_pending_reason(job) or why
                builder.pending(pos, why)
                continue
            held = state.take(plan, dc, dm, job.job_id)
            speed = with_penalty(speed, job.profile, len(held), job.num_gpus)
            builder.placed(pos, state.server_shares(held), speed, reason)
        return builder.build()
