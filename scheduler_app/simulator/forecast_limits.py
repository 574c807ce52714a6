"""Time limits in a forecast: a job's run time is charged while it holds resources, and at its limit
the service ends it (TIMEOUT), so that what waits for its GPUs starts in the next round."""

from __future__ import annotations

import math
from collections.abc import Collection, Iterable
from dataclasses import dataclass, field

from scheduler_app.simulator.sim_run import SimJob, SimRun

NO_LIMIT_ROUNDS = 1 << 30  # no limited job runs: nothing bounds a stretch of rounds


@dataclass
class ForecastLimits:
    """`left_s`: job id -> the run time its time limit leaves it at the next round to play (seconds,
    on the forecast's clock). `timed_out`: the jobs the forecast ended at their limit; a job waiting
    for one of them (afterok) never starts, as in the live queue."""

    left_s: dict[int, float] = field(default_factory=dict)
    timed_out: set[int] = field(default_factory=set)

    def __bool__(self) -> bool:
        return bool(self.left_s)

    def rounds_within(self, running: Iterable[int], round_s: float) -> int:
        """How many whole rounds the `running` jobs can all run on and still have run time left at the
        start of the next: a stretch of repeated rounds applied in one step goes no further."""
        lefts = [self.left_s[job_id] for job_id in running if job_id in self.left_s]
        if not lefts:
            return NO_LIMIT_ROUNDS
        return max(0, math.ceil(min(lefts) / round_s) - 1)

    def charge(
        self,
        run: SimRun,
        ran_before: Collection[int],
        rounds_before: int,
        done_now: Iterable[SimJob],
        applied_s: float,
    ) -> list[SimJob]:
        """Charge a played step: `rounds_before` whole rounds run by `ran_before` (a stretch that left
        every job where it was), then the round applied at `applied_s`, held by the jobs running after
        it and by `done_now`, which finished in it. A job whose run time reaches its limit in that round
        ends there: one that finished later than its limit gets the limit's time as its finish, one
        still running is taken out of the run. Returns the jobs it ended."""
        left, round_s = self.left_s, run.round_s
        if rounds_before:
            for job_id in ran_before:
                if job_id in left:
                    left[job_id] -= rounds_before * round_s
        ended = []
        for job in done_now:
            job_left_s = left.pop(job.job_id, None)
            if job_left_s is not None and job.finish_s is not None and job.finish_s - applied_s > job_left_s:
                job.finish_s = applied_s + max(0.0, job_left_s)
                self.timed_out.add(job.job_id)
                ended.append(job)
        for job_id in [job_id for job_id in left if job_id in run.running]:
            left[job_id] -= round_s
            if left[job_id] > 0:
                continue
            job = run.running[job_id]
            # Past its limit already when the forecast began (the service ends it at its next sweep):
            # in the first round.
            job.finish_s = max(applied_s, applied_s + round_s + left.pop(job_id))
            run.end(job_id)
            self.timed_out.add(job_id)
            ended.append(job)
        return ended
