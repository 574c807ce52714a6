"""The set-up every allocator's round shares: state, demand memo, plan builder, feasibility, admission."""

from __future__ import annotations

from collections.abc import Sequence

from scheduler_app.core.placement.feasibility import gpu_admission, infeasible_reasons
from scheduler_app.core.placement.plan import EPS, DemandCache, HeldShare, PlanBuilder
from scheduler_app.core.placement.state import RoundState
from scheduler_app.core.reasons import INSUFFICIENT_GPUS
from scheduler_app.core.throughput import cluster_shape, with_penalty
from scheduler_app.core.types import ClusterSnapshot, Decision, JobView, Outcome, Placement


class RoundSetup:
    """One allocate() call's shared pieces, built in the order every allocator built them.

    `infeasible[pos]`: why the job can never fit (or None); `admitted[pos]`: Synergy's GPU-only
    admission in policy order (allocators without an admission step use it as "likely to run").
    """

    def __init__(
        self,
        ordered_jobs: Sequence[JobView],
        snapshot: ClusterSnapshot,
        like: RoundSetup | None = None,
        *,
        admission: tuple[list[str | None], list[bool]] | None = None,
    ) -> None:
        """`like`: an earlier set-up of the same call on the same jobs and snapshot (a second plan of
        one round): what depends only on those (feasibility, admission, node counts, best cases) is
        taken from it instead of worked out again; the state itself is fresh. `admission`: the
        jobs' (`infeasible`, `admitted`) lists, worked out by the caller for jobs of which none has a
        node count (tune's extension of a stable plan, allocators/tune_extend.py)."""
        self.jobs = ordered_jobs
        self.snapshot = snapshot
        self.builder = PlanBuilder(ordered_jobs)
        if admission is not None:
            self.state = RoundState(snapshot)
            self.shape = cluster_shape(snapshot)
            self.demands = DemandCache(self.shape)
            self.infeasible, self.admitted = admission
            return
        if like is not None and like.jobs is ordered_jobs and like.snapshot is snapshot:
            self.state = RoundState(snapshot)
            self.state.share_nodes(like.state)
            self.shape, self.demands = like.shape, like.demands
            self.infeasible, self.admitted = like.infeasible, like.admitted
            return
        self.state = RoundState(snapshot, ordered_jobs)
        self.shape = cluster_shape(snapshot)
        self.demands = DemandCache(self.shape)
        self.infeasible = infeasible_reasons(ordered_jobs, snapshot)
        self.admitted = gpu_admission(ordered_jobs, self.infeasible, self.state.free_gpu_count, snapshot)

    def admit(self) -> list[int]:
        """Decide the infeasible and the not-admitted jobs (pending, `insufficient_gpus`); return the
        admitted positions in policy order (claims are the caller's: `claim_admitted`)."""
        builder, infeasible, admitted = self.builder, self.infeasible, self.admitted
        out = []
        for pos in range(len(self.jobs)):
            why = infeasible[pos]
            if why is not None:
                builder.infeasible(pos, why)
            elif not admitted[pos]:
                builder.pending(pos, INSUFFICIENT_GPUS)
            else:
                out.append(pos)
        return out

    def claim_admitted(self, *, remember_others: bool) -> None:
        """Let the admitted jobs claim their GPUs of last round; with `remember_others`, the rest
        may still go back to theirs when nobody claimed or took them (allocators that place past
        admission: greedy, genie)."""
        jobs, admitted, state = self.jobs, self.admitted, self.state
        state.claim_current(job for pos, job in enumerate(jobs) if admitted[pos])
        if remember_others:
            state.remember_current(job for pos, job in enumerate(jobs) if not admitted[pos])

    def placed(
        self, pos: int, shares: Sequence[HeldShare], speed: float, reason: str, scale: float = 1.0
    ) -> None:
        """Record the job at `pos` as placed on `shares` at `speed` before its spread penalty
        (`scale`: genie's factor from a GPU-count variant's speed to the job's own, applied after)."""
        job = self.jobs[pos]
        if len(shares) > 1:  # (a job on one server runs at its speed: with_penalty leaves it)
            speed = with_penalty(speed, job.profile, len(shares), job.num_gpus)
        if scale != 1.0:
            speed *= scale
        current = job.current
        if current is not None and current.speedup == speed:
            before = current.shares
            if len(shares) == 1 and len(before) == 1:
                # is_current for a job on one server (most of them), inline: every running job of a
                # decided round comes here.
                share, was = shares[0], before[0]
                kept = (
                    current.job_id == job.job_id
                    and self.state.server_ids[share.server_pos] == was.server_id
                    and share.gpu_indices == was.gpu_indices
                    and int(share.cpus + EPS) == was.num_cpus
                    and share.mem_gb == was.mem_gb
                )
            else:
                kept = self.is_current(current, job.job_id, shares, speed)
            if kept:
                # Kept as it ran: its own Placement, not an equal new one (most jobs of a steady
                # round; cheaper, and a simulator sees the lease continue at once).
                self.builder.kept(pos, current, reason)
                return
        self.builder.placed(pos, self.state.server_shares(shares), speed, reason)

    def is_current(self, current: Placement, job_id: int, shares: Sequence[HeldShare], speed: float) -> bool:
        """True when the Placement `placed` would build for `shares` at `speed` equals `current`
        (same servers, GPU indices, whole cores, memory and speed-up)."""
        if current.speedup != speed or current.job_id != job_id or len(current.shares) != len(shares):
            return False
        ids = self.state.server_ids
        for share, before in zip(shares, current.shares, strict=True):
            if (
                ids[share.server_pos] != before.server_id
                or share.gpu_indices != before.gpu_indices
                or int(share.cpus + EPS) != before.num_cpus
                or share.mem_gb != before.mem_gb
            ):
                return False
        return True

    def shortfall(self, i: int, k: int, dc: Sequence[float], dm: Sequence[float]) -> tuple[float, float]:
        """Cores and GB server i lacks for k GPUs at per-GPU demand (dc, dm) (negative: to spare);
        what room-making (tune's step 5, opt's cheapest peers) must free there."""
        state = self.state
        return k * dc[i] - state.free_cpus[i], k * dm[i] - state.free_mem_gb[i]


def running_first(jobs: Sequence[JobView], order: Sequence[int]) -> int:
    """How many jobs of `order` (positions in `jobs`) ran last round, where they all come before every
    newcomer; 0 where none ran or a newcomer comes before one that ran (the allocators' cheap hold of
    the running jobs, tune_steady.py and proportional.py, needs that shape)."""
    count = 0
    for pos in order:
        if jobs[pos].current is None:
            break
        count += 1
    if not count or any(jobs[pos].current is not None for pos in order[count:]):
        return 0
    return count


def placed_as_held(decision: Decision, job: JobView, reason: str) -> bool:
    """Whether last round's plan placed `job` on its current placement for `reason`, with nothing that
    makes its demand the job's own (a node count, a per-GPU override): the decisions an allocator's
    extension of a stable plan (tune_extend.py, proportional.py) may keep as they are."""
    placement = decision.placement
    return not (
        placement is None
        or placement is not job.current
        or placement.job_id != job.job_id
        or decision.job_id != job.job_id
        or decision.outcome is not Outcome.PLACED
        or decision.reason != reason
        or job.num_nodes is not None
        or job.cpus_per_gpu_override is not None
        or job.mem_gb_per_gpu_override is not None
    )
