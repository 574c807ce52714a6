"""The one entry point both drivers call: order the jobs with a policy, place them with an allocator."""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence

from scheduler_app.core import reasons
from scheduler_app.core.allocators import ALLOCATORS, Allocator
from scheduler_app.core.gpu_labels import keep_gpu_indices
from scheduler_app.core.guard_trace import GuardTrace
from scheduler_app.core.interference import with_interference
from scheduler_app.core.move_guard import guarded_plan, one_server_views
from scheduler_app.core.policies import POLICIES, Policy
from scheduler_app.core.restarts import RestartPolicy
from scheduler_app.core.types import ClusterSnapshot, Decision, JobView, Outcome, RoundPlan


def schedule_round(
    snapshot: ClusterSnapshot,
    jobs: Sequence[JobView],
    *,
    policy: str | Policy,
    allocator: str | Allocator,
    now_s: float,
    team_quota_gpus: Mapping[int, int] | None = None,
    borrowing_teams: Collection[int] = (),
    restarts: RestartPolicy | None = None,
    guard_trace: GuardTrace | None = None,
) -> RoundPlan:
    """Decide one round: every job in `jobs` gets exactly one Decision in the returned plan.

    `policy` and `allocator` are registered names or ready instances (for non-default options).
    Unknown names raise UnknownNameError listing the valid ones. `team_quota_gpus`: team id -> GPUs
    its jobs may hold at once (teams not listed are unlimited); see `within_team_quotas`.
    `borrowing_teams`: teams whose jobs held back by their quota may still take what every job within
    quota leaves (Kueue's borrowing): they are handed to the allocator after all of those, in policy
    order, and placed ones carry the reason `borrowed`. Rounds re-decide everything, so a borrowed
    GPU goes back as soon as a job within quota needs it. Every placed job's speed-up then counts
    GENIE's interference from the communicating jobs it shares servers with (core/interference.py).
    `restarts`: weigh restarts (core/move_guard.py): running jobs stay where they are unless a change
    pays for itself, and jobs that fit on one server run on one, except for the jobs the policy says
    must not wait (an aging rule, Policy.must_not_wait); None re-decides every job freely, as the
    papers' simulators do. `guard_trace`: filled with what the restart guard decided (a simulation's
    replay of it: core/guard_trace.py).
    Pure: same inputs, same plan.
    """
    policy_obj = POLICIES.get(policy)() if isinstance(policy, str) else policy
    allocator_obj = ALLOCATORS.get(allocator)() if isinstance(allocator, str) else allocator
    if restarts is not None and restarts.one_server:
        jobs = one_server_views(jobs, snapshot)
    ordered = policy_obj.order(jobs, snapshot, now_s)

    def decide(
        ordered_jobs: Sequence[JobView], snap: ClusterSnapshot, team_used: Mapping[int, int]
    ) -> RoundPlan:
        quotas = team_quota_gpus
        if quotas and team_used:
            quotas = {team: quota - team_used.get(team, 0) for team, quota in quotas.items()}
        plan = _decide(allocator_obj, ordered_jobs, snap, now_s, quotas, borrowing_teams)
        # Weighing restarts: a job re-decided onto its own server keeps its own GPUs there.
        return plan if restarts is None else keep_gpu_indices(plan, ordered_jobs)

    if restarts is None:
        return decide(ordered, snapshot, {})
    held_back = within_team_quotas(ordered, team_quota_gpus)[1] if team_quota_gpus else set()
    aged = policy_obj.must_not_wait(ordered, snapshot, now_s)
    return guarded_plan(
        decide,
        ordered,
        snapshot,
        now_s,
        restarts,
        never_pinned=held_back,
        must_not_wait=aged,
        trace=guard_trace,
    )


def extend_round(
    snapshot: ClusterSnapshot,
    jobs: Sequence[JobView],
    previous: RoundPlan,
    *,
    policy: str | Policy,
    allocator: str | Allocator,
    now_s: float,
) -> RoundPlan | None:
    """`schedule_round(snapshot, jobs, policy=..., allocator=..., now_s=...)` (no team quotas, no
    restart guard) where the allocator can tell its plan from `previous`, a stable plan whose jobs
    come first in the policy's order, each running on the Placement `previous` gives it, the others
    having arrived since (`Allocator.extend`); None where it cannot: decide the round then.
    Pure: the same plan as schedule_round, or None."""
    policy_obj = POLICIES.get(policy)() if isinstance(policy, str) else policy
    allocator_obj = ALLOCATORS.get(allocator)() if isinstance(allocator, str) else allocator
    ordered = policy_obj.order(jobs, snapshot, now_s)
    plan = allocator_obj.extend(previous, ordered, snapshot)
    return None if plan is None else with_interference(plan, ordered)


def _decide(
    allocator: Allocator,
    ordered: Sequence[JobView],
    snapshot: ClusterSnapshot,
    now_s: float,
    team_quota_gpus: Mapping[int, int] | None,
    borrowing_teams: Collection[int],
) -> RoundPlan:
    """The allocator's plan for `ordered` (policy order), within the teams' quotas."""
    if not team_quota_gpus:
        return with_interference(allocator.allocate_at(ordered, snapshot, now_s), ordered)
    admitted, held_back = within_team_quotas(ordered, team_quota_gpus)
    borrowers = [job for job in ordered if job.job_id in held_back and job.team_id in borrowing_teams]
    plan = allocator.allocate_at([*admitted, *borrowers], snapshot, now_s)
    by_id = {d.job_id: d for d in plan.decisions}
    for job_id in held_back:
        decision = by_id.get(job_id)
        if decision is not None and decision.placement is not None:
            by_id[job_id] = Decision(job_id, Outcome.PLACED, reasons.BORROWED, decision.placement)
        elif decision is None or decision.outcome == Outcome.PENDING:
            by_id[job_id] = Decision(job_id, Outcome.PENDING, reasons.QUOTA_EXCEEDED)
    return with_interference(RoundPlan(tuple(by_id[job.job_id] for job in ordered)), ordered)


def within_team_quotas(
    ordered: Sequence[JobView], team_quota_gpus: Mapping[int, int]
) -> tuple[list[JobView], set[int]]:
    """Kueue-style quota admission, before any placement: walk the jobs in policy order and hold back
    each whose GPUs would take its team over its quota; a later, smaller job of the team may still fit.

    Returns the jobs the allocator sees (policy order kept) and the ids held back. Held-back jobs
    free nothing for others of their team, and do not count against the quota.
    """
    used: dict[int, int] = {}
    admitted: list[JobView] = []
    held_back: set[int] = set()
    for job in ordered:
        team = job.team_id
        quota = team_quota_gpus.get(team) if team is not None else None
        if quota is not None and used.get(team, 0) + job.num_gpus > quota:
            held_back.add(job.job_id)
            continue
        if team is not None:
            used[team] = used.get(team, 0) + job.num_gpus
        admitted.append(job)
    return admitted, held_back
