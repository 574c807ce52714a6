"""A running job that sits at its best case: what genie's steady round and its lean path read of it.

genie_steady.py (a round where every job stays) and genie_home.py (a decided round's jobs that go back
to their own GPUs) both ask, for every running job of every round, whether its current placement is
exactly what `GenieRound.place` + `RoundSetup.placed` record for its best case there, and where that
placement lies on the snapshot. The answer depends only on the job's fixed attributes, its Placement
object and the (immutable) snapshot, so `kept_job` keeps it per Placement object: a simulator keeps a
job's Placement for as long as the job is kept, and a live round builds new ones (a miss, worked out
as before).
"""

from __future__ import annotations

from scheduler_app.core.allocators.genie_points import shape_points
from scheduler_app.core.interference import communicates
from scheduler_app.core.placement.feasibility import has_fixed_demand
from scheduler_app.core.placement.plan import EPS as PLACEMENT_EPS
from scheduler_app.core.throughput import EPS, OperatingPoint, ServerShape, with_penalty
from scheduler_app.core.types import ClusterSnapshot, JobView, Placement, SensitivityProfile


class KeptJob:
    """A job whose current placement holds its best case exactly (`kept_job`).

    `shares`: per share (server position, GPU indices as a bit mask, cores, GB at the best case, the
    same floats `RoundState.take` subtracts); `cpus`, `mem_gb`: its demand cluster-wide at its best
    case; `above_share`: whether the best case asks more than the GPU-proportional share (only then
    may `starves_gpus` say True); `best`, `speed`: the best case and its speed after the spread's
    slowdown (the placement's speed-up); `least_cpus`, `least_mem_gb`: the GPUs x the least cores and
    GB per GPU of its best-effort options (ShapePoints.best_effort_options), as
    `RoundState.totals_allow` multiplies them."""

    __slots__ = (
        "above_share",
        "best",
        "communicating",
        "cpus",
        "least_cpus",
        "least_mem_gb",
        "mem_gb",
        "shares",
        "speed",
    )

    def __init__(
        self,
        shares: tuple[tuple[int, int, float, float], ...],
        cpus: float,
        mem_gb: float,
        above_share: bool,
        best: OperatingPoint,
        speed: float,
        least_cpus: float,
        least_mem_gb: float,
        communicating: bool,
    ) -> None:
        self.shares = shares
        self.cpus = cpus
        self.mem_gb = mem_gb
        self.above_share = above_share
        self.best = best
        self.speed = speed
        self.least_cpus = least_cpus
        self.least_mem_gb = least_mem_gb
        self.communicating = communicating


# id(placement) -> (placement, snapshot, profile, job id, GPUs, KeptJob or None), the placement and the
# snapshot kept so that their ids are not reused meanwhile. Cleared whole at the bound.
KEPT_ENTRIES: dict[int, tuple[Placement, ClusterSnapshot, SensitivityProfile, int, int, KeptJob | None]] = {}
KEPT_ENTRIES_MAX = 8192
# An entry serves only its own snapshot. A simulation uses one for all its rounds, but the live service
# builds one a round, and the entries of placements that ended would otherwise pin a snapshot each
# until the bound: up to 8,192 of them, 0.29 MB each at 1,000 servers. So the entries are cleared
# whole when a third snapshot comes (the first two: a forecast's beside the live round's).
KEPT_SNAPSHOTS_MAX = 2
_kept_snapshots: list[ClusterSnapshot] = []  # the snapshots of KEPT_ENTRIES' entries, oldest first


