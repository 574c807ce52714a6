"""What the restart guard decided in a round, kept so that a later round can replay its clock-read steps.

The guard (core/move_guard.py `guarded_plan`) reads progress and the clock in three places only: which
running jobs are still within their minimum run time (their lease ages), the plan values it weighs
candidates by (`restarts.plan_value`), and the pending jobs that cannot wait (deadlines' slack, the
policy's `must_not_wait`). Everything else it does (the allocations, the pinned plans built from
them, which jobs those restart) is a function of the round's order, the jobs' fixed attributes and
placements, the snapshot and the allocations' progress keys. A trace keeps the plans it built and
what it read; `move_guard.guarded_replay` redoes only the three reads on a later round whose other
inputs are the same (simulator/reuse.py says when they are) and gives the guard's plan, or None
where a step would take another path than the one traced (then the round is decided).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from scheduler_app.core.types import JobView, RoundPlan


@dataclass(slots=True)
class GuardTrace:
    """One guarded round's record (filled by `guarded_plan`; `recorded` False where the guard returned
    the allocator's plan without pinning or weighing anything: nothing to replay)."""

    recorded: bool = False
    running_ids: tuple[int, ...] = ()  # the running jobs it could pin, in policy order
    young_ids: frozenset[int] = frozenset()  # those within their minimum run time
    free_plan: RoundPlan | None = None  # the allocator's own plan
    unweighed: RoundPlan | None = None  # the plan before weighing (young jobs pinned, if any)
    kept: RoundPlan | None = None  # every running job pinned; None: nothing was weighed
    candidates: tuple[RoundPlan, ...] = ()  # the plans weighed against `kept`
    chosen: RoundPlan | None = None  # the weighing's choice (or `unweighed`)
    urgent: frozenset[int] = frozenset()  # the jobs that could not wait for `chosen`
    result: RoundPlan | None = None  # what the guard returned
    # id of a traced plan -> the pending jobs the allocator's plan starts that it leaves waiting
    _left_out: dict[int, frozenset[int]] = field(default_factory=dict)

    def record(
        self,
        running: Sequence[JobView],
        young_ids: set[int],
        free_plan: RoundPlan,
        unweighed: RoundPlan,
        kept: RoundPlan | None,
        candidates: Sequence[RoundPlan],
        chosen: RoundPlan,
        urgent: set[int],
    ) -> None:
        self.recorded = True
        self.running_ids = tuple(j.job_id for j in running)
        self.young_ids = frozenset(young_ids)
        self.free_plan = free_plan
        self.unweighed = unweighed
        self.kept = kept
        self.candidates = tuple(candidates)
        self.chosen = chosen
        self.urgent = frozenset(urgent)

    def left_out(self, plan: RoundPlan, ordered: Sequence[JobView]) -> frozenset[int]:
        """The jobs of `ordered` that do not run now, that the allocator's own plan starts and `plan`
        (one of the traced plans) does not: the only ones that can be urgent (move_guard.urgent_jobs).
        The same in every round the trace is replayed in (the same jobs and placements)."""
        known = self._left_out.get(id(plan))
        if known is None:
            assert self.free_plan is not None
            placed, free = plan.placements(), self.free_plan.placements()
            known = frozenset(
                j.job_id for j in ordered if j.current is None and j.job_id in free and j.job_id not in placed
            )
            self._left_out[id(plan)] = known
        return known
