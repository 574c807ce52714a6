"""Small readers for RoundPlans, and a flat test profile, used by the hand-checked allocator tests."""

from __future__ import annotations

from scheduler_app.core.types import Decision, RoundPlan, SensitivityProfile

# A workload that no CPU or memory speeds up (3 cores and 62.5 GB per GPU are all it uses): its speed
# is the placement's alone.
FLAT = SensitivityProfile(
    name="flat",
    workload_class="image",
    cpu_per_gpu_grid=(3.0,),
    mem_gb_per_gpu_grid=(62.5,),
    tput=((1.0,),),
    best_cpus_per_gpu=3.0,
    best_mem_gb_per_gpu=62.5,
    speedup=1.0,
    iter_time_s=1.0,
)


def shares(decision: Decision) -> list[tuple[int, tuple[int, ...], int, float]]:
    """(server_id, gpu_indices, num_cpus, mem_gb) of each share of a placed decision."""
    assert decision.placement is not None, decision
    return [(s.server_id, s.gpu_indices, s.num_cpus, s.mem_gb) for s in decision.placement.shares]


def outcomes(plan: RoundPlan) -> list[tuple[int, str, str]]:
    """(job_id, outcome, reason) for every decision, in plan order."""
    return [(d.job_id, d.outcome.value, d.reason) for d in plan.decisions]
