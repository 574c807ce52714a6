"""The jobs a forecast keeps out of its queue until they may run: those after others (Slurm's afterok)
and array tasks past their array's limit on tasks running at once (--array 0-99%4)."""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from scheduler_app.core.array_limits import tasks_past_limit
from scheduler_app.core.types import JobView
from scheduler_app.simulator.sim_job import SimJob


@dataclass
class ForecastHolds:
    """`waits_for`: job id -> ids of the jobs it waits for. `array_limits`: array id -> (its limit,
    the ids of its live tasks in index order). A task past the limit waits as the live round makes it
    wait (services/array_limits.py): its array's running and queued tasks fill the limit, lowest
    index first; it joins the queue in the round after one of them finishes (or is dropped)."""

    waits_for: dict[int, set[int]] = field(default_factory=dict)
    array_limits: dict[int, tuple[int, tuple[int, ...]]] = field(default_factory=dict)

    @classmethod
    def of(
        cls,
        after: Mapping[int, Iterable[int]] | None,
        array_limits: Mapping[int, tuple[int, Sequence[int]]] | None,
    ) -> ForecastHolds:
        return cls(
            {job_id: set(deps) for job_id, deps in (after or {}).items() if deps},
            {array: (limit, tuple(ids)) for array, (limit, ids) in (array_limits or {}).items()},
        )

    def __bool__(self) -> bool:
        return bool(self.waits_for or self.array_limits)

    def held_at_start(self, views: Sequence[JobView]) -> set[int]:
        """The ids of the jobs not yet running that wait: for a dependency, or for room in their array."""
        held = {v.job_id for v in views if v.current is None and self.waits_for.get(v.job_id)}
        if self.array_limits:
            running = {v.job_id for v in views if v.current is not None}
            queued = [v.job_id for v in views if v.current is None and v.job_id not in held]
            held |= tasks_past_limit(self.array_limits, queued, running)
        return held

    def release(
        self,
        held: Mapping[int, SimJob],
        sim_jobs: Mapping[int, SimJob],
        active: Mapping[int, SimJob],
        timed_out: Collection[int] = (),
    ) -> list[int]:
        """The held jobs that join the queue now, in `held`'s order: every dependency finished in the
        forecast (a dependency outside it, dropped as infeasible or `timed_out` at its time limit never
        completes), and room in their array beside its active tasks (those queued or running)."""
        ready = [
            job_id
            for job_id in held
            if all(
                dep in sim_jobs and sim_jobs[dep].finish_s is not None and dep not in timed_out
                for dep in self.waits_for.get(job_id, ())
            )
        ]
        if not self.array_limits or not ready:
            return ready
        blocked = tasks_past_limit(self.array_limits, ready, active)
        return [job_id for job_id in ready if job_id not in blocked]
