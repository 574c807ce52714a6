"""Small readers for RoundPlans used by the hand-checked allocator tests."""

from __future__ import annotations

from scheduler_app.core.types import Decision, RoundPlan


def shares(decision: Decision) -> list[tuple[int, tuple[int, ...], int, float]]:
    """(server_id, gpu_indices, num_cpus, mem_gb) of each share of a placed decision."""
    assert decision.placement is not None, decision
    return [(s.server_id, s.gpu_indices, s.num_cpus, s.mem_gb) for s in decision.placement.shares]


def outcomes(plan: RoundPlan) -> list[tuple[int, str, str]]:
    """(job_id, outcome, reason) for every decision, in plan order."""
    return [(d.job_id, d.outcome.value, d.reason) for d in plan.decisions]
