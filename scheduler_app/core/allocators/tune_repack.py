"""Tune's repack test: the throughput of the round planned without claims, remembered for its jobs.

Tune's sticky plan stands unless the round planned without claims (the "fresh" plan) beats its
throughput by more than `repack_gain` (TuneAllocator.allocate). On a busy cluster short of cores the
sticky plan is rarely stable, so that test runs in most decided rounds, and the fresh plan nearly
never wins it: its throughput is all the test reads (TuneRound.planned_throughput works it out
without building the plan), and the plan itself is built only where it wins.

Tune's fresh plan reads no job's current placement but to pick GPU indices within a server it
chose (`take` prefers a job's own), which no count, core, memory or speed depends on (a round class
with its own `run` may read more: its fresh throughput is worked out every time). So its throughput is
the same for the same admitted jobs, in the same order, with the same demands, on the same snapshot:
`FreshThroughputs` remembers the last one. Under a static order that is every round whose arrivals
only queue, and every round that confirms a plan of the round before (FIFO + tune on the
image-heavy mix: 27 % of the fresh plans); a live round's snapshot is new each round, so nothing is
reused there.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from typing import Protocol

from scheduler_app.core.placement import HeldJob
from scheduler_app.core.throughput import with_penalty
from scheduler_app.core.types import ClusterSnapshot, JobView, RoundPlan


class RepackRound(Protocol):
    """What the repack test uses of tune's round (TuneRound, a RoundSetup)."""

    snapshot: ClusterSnapshot
    jobs: Sequence[JobView]
    infeasible: list[str | None]
    admitted: list[bool]

    def run(self) -> RoundPlan: ...

    def runs_as_tune(self) -> bool: ...

    def planned_throughput(self) -> float: ...

    def best_case_throughput(self) -> float: ...

    def throughput_bound(self) -> float | None: ...


def fresh_key(round_setup: RepackRound) -> tuple[Hashable, ...]:
    """What the fresh plan of this round's jobs depends on, beside the snapshot: each admitted job,
    in policy order, with every field tune's placement reads (its GPUs, node count, fixed demand and
    profile: its best case and speeds). Profiles compare by identity first, so no matrix is hashed."""
    jobs, infeasible, admitted = round_setup.jobs, round_setup.infeasible, round_setup.admitted
    return tuple(
        (
            job.job_id,
            job.num_gpus,
            job.num_nodes,
            job.cpus_per_gpu_override,
            job.mem_gb_per_gpu_override,
            job.profile,
        )
        for pos, job in enumerate(jobs)
        if admitted[pos] and infeasible[pos] is None
    )


class FreshThroughputs:
    """The last fresh plan's throughput with the snapshot and jobs it was worked out for (one entry:
    consecutive rounds are what repeat). Kept in one tuple, replaced whole, so that a reader never
    sees one round's key with another's value."""

    __slots__ = ("_last",)

    def __init__(self) -> None:
        self._last: tuple[object, tuple[Hashable, ...], float] | None = None

    def get(self, sticky_round: RepackRound, work_out: Callable[[], float]) -> float:
        """The fresh plan's throughput for `sticky_round`'s jobs and snapshot; `work_out()` gives it
        where it is not the one remembered."""
        key = fresh_key(sticky_round)
        last = self._last
        if last is not None and last[0] is sticky_round.snapshot and last[1] == key:
            return last[2]
        value = work_out()
        self._last = (sticky_round.snapshot, key, value)
        return value


def held_speed(held: HeldJob) -> float:
    """The speed-up a held job's Placement gets (RoundSetup.placed): its spread penalty applied."""
    if len(held.shares) > 1:
        return with_penalty(held.speed, held.job.profile, len(held.shares), held.job.num_gpus)
    return held.speed


def repacked(
    sticky_round: RepackRound,
    sticky: RoundPlan,
    repack_gain: float,
    fresh_throughputs: FreshThroughputs,
    make_round: Callable[[bool, bool], RepackRound],
) -> RoundPlan:
    """TuneAllocator.allocate's choice once its sticky plan (of `sticky_round`, a TuneRound) is not
    stable: the sticky plan unless the fresh one beats its throughput by more than `repack_gain`; then
    the loose plan (claims, no `keep_home`) if within `repack_gain` of the fresh one, else the fresh
    one. `make_round(sticky, keep_homes)`: a round of the same jobs, set up like `sticky_round`."""
    threshold = sticky.throughput() * (1.0 + repack_gain)
    if sticky_round.best_case_throughput() <= threshold:
        return sticky  # not even every admitted job at its best case would be enough faster
    bound = sticky_round.throughput_bound()
    if bound is not None and bound * (1.0 + 1e-6) < threshold:
        # Nor any plan within the free cores and memory (a margin far above the float error of
        # either sum): the fresh plan would not beat the threshold, so it is not worked out.
        return sticky

    def work_out() -> float:
        return make_round(False, False).planned_throughput()

    remembers = sticky_round.runs_as_tune()  # (a round of its own may read current placements)
    if (fresh_throughputs.get(sticky_round, work_out) if remembers else work_out()) <= threshold:
        return sticky  # the common case: only the fresh plan's throughput was worked out
    fresh = make_round(False, False).run()
    loose = make_round(True, False).run()
    if loose.throughput() * (1.0 + repack_gain) >= fresh.throughput():
        return loose
    return fresh
