"""What a QoS decision reads of a job's matrix on a cluster shape, worked out once per workload profile.

SWAF's order, its guarantees (policies/guarantees.py) and the genie allocator each ask, for every
job of every round, its best-case speed and which of its Pareto points meet a speed, on the fewest
servers that hold it. Those answers depend only on the job's profile, GPU count, server count and
the cluster's shape, and an lru_cache lookup of them hashes the whole profile (its matrix) every
time; so `shape_points` keeps them per profile identity, each entry holding its profile (alive, so
its id is not reused while the entry stands). Every value is computed by the same expression as
before, in the same order: the decisions are the same to the last bit.
"""

from __future__ import annotations

from bisect import bisect_left

from scheduler_app.core import reasons
from scheduler_app.core.allocators.genie_candidates import points_by_cost
from scheduler_app.core.throughput import EPS, OperatingPoint, ServerShape, best_case, with_penalty
from scheduler_app.core.types import SensitivityProfile

# Entries kept at once (one per workload, GPU count, server count and shape seen): a simulation
# holds a few dozen; the live service a few hundred at most. Cleared whole when full. Full, with every
# answer worked out, it held 12.2 MiB plus 11.2 MiB of the profiles it keeps alive
# (`python -m bench.genie_memo_memory`).
MEMO_SIZE = 4096