def kept_job(job: JobView, snapshot: ClusterSnapshot, shape: ServerShape) -> KeptJob | None:
    """The KeptJob of `job` (which must have a current placement, no QoS target, no GPU-count choices,
    no node count and no fixed demand: the caller tests those, which a JobView may change without a
    new Placement) on `snapshot` of `shape`, or None when its placement is not its best case's (or
    the best case is not certain, or the placement is not valid on the snapshot)."""
    current = job.current
    hit = KEPT_ENTRIES.get(id(current))
    if (
        hit is None
        or hit[0] is not current
        or hit[1] is not snapshot
        or hit[2] is not job.profile
        or hit[3] != job.job_id
        or hit[4] != job.num_gpus
    ):
        if not any(seen is snapshot for seen in _kept_snapshots):
            if len(_kept_snapshots) >= KEPT_SNAPSHOTS_MAX:
                KEPT_ENTRIES.clear()
                _kept_snapshots.clear()
            _kept_snapshots.append(snapshot)
        if len(KEPT_ENTRIES) >= KEPT_ENTRIES_MAX:
            KEPT_ENTRIES.clear()
        assert current is not None
        hit = (current, snapshot, job.profile, job.job_id, job.num_gpus, _kept_job(job, snapshot, shape))
        KEPT_ENTRIES[id(current)] = hit
    return hit[5]


def _kept_job(job: JobView, snapshot: ClusterSnapshot, shape: ServerShape) -> KeptJob | None:
    """kept_job without the memo: None when the job's best case is not certain (best_if_kept), its
    placement is not what `GenieRound.place` + `RoundSetup.placed` record for that best case there
    (floor(k x cores) and k x GB per server, the best case's speed with the spread's penalty), or it
    is not valid on the snapshot (an unknown server, a server twice, a GPU twice or not free, another
    GPU count, a GPU count infeasible_reason would refuse)."""
    if job.num_gpus < 1 or job.num_gpus > snapshot.total_gpus:
        return None
    best = best_if_kept(job, shape)
    if best is None:
        return None
    c, m = best.cpus_per_gpu, best.mem_gb_per_gpu
    current = job.current
    assert current is not None  # best_if_kept
    shares = current.shares
    speed = best.speed
    if len(shares) > 1:
        speed = with_penalty(speed, job.profile, len(shares), job.num_gpus)
    if current.speedup != speed or current.job_id != job.job_id:
        return None
    servers = snapshot.servers
    pos_of = {s.server_id: i for i, s in enumerate(servers)}
    out: list[tuple[int, int, float, float]] = []
    seen: set[int] = set()
    count = 0
    for share in shares:
        i = pos_of.get(share.server_id)
        if i is None or i in seen:
            return None
        seen.add(i)
        idx = share.gpu_indices
        k = len(idx)
        cpus, mem_gb = k * c, k * m
        if share.num_cpus != int(cpus + PLACEMENT_EPS) or share.mem_gb != mem_gb:
            return None
        free = servers[i].free_gpus
        mask = 0
        for g in idx:
            if g not in free or not isinstance(g, int) or g < 0:
                return None
            mask |= 1 << g
        if len(set(idx)) != k:
            return None
        out.append((i, mask, cpus, mem_gb))
        count += k
    if count != job.num_gpus:
        return None
    points = shape_points(job.profile, job.num_gpus, -(-job.num_gpus // shape.num_gpus), shape)
    _, least_cpus, least_mem_gb = points.best_effort_options()
    return KeptJob(
        tuple(out),
        job.num_gpus * c,
        job.num_gpus * m,
        c > shape.cpus_per_gpu + EPS or m > shape.mem_gb_per_gpu + EPS,
        best,
        speed,
        job.num_gpus * least_cpus,
        job.num_gpus * least_mem_gb,
        communicates(job.num_gpus),
    )


def best_if_kept(job: JobView, shape: ServerShape) -> OperatingPoint | None:
    """The job's best case when nothing but it decides where the job goes (no QoS, no choices, no node
    count, no fixed demand, no interference read, a current placement) and no faster point exists
    (so the leftover pass moves it nowhere); else None."""
    if (
        job.current is None
        or job.deadline_s is not None
        or job.min_rate_iters_per_s is not None
        or job.gpu_choices
        or job.num_nodes is not None
        or has_fixed_demand(job)
        or (job.profile.interference_kappa > 0 and communicates(job.num_gpus))
    ):
        return None
    points = shape_points(job.profile, job.num_gpus, -(-job.num_gpus // shape.num_gpus), shape)
    best = points.best
    if points.fastest_speed > best.speed + EPS:
        # The leftover pass could move it. best_case is the fastest point of every catalog profile
        # today; this keeps the shortcut right for a matrix where it is not.
        return None
    return best
