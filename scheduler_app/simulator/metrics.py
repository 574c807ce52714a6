"""Simulation results: per-job records, JCT statistics, allocation and utilisation of the cluster."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

SECONDS_PER_HOUR = 3600.0


@dataclass(frozen=True, slots=True)
class JobRecord:
    """What happened to one job. `start_s`/`finish_s`/`jct_s` are None while it never started/finished.

    `preemptions` counts the rounds in which the job, running in the previous round and not finished,
    was stopped: it lost its resources, was moved to others, or had its cores or memory changed by a
    restart (a change made in place is none); `moves` those of them onto other GPUs or servers.
    `restart_lost_gpu_s`: GPU-seconds its restarts cost, the start-ups (times the GPUs waiting) and the
    work lost since a checkpoint and done again (times the GPUs that had done it).
    `deadline_s` is set for QoS jobs (GENIE);
    `min_rate_iters_per_s` for jobs of the other QoS kind, with `avg_rate_iters_per_s` their measured
    average rate (total iterations / (finish - first start); None until finished).
    """

    job_id: int
    model: str
    num_gpus: int
    arrival_s: float
    start_s: float | None
    finish_s: float | None
    jct_s: float | None
    preemptions: int
    deadline_s: float | None = None
    min_rate_iters_per_s: float | None = None
    avg_rate_iters_per_s: float | None = None
    moves: int = 0
    restart_lost_gpu_s: float = 0.0


@dataclass(slots=True)
class UtilisationSeries:
    """One sample per round, taken when the round's plan is applied (columns, for compact JSON).

    `*_alloc` are the resources handed out; `cpus_used`/`mem_gb_used` the part of them a job can turn
    into speed: per job min(allocated, best-case demand), since CPU or memory beyond a job's best-case
    demand buys no throughput (the reference's "util" series counts the same way).
    """

    t_s: list[float] = field(default_factory=list)
    gpus_alloc: list[int] = field(default_factory=list)
    cpus_alloc: list[float] = field(default_factory=list)
    mem_gb_alloc: list[float] = field(default_factory=list)
    cpus_used: list[float] = field(default_factory=list)
    mem_gb_used: list[float] = field(default_factory=list)
    running_jobs: list[int] = field(default_factory=list)
    pending_jobs: list[int] = field(default_factory=list)

    def append(
        self,
        t_s: float,
        gpus: int,
        cpus: float,
        mem_gb: float,
        cpus_used: float,
        mem_gb_used: float,
        running: int,
        pending: int,
    ) -> None:
        self.t_s.append(t_s)
        self.gpus_alloc.append(gpus)
        self.cpus_alloc.append(cpus)
        self.mem_gb_alloc.append(mem_gb)
        self.cpus_used.append(cpus_used)
        self.mem_gb_used.append(mem_gb_used)
        self.running_jobs.append(running)
        self.pending_jobs.append(pending)

    def __len__(self) -> int:
        return len(self.t_s)

    def to_dict(self) -> dict[str, list[float] | list[int]]:
        return {
            "t_s": self.t_s,
            "gpus_alloc": self.gpus_alloc,
            "cpus_alloc": self.cpus_alloc,
            "mem_gb_alloc": self.mem_gb_alloc,
            "cpus_used": self.cpus_used,
            "mem_gb_used": self.mem_gb_used,
            "running_jobs": self.running_jobs,
            "pending_jobs": self.pending_jobs,
        }


@dataclass(frozen=True, slots=True)
class JctStats:
    """JCT statistics in hours over a set of finished jobs (NaN when there are none)."""

    count: int
    avg_h: float
    median_h: float
    p99_h: float
    p999_h: float


def jct_stats(jcts_s: list[float]) -> JctStats:
    """Mean, median, p99 and p99.9 of JCTs (seconds in, hours out); percentiles interpolate linearly,
    as numpy's and pandas' defaults (the reference prints pandas' quantiles)."""
    if not jcts_s:
        nan = float("nan")
        return JctStats(0, nan, nan, nan, nan)
    hours = [float(s) / SECONDS_PER_HOUR for s in jcts_s]
    mean_h = _pairwise_sum(hours, 0, len(hours)) / len(hours)
    ordered = sorted(hours)
    p50, p99, p999 = (_percentile(ordered, q) for q in (50.0, 99.0, 99.9))
    return JctStats(len(jcts_s), mean_h, p50, p99, p999)


# numpy's mean and percentile, in plain Python with the same float operations (bit for bit: a
# simulation's printed figures are compared to the last digit), so that a run needs no numpy: its
# import was about a tenth of the simulator command's CPU.
_PAIRWISE_BLOCK = 128  # numpy's PW_BLOCKSIZE


def _pairwise_sum(xs: list[float], lo: int, n: int) -> float:
    """numpy's pairwise summation of xs[lo:lo + n] (`np.add.reduce` of a contiguous float64 array:
    loops_utils.h `pairwise_sum`): under 8 terms in order; up to 128 in 8 running sums combined
    pairwise, then the rest in order; above, the two halves (cut at a multiple of 8) summed apart."""
    if n < 8:
        res = 0.0
        for i in range(lo, lo + n):
            res += xs[i]
        return res
    if n <= _PAIRWISE_BLOCK:
        r0, r1, r2, r3, r4, r5, r6, r7 = xs[lo : lo + 8]
        i = lo + 8
        end = lo + n - n % 8
        while i < end:
            r0 += xs[i]
            r1 += xs[i + 1]
            r2 += xs[i + 2]
            r3 += xs[i + 3]
            r4 += xs[i + 4]
            r5 += xs[i + 5]
            r6 += xs[i + 6]
            r7 += xs[i + 7]
            i += 8
        res = ((r0 + r1) + (r2 + r3)) + ((r4 + r5) + (r6 + r7))
        for j in range(i, lo + n):
            res += xs[j]
        return res
    half = n // 2
    half -= half % 8
    return _pairwise_sum(xs, lo, half) + _pairwise_sum(xs, lo + half, n - half)


def _percentile(ordered: list[float], q: float) -> float:
    """`np.percentile(values, q)` of finite values, sorted in `ordered` (its default, linear method:
    the virtual index (n - 1) x q / 100, and numpy's `_lerp`, which weighs from the upper value when
    the fraction is at least a half)."""
    n = len(ordered)
    index = (n - 1) * (q / 100)
    if index >= n - 1:
        return ordered[-1]
    below = math.floor(index)
    gamma = index - below
    a, b = ordered[below], ordered[below + 1]
    diff = b - a
    if gamma >= 0.5:
        return b - diff * (1 - gamma)
    return a + diff * gamma


@dataclass(frozen=True, slots=True)
class QosStats:
    """QoS (GENIE) figures over the jobs with a deadline (PAPERS.md §5.8).

    `met_pct` = percent of QoS jobs finished by their deadline (an unfinished job has missed it);
    `tardiness_h` = mean max(0, finish - deadline) in hours over the QoS jobs that finished (NaN
    when none did); `unfinished` = QoS jobs that never finished (left out of tardiness).
    """

    jobs: int
    met: int
    met_pct: float
    tardiness_h: float
    unfinished: int


def qos_stats(records: list[JobRecord]) -> QosStats:
    """QosStats of the records that carry a deadline."""
    qos = [r for r in records if r.deadline_s is not None]
    finished = [r for r in qos if r.finish_s is not None]
    met = sum(1 for r in finished if r.finish_s <= r.deadline_s)  # type: ignore[operator]
    late_s = [max(0.0, r.finish_s - r.deadline_s) for r in finished]  # type: ignore[operator]
    nan = float("nan")
    return QosStats(
        jobs=len(qos),
        met=met,
        met_pct=100.0 * met / len(qos) if qos else nan,
        tardiness_h=sum(late_s) / len(late_s) / SECONDS_PER_HOUR if late_s else nan,
        unfinished=len(qos) - len(finished),
    )


@dataclass(frozen=True, slots=True)
class MinRateStats:
    """The minimum-rate QoS kind's figures, apart from the deadline kind's (QosStats).

    A job is met when it finished and its average rate from its first start to its finish
    (`JobRecord.avg_rate_iters_per_s`) is at least its target; an unfinished job has missed it.
    `met_pct` is NaN when there are no such jobs.
    """

    jobs: int
    met: int
    met_pct: float
    unfinished: int


# Rates are compared with a relative tolerance: a job run exactly at its target must not miss it by
# a floating-point rounding of (finish - start).
RATE_REL_TOL = 1e-9


def min_rate_stats(records: list[JobRecord]) -> MinRateStats:
    """MinRateStats of the records that carry a minimum rate."""
    jobs = [r for r in records if r.min_rate_iters_per_s is not None]
    finished = [r for r in jobs if r.finish_s is not None]
    met = sum(
        1
        for r in finished
        if r.avg_rate_iters_per_s is not None
        and r.avg_rate_iters_per_s >= r.min_rate_iters_per_s * (1 - RATE_REL_TOL)  # type: ignore[operator]
    )
    return MinRateStats(
        jobs=len(jobs),
        met=met,
        met_pct=100.0 * met / len(jobs) if jobs else float("nan"),
        unfinished=len(jobs) - len(finished),
    )


@dataclass(frozen=True, slots=True)
class ResourceTotals:
    """Resource-seconds over the run: allocated, and the part turned into speed (see UtilisationSeries)."""

    gpu_alloc_s: float
    cpu_alloc_s: float
    mem_gb_alloc_s: float
    cpu_used_s: float
    mem_gb_used_s: float


def _pct(numerator: float, denominator: float) -> float:
    return 100.0 * numerator / denominator if denominator > 0 else 0.0


@dataclass(slots=True)
class SimulationResult:
    """Everything one simulation produced. `to_dict()` gives JSON-ready keys.

    JCT statistics cover the finished jobs whose id lies in `measured_job_ids` (all jobs when None).
    Makespan = last finish - first arrival over all finished jobs. `*_alloc_pct` = allocated
    resource-seconds / (capacity x makespan); `cpu_util_pct`/`mem_util_pct` count only the allocated
    share that jobs turn into speed (min(allocated, best-case demand)).
    """

    policy: str
    allocator: str
    round_s: float
    finish_at_round_end: bool
    restart_overhead_s: float
    total_gpus: int
    total_cpus: int
    total_mem_gb: float
    jobs: int
    finished_jobs: int
    measured_job_ids: tuple[int, int] | None
    jct: JctStats
    makespan_s: float
    totals: ResourceTotals
    rounds: int
    wall_s: float
    records: list[JobRecord]
    utilisation: UtilisationSeries
    stopped_early: bool = False
    infeasible_jobs: int = 0  # dropped: they can never fit this cluster
    restart_costs: dict[str, Any] | None = None  # RestartCosts.to_dict(); None: restarts are free
    restart_policy: dict[str, Any] | None = None  # the RestartPolicy rounds weighed; None: none

    @property
    def avg_jct_h(self) -> float:
        return self.jct.avg_h

    @property
    def median_jct_h(self) -> float:
        return self.jct.median_h

    @property
    def p99_jct_h(self) -> float:
        return self.jct.p99_h

    @property
    def makespan_h(self) -> float:
        return self.makespan_s / SECONDS_PER_HOUR

    @property
    def gpu_alloc_pct(self) -> float:
        return _pct(self.totals.gpu_alloc_s, self.total_gpus * self.makespan_s)

    @property
    def cpu_alloc_pct(self) -> float:
        return _pct(self.totals.cpu_alloc_s, self.total_cpus * self.makespan_s)

    @property
    def mem_alloc_pct(self) -> float:
        return _pct(self.totals.mem_gb_alloc_s, self.total_mem_gb * self.makespan_s)

    @property
    def cpu_util_pct(self) -> float:
        return _pct(self.totals.cpu_used_s, self.total_cpus * self.makespan_s)

    @property
    def mem_util_pct(self) -> float:
        return _pct(self.totals.mem_gb_used_s, self.total_mem_gb * self.makespan_s)

    def _measured_records(self) -> list[JobRecord]:
        records = self.records
        if self.measured_job_ids is not None:
            lo, hi = self.measured_job_ids
            records = [r for r in records if lo <= r.job_id < hi]
        return records

    @property
    def qos(self) -> QosStats:
        """QoS figures over the measured jobs (`measured_job_ids`, all when None) with a deadline."""
        return qos_stats(self._measured_records())

    @property
    def min_rate(self) -> MinRateStats:
        """The minimum-rate kind's figures over the measured jobs with a minimum rate."""
        return min_rate_stats(self._measured_records())

    @property
    def total_preemptions(self) -> int:
        return sum(r.preemptions for r in self.records)

    @property
    def total_moves(self) -> int:
        return sum(r.moves for r in self.records)

    @property
    def restart_lost_gpu_h(self) -> float:
        """GPU-hours lost to restarts over every job (start-ups of restarts and work done again)."""
        return sum(r.restart_lost_gpu_s for r in self.records) / SECONDS_PER_HOUR

    def summary(self) -> dict[str, Any]:
        """The headline figures only (no per-job records, no series)."""
        return self.to_dict(include_records=False, include_series=False)

    def to_dict(self, *, include_records: bool = True, include_series: bool = True) -> dict[str, Any]:
        """JSON-ready dict; NaN statistics (no finished job measured) become None."""

        def clean(value: float) -> float | None:
            return None if value != value else value  # NaN is not valid JSON

        qos = self.qos
        min_rate = self.min_rate
        out: dict[str, Any] = {
            "policy": self.policy,
            "allocator": self.allocator,
            "jobs": self.jobs,
            "finished_jobs": self.finished_jobs,
            "infeasible_jobs": self.infeasible_jobs,
            "measured_jobs": self.jct.count,
            "measured_job_ids": list(self.measured_job_ids) if self.measured_job_ids else None,
            "avg_jct_h": clean(self.jct.avg_h),
            "median_jct_h": clean(self.jct.median_h),
            "p99_jct_h": clean(self.jct.p99_h),
            "p999_jct_h": clean(self.jct.p999_h),
            "makespan_h": self.makespan_h,
            "gpu_alloc_pct": self.gpu_alloc_pct,
            "cpu_alloc_pct": self.cpu_alloc_pct,
            "mem_alloc_pct": self.mem_alloc_pct,
            "cpu_util_pct": self.cpu_util_pct,
            "mem_util_pct": self.mem_util_pct,
            "preemptions": self.total_preemptions,
            "moves": self.total_moves,
            "restart_lost_gpu_h": self.restart_lost_gpu_h,
            "restart_costs": self.restart_costs,
            "restart_policy": self.restart_policy,
            "qos_jobs": qos.jobs,
            "qos_pct": clean(qos.met_pct),
            "tardiness_h": clean(qos.tardiness_h),
            "min_rate_jobs": min_rate.jobs,
            "min_rate_pct": clean(min_rate.met_pct),
            "wall_s": self.wall_s,
            "rounds": self.rounds,
            "finish_at_round_end": self.finish_at_round_end,
            "round_s": self.round_s,
            "restart_overhead_s": self.restart_overhead_s,
            "cluster": {"gpus": self.total_gpus, "cpus": self.total_cpus, "mem_gb": self.total_mem_gb},
            "stopped_early": self.stopped_early,
        }
        if include_records:
            out["records"] = [asdict(r) for r in self.records]
        if include_series:
            out["utilisation"] = self.utilisation.to_dict()
        return out
