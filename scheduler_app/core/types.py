"""Frozen, framework-free views of servers, jobs and decisions that the scheduling core works on."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

from scheduler_app.core.predictor import Predictor


@dataclass(frozen=True, slots=True)
class SensitivityProfile:
    """How a workload's speed responds to CPU cores and memory per GPU (Synergy's matrix).

    `tput[i][j]` is the throughput with `cpu_per_gpu_grid[i]` cores and `mem_gb_per_gpu_grid[j]` GB
    of memory per GPU, normalised so that 1.0 is the GPU-proportional point of the reference server
    (3 cores and 62.5 GB per GPU). `best_*` is the best-case demand per GPU (the smallest grid point
    reaching the matrix maximum) and `speedup` the throughput there. `iter_time_s` is seconds per
    iteration at the proportional point; `placement_penalty` (>= 1) divides the speed of a job that
    spans servers.

    `predictor` is GENIE's fitted model of the workload (core/predictor.py) at per-GPU batch
    `batch_per_gpu`, or None. With one, the time of a placement is the predictor's (throughput.py,
    `placement_slowdown` and `gpu_count_factor`): a job of k GPUs on one server takes
    t(1, k, b) / t(1, 1, b) times `iter_time_s` per iteration (a job's own profile, `job_profile`,
    holds that), one spread over n servers t(n, k/n, b) / t(1, k, b) times longer again, instead
    of the constant `placement_penalty`; Synergy's matrix still scales it by the CPU/memory point
    (PAPERS §5.2, combined). `interference_kappa` is GENIE's (1 + kappa x) term: each other
    communicating job on the job's servers slows it by that fraction (0 until measured).
    `scaled_for_gpus` is the GPU count `iter_time_s` holds (1 for a workload's profile).
    """

    name: str
    workload_class: str
    cpu_per_gpu_grid: tuple[float, ...]
    mem_gb_per_gpu_grid: tuple[float, ...]
    tput: tuple[tuple[float, ...], ...]
    best_cpus_per_gpu: float
    best_mem_gb_per_gpu: float
    speedup: float
    iter_time_s: float
    placement_penalty: float = 1.0
    predictor: Predictor | None = None
    batch_per_gpu: float = 0.0
    interference_kappa: float = 0.0
    scaled_for_gpus: int = 1


@dataclass(frozen=True, slots=True)
class ServerView:
    """One server as the round sees it: its capacity and what is free for this round.

    GPUs are named by index on the server (the live driver maps indices to UUIDs). In round mode
    (Synergy) every resource of a schedulable server is free, since each round re-decides every job;
    in event mode (GENIE) running jobs keep theirs and only the remainder is free.
    """

    server_id: int
    name: str
    num_gpus: int
    num_cpus: int
    mem_gb: float
    free_gpus: tuple[int, ...]
    free_cpus: int
    free_mem_gb: float

    @property
    def cpus_per_gpu(self) -> float:
        """The GPU-proportional CPU share of one GPU on this server."""
        return self.num_cpus / self.num_gpus

    @property
    def mem_gb_per_gpu(self) -> float:
        """The GPU-proportional memory share of one GPU on this server."""
        return self.mem_gb / self.num_gpus


@dataclass(frozen=True, slots=True)
class ClusterSnapshot:
    """Every schedulable server at the start of a round. Order is stable (by server_id)."""

    servers: tuple[ServerView, ...]

    @property
    def total_gpus(self) -> int:
        return sum(s.num_gpus for s in self.servers)

    @property
    def free_gpu_count(self) -> int:
        return sum(len(s.free_gpus) for s in self.servers)


@dataclass(frozen=True, slots=True)
class ServerShare:
    """The part of a job's allocation that lives on one server."""

    server_id: int
    gpu_indices: tuple[int, ...]
    num_cpus: int
    mem_gb: float


@dataclass(frozen=True, slots=True)
class Placement:
    """Where a job runs this round and how fast.

    `speedup` is the job's speed relative to its speed at the GPU-proportional point of the
    reference server (1.0), placement penalty included: iterations per second =
    speedup / profile.iter_time_s.
    """

    job_id: int
    shares: tuple[ServerShare, ...]
    speedup: float

    @property
    def num_gpus(self) -> int:
        shares = self.shares
        if len(shares) == 1:  # most placements (and this is asked of every placement every round)
            return len(shares[0].gpu_indices)
        return sum(len(s.gpu_indices) for s in shares)

    @property
    def num_cpus(self) -> int:
        return sum(s.num_cpus for s in self.shares)

    @property
    def mem_gb(self) -> float:
        return sum(s.mem_gb for s in self.shares)

    @property
    def num_servers(self) -> int:
        return len(self.shares)

    def same_resources(self, other: Placement | None) -> bool:
        """True when `other` holds exactly the same GPUs, cores and memory (the lease continues)."""
        return other is not None and self.shares == other.shares


@dataclass(frozen=True, slots=True)
class JobView:
    """A runnable job (pending, or running and up for re-allocation) as the core sees it.

    Work is counted in iterations; `done_iters` is progress so far. `attained_service_gpu_s` is
    GPU-seconds received so far (LAS). Overrides fix the per-GPU CPU or memory demand (a user's
    explicit request). `deadline_s` is an absolute time on the caller's clock (QoS),
    `min_rate_iters_per_s` GENIE's other QoS kind: the job must run at >= this many iterations per
    second while it runs (speed-up >= min_rate x profile.iter_time_s, see Placement); callers give a job
    at most one of the two. `current` is the placement held in the previous round (None if the job is
    not running).
    `num_nodes` (Slurm's --nodes): None = any number of servers (the allocator's placement rule may
    spread the job); N = exactly N distinct servers with num_gpus / N GPUs on each (N = 1 forbids
    spreading). The service admits only even splits; the core answers an uneven one `infeasible`.
    `gpu_choices`: other GPU counts the job may run on (GENIE's range; only the genie allocator uses
    them). Its work stays in iterations at `num_gpus`; a placement on k GPUs has the speed-up that
    makes `speedup / profile.iter_time_s` its rate in those iterations (same samples per second).
    """

    job_id: int
    num_gpus: int
    arrival_s: float
    profile: SensitivityProfile
    total_iters: float
    done_iters: float = 0.0
    attained_service_gpu_s: float = 0.0
    cpus_per_gpu_override: float | None = None
    mem_gb_per_gpu_override: float | None = None
    deadline_s: float | None = None
    priority: int = 0
    current: Placement | None = field(default=None, compare=False)
    team_id: int | None = None  # for GPU quotas (engine.schedule_round's team_quota_gpus)
    owner_id: int | None = None  # who submitted it (fair share); None: a job of its own
    owner_usage_gpu_s: float = 0.0  # its owner's recent GPU-seconds, decayed (fair share)
    num_nodes: int | None = None  # exactly this many servers, num_gpus / num_nodes GPUs each
    min_rate_iters_per_s: float | None = None  # QoS: minimum processing rate while running (GENIE)
    # Other GPU counts the job accepts (a range, GENIE: the predictor picks); work, progress and rates
    # stay counted in iterations at `num_gpus`, the placement's speed-up converts (allocators/genie.py).
    gpu_choices: tuple[int, ...] = ()
    # What a restart costs it (core/restarts.py): seconds from a launch to its first progress, how often
    # it checkpoints (None: never, a restart redoes the whole lease) and when its current lease started
    # (the caller's clock; None when it does not run).
    startup_s: float = 0.0
    checkpoint_every_s: float | None = None
    lease_started_s: float | None = None

    @property
    def remaining_iters(self) -> float:
        return max(0.0, self.total_iters - self.done_iters)


class Outcome(StrEnum):
    """What a round decided for a job. PENDING may fit later; INFEASIBLE never fits this cluster."""

    PLACED = "placed"
    PENDING = "pending"
    INFEASIBLE = "infeasible"


@dataclass(frozen=True, slots=True)
class Decision:
    """The round's answer for one job, with a stable snake_case reason code (see reasons.py)."""

    job_id: int
    outcome: Outcome
    reason: str
    placement: Placement | None = None


@dataclass(frozen=True, slots=True)
class RoundPlan:
    """Every job's decision for one round, in the policy's order.

    `stable` (the allocator's word; False promises nothing): deciding the same jobs again, in the same
    order on the same snapshot, each job's `current` being its placement here (None where it has
    none), gives this plan again; and where every decision is a placement, deciding only some of
    these jobs (the others gone, the order kept) gives each of them its decision here. Only an
    allocator that reads neither progress nor the clock says so (tune: `TuneRound.settled`); a
    simulator then need not decide such rounds (simulation.py).
    """

    decisions: tuple[Decision, ...]
    stable: bool = field(default=False, compare=False)

    def placements(self) -> dict[int, Placement]:
        """Job id -> placement, for the jobs placed this round."""
        return {d.job_id: d.placement for d in self.decisions if d.placement is not None}

    def throughput(self, *, weight_by_gpus: bool = True) -> float:
        """Total throughput in proportional units: sum of speed-ups of placed jobs, x GPUs if weighted."""
        return sum(
            d.placement.speedup * (d.placement.num_gpus if weight_by_gpus else 1)
            for d in self.decisions
            if d.placement is not None
        )

    def decision_for(self, job_id: int) -> Decision:
        for d in self.decisions:
            if d.job_id == job_id:
                return d
        raise KeyError(job_id)