class ShapePoints:
    """A job's points on `shape` with `num_gpus` GPUs on `servers` servers (the fewest that hold it,
    or its node count): the best case's speed after the spread's slowdown, and, worked out when first
    asked for, its Pareto points cheapest first (points_by_cost) with their speeds after the slowdown."""

    __slots__ = (
        "_ascending",
        "_best_effort",
        "_fastest",
        "_gpu_dominant",
        "_options",
        "_points",
        "_speeds",
        "best",
        "best_speed",
        "num_gpus",
        "profile",
        "servers",
        "shape",
    )

    def __init__(self, profile: SensitivityProfile, num_gpus: int, servers: int, shape: ServerShape) -> None:
        self.profile = profile
        self.num_gpus = num_gpus
        self.servers = servers
        self.shape = shape
        self.best = best_case(profile, num_gpus, shape)
        self.best_speed = with_penalty(self.best.speed, profile, servers, num_gpus)
        self._points: tuple[OperatingPoint, ...] | None = None
        self._speeds: list[float] = []
        self._ascending: list[float] = []
        self._gpu_dominant: list[float] = []
        self._options: dict[int, tuple[list[tuple[OperatingPoint, str]], float, float]] = {}
        self._best_effort: tuple[list[tuple[OperatingPoint, str]], float, float] | None = None
        self._fastest: float | None = None

    @property
    def points(self) -> tuple[OperatingPoint, ...]:
        """points_by_cost(profile, num_gpus, shape)."""
        if self._points is None:
            self._fill()
        assert self._points is not None
        return self._points

    @property
    def fastest_speed(self) -> float:
        """The highest speed of any point (before the servers' slowdown): what the leftover pass can
        reach at most."""
        if self._fastest is None:
            self._fastest = max(p.speed for p in self.points)
        return self._fastest

    @property
    def speeds(self) -> list[float]:
        """Each point's speed after the slowdown of `servers` servers, in the points' order."""
        if self._points is None:
            self._fill()
        return self._speeds

    def _fill(self) -> None:
        profile, num_gpus, servers, shape = self.profile, self.num_gpus, self.servers, self.shape
        points = points_by_cost(profile, num_gpus, shape)
        self._speeds = [with_penalty(p.speed, profile, servers, num_gpus) for p in points]
        self._ascending = sorted(self._speeds)
        cpus, mem_gb = shape.cpus_per_gpu, shape.mem_gb_per_gpu
        self._gpu_dominant = [
            num_gpus * max(1.0, p.cpus_per_gpu / cpus, p.mem_gb_per_gpu / mem_gb) for p in points
        ]
        self._points = points

    def meeting_count(self, need: float) -> int:
        """How many points reach `need` (speed >= need - EPS): the points that do are always the
        fastest that many, so the count names the set (need_key compares it between rounds)."""
        if self._points is None:
            self._fill()
        ascending = self._ascending
        return len(ascending) - bisect_left(ascending, need - EPS)

    def qos_options(self, need: float) -> tuple[list[tuple[OperatingPoint, str]], float, float]:
        """The points reaching `need`, cheapest first, each with the reason `qos_fit`, and the least
        cores and GB per GPU among them (a memo per set: the list is not to be changed)."""
        count = self.meeting_count(need)
        hit = self._options.get(count)
        if hit is None:
            threshold = need - EPS
            speeds = self._speeds
            fit = reasons.QOS_FIT
            options = [(p, fit) for p, v in zip(self.points, speeds, strict=True) if v >= threshold]
            hit = self._options[count] = (
                options,
                min((p.cpus_per_gpu for p, _ in options), default=0.0),
                min((p.mem_gb_per_gpu for p, _ in options), default=0.0),
            )
        return hit

    def best_effort_options(self) -> tuple[list[tuple[OperatingPoint, str]], float, float]:
        """genie's points for a best-effort job (GenieRound.best_effort_options: its best case, the
        proportional share when the best case asks more, then the cheaper points fastest first),
        each with its reason, and the least cores and GB per GPU among them (a memo: not to be
        changed)."""
        found = self._best_effort
        if found is None:
            best, shape = self.best, self.shape
            options = [(best, reasons.BEST_CASE)]
            prop = OperatingPoint(shape.cpus_per_gpu, shape.mem_gb_per_gpu, 1.0)
            if best.cpus_per_gpu > prop.cpus_per_gpu + EPS or best.mem_gb_per_gpu > prop.mem_gb_per_gpu + EPS:
                options.append((prop, reasons.PROPORTIONAL))
            cheaper = [p for p in self.points if p.speed < best.speed - EPS]
            options += [(p, reasons.INTERMEDIATE) for p in sorted(cheaper, key=lambda p: -p.speed)]
            found = self._best_effort = (
                options,
                min(p.cpus_per_gpu for p, _ in options),
                min(p.mem_gb_per_gpu for p, _ in options),
            )
        return found

    def cheapest_gpu_s(self, work_s: float, speed_needed: float) -> float | None:
        """guarantees.deadline_need_gpu_s's minimum over the points fast enough: GPUs x the dominant
        resource x the execution time there, each computed as it always was."""
        if self._points is None:
            self._fill()
        cheapest: float | None = None
        threshold = speed_needed - EPS
        for speed, gpu_dominant in zip(self._speeds, self._gpu_dominant, strict=True):
            if speed < threshold:
                continue
            need = gpu_dominant * work_s / speed
            if cheapest is None or need < cheapest:
                cheapest = need
        return cheapest


_memo: dict[tuple[int, int, int, int, float, float], ShapePoints] = {}


def shape_points(profile: SensitivityProfile, num_gpus: int, servers: int, shape: ServerShape) -> ShapePoints:
    """The ShapePoints of a profile, GPU count, server count and shape (a memo by profile identity;
    the shape by its fields, whose tuple hashes without a call to the dataclass's __hash__)."""
    key = (id(profile), num_gpus, servers, shape.num_gpus, shape.num_cpus, shape.mem_gb)
    hit = _memo.get(key)
    if hit is None or hit.profile is not profile:
        if len(_memo) >= MEMO_SIZE:
            _memo.clear()
        hit = _memo[key] = ShapePoints(profile, num_gpus, servers, shape)
    return hit


def memo_entries() -> int:
    """How many entries `shape_points` holds now (bench.genie_memo_memory measures them)."""
    return len(_memo)


def memo_clear() -> None:
    """Drop every entry of `shape_points`' memo."""
    _memo.clear()
