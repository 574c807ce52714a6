"""GENIE's performance predictor: per-iteration time, processing rate and execution time of a DL job.

PAPERS.md §2.3 / §5.6. A job of per-GPU batch `b` on `n` servers with `k` GPUs each takes

    t(n, k, b) = alpha*b + beta + ceil(log2 k)*t_intra + log2(n)*t_cross          seconds per iteration

(compute linear in the batch, an all-reduce tree inside a server, a log2 tree across servers),
optionally divided by the Synergy speed-up of its CPU/memory allocation (1.0 = GPU-proportional;
PAPERS §5.2 "GENIE time x 1/Synergy factor"). Processing rate R = n*k*b / t samples per second;
execution time E = remaining_samples / R + startup_s; response latency = waiting + execution.

`fit_predictor` fits the coefficients from GENIE's lightweight profile: single-GPU runs at two or
more batch sizes (ordinary least squares for alpha, beta), runs on one server with k >= 2 GPUs
(t_intra = mean of (t - t_c(b)) / ceil(log2 k)) and runs on n >= 2 servers (t_cross = mean of
(t - t_c(b) - ceil(log2 k)*t_intra) / log2 n). Missing multi-GPU or multi-server runs leave that
coefficient at 0 (the job is then predicted not to slow down when it spreads) and are flagged on the
fit. `fit_placement_penalty` learns the cross-node cost online instead, from the measured speeds of a
workload's leases on one server and spread over several. Pure: no I/O, no clock; frozen dataclasses.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass


def _intra_steps(gpus_per_server: int) -> int:
    """ceil(log2 k): the depth of the all-reduce tree inside one server (0 for one GPU)."""
    return math.ceil(math.log2(gpus_per_server)) if gpus_per_server > 1 else 0


def _cross_steps(num_servers: int) -> float:
    """log2 n: the cross-server term's multiplier (0 for one server)."""
    return math.log2(num_servers) if num_servers > 1 else 0.0


def _check_config(num_servers: int, gpus_per_server: int, batch: float) -> None:
    if num_servers < 1 or gpus_per_server < 1:
        raise ValueError(f"need n >= 1 servers, k >= 1 GPUs each; got n={num_servers}, k={gpus_per_server}")
    if not batch > 0:
        raise ValueError(f"batch must be positive, got {batch}")


@dataclass(frozen=True, slots=True)
class Predictor:
    """Fitted coefficients of one model (seconds, seconds per sample for `alpha`)."""

    alpha: float
    beta: float
    t_intra: float = 0.0
    t_cross: float = 0.0
    startup_s: float = 0.0

    def iter_time_s(
        self, num_servers: int, gpus_per_server: int, batch: float, speedup: float = 1.0
    ) -> float:
        """Seconds per iteration on `num_servers` x `gpus_per_server` GPUs at per-GPU batch `batch`.

        `speedup` is the Synergy factor of the CPU/memory allocation (time is divided by it).
        """
        _check_config(num_servers, gpus_per_server, batch)
        if not speedup > 0:
            raise ValueError(f"speedup must be positive, got {speedup}")
        t = (
            self.alpha * batch
            + self.beta
            + _intra_steps(gpus_per_server) * self.t_intra
            + _cross_steps(num_servers) * self.t_cross
        )
        return t / speedup

    def rate(self, num_servers: int, gpus_per_server: int, batch: float, speedup: float = 1.0) -> float:
        """Processing rate in samples per second: n*k*b / t(n, k, b)."""
        t = self.iter_time_s(num_servers, gpus_per_server, batch, speedup)
        return num_servers * gpus_per_server * batch / t

    def execution_time_s(
        self,
        remaining_samples: float,
        num_servers: int,
        gpus_per_server: int,
        batch: float,
        speedup: float = 1.0,
    ) -> float:
        """Predicted execution time: remaining_samples / R + startup_s."""
        if remaining_samples < 0:
            raise ValueError(f"remaining_samples must be >= 0, got {remaining_samples}")
        return remaining_samples / self.rate(num_servers, gpus_per_server, batch, speedup) + self.startup_s


def spread_slowdown(predictor: Predictor, batch: float, num_gpus: int, num_servers: int) -> float:
    """How many times slower a job of `num_gpus` GPUs at per-GPU batch `batch` runs on `num_servers`
    servers (ceil(num_gpus / n) GPUs each) than on one: t(n, ceil(k/n), b) / t(1, k, b), at least 1
    (a fit whose t_cross came out negative, from noise, does not make spreading pay)."""
    if num_servers <= 1:
        return 1.0
    num_gpus = max(1, num_gpus)
    spread = predictor.iter_time_s(num_servers, max(1, -(-num_gpus // num_servers)), batch)
    one = predictor.iter_time_s(1, num_gpus, batch)
    return max(1.0, spread / one) if one > 0 else 1.0


def gpu_count_slowdown(predictor: Predictor, batch: float, num_gpus: int) -> float:
    """t(1, k, b) / t(1, 1, b): how much longer an iteration of a k-GPU job on one server takes than a
    1-GPU one (the all-reduce inside the server), at least 1."""
    if num_gpus <= 1:
        return 1.0
    one = predictor.iter_time_s(1, 1, batch)
    return max(1.0, predictor.iter_time_s(1, num_gpus, batch) / one) if one > 0 else 1.0


def response_latency_s(waiting_s: float, execution_s: float) -> float:
    """GENIE's response latency: time waiting in the queue plus execution time."""
    return waiting_s + execution_s


@dataclass(frozen=True, slots=True)
class ProfileSample:
    """One profiling run: mean measured seconds per iteration (warm-up discarded) of a configuration."""

    num_servers: int
    gpus_per_server: int
    batch: float
    iter_time_s: float


@dataclass(frozen=True, slots=True)
class PredictorFit:
    """The fitted predictor and how well it explains its own profile.

    `r2_compute` is R^2 of the single-GPU linear fit t_c(b) = alpha*b + beta; `r2` is R^2 of the
    whole model over every profile sample (1.0 when the samples have no variance and fit exactly).
    `has_intra` / `has_cross` say whether a multi-GPU / multi-server run was profiled.
    """

    predictor: Predictor
    r2_compute: float
    r2: float
    samples: int
    has_intra: bool
    has_cross: bool


def _r2(observed: Sequence[float], predicted: Sequence[float]) -> float:
    mean = sum(observed) / len(observed)
    ss_tot = sum((y - mean) ** 2 for y in observed)
    ss_res = sum((y - p) ** 2 for y, p in zip(observed, predicted, strict=True))
    if ss_tot == 0.0:
        return 1.0 if ss_res == 0.0 else 0.0
    return 1.0 - ss_res / ss_tot


def fit_predictor(samples: Sequence[ProfileSample], *, startup_s: float = 0.0) -> PredictorFit:
    """Fit alpha, beta (least squares on single-GPU runs), then t_intra, then t_cross (see module doc).

    Raises ValueError without single-GPU runs at two or more distinct batch sizes.
    """
    for s in samples:
        _check_config(s.num_servers, s.gpus_per_server, s.batch)
        if not s.iter_time_s > 0:
            raise ValueError(f"iter_time_s must be positive, got {s}")
    single = [s for s in samples if s.num_servers == 1 and s.gpus_per_server == 1]
    if len({s.batch for s in single}) < 2:
        raise ValueError("need single-GPU runs at two or more distinct batch sizes to fit alpha and beta")
    m = len(single)
    mean_b = sum(s.batch for s in single) / m
    mean_t = sum(s.iter_time_s for s in single) / m
    sxx = sum((s.batch - mean_b) ** 2 for s in single)
    sxy = sum((s.batch - mean_b) * (s.iter_time_s - mean_t) for s in single)
    alpha = sxy / sxx
    beta = mean_t - alpha * mean_b
    r2_compute = _r2([s.iter_time_s for s in single], [alpha * s.batch + beta for s in single])

    def compute(b: float) -> float:
        return alpha * b + beta

    intra = [s for s in samples if s.num_servers == 1 and s.gpus_per_server > 1]
    t_intra = (
        sum((s.iter_time_s - compute(s.batch)) / _intra_steps(s.gpus_per_server) for s in intra) / len(intra)
        if intra
        else 0.0
    )
    cross = [s for s in samples if s.num_servers > 1]
    t_cross = (
        sum(
            (s.iter_time_s - compute(s.batch) - _intra_steps(s.gpus_per_server) * t_intra)
            / _cross_steps(s.num_servers)
            for s in cross
        )
        / len(cross)
        if cross
        else 0.0
    )
    predictor = Predictor(alpha=alpha, beta=beta, t_intra=t_intra, t_cross=t_cross, startup_s=startup_s)
    r2 = _r2(
        [s.iter_time_s for s in samples],
        [predictor.iter_time_s(s.num_servers, s.gpus_per_server, s.batch) for s in samples],
    )
    return PredictorFit(
        predictor=predictor,
        r2_compute=r2_compute,
        r2=r2,
        samples=len(samples),
        has_intra=bool(intra),
        has_cross=bool(cross),
    )


# A learned placement penalty rests on at least this many leases of each kind (one server, spread).
PENALTY_MIN_LEASES = 3
# Above this a spread job is not merely slow but broken (a wrong NIC, a hung peer): not a penalty.
PENALTY_MAX = 10.0


def _median(values: Sequence[float]) -> float:
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


def fit_placement_penalty(
    single_server_ratios: Sequence[float],
    spread_ratios: Sequence[float],
    *,
    min_leases: int = PENALTY_MIN_LEASES,
    max_penalty: float = PENALTY_MAX,
) -> float | None:
    """GENIE's cross-node cost of a workload, learnt online as the core's placement penalty.

    Each ratio is one lease's measured speed over the speed its profile predicts without any penalty:
    leases on one server in `single_server_ratios`, leases of jobs spread over servers in
    `spread_ratios`. Whatever the profile gets wrong for every lease (a slower GPU, a different
    dataset) is in both and cancels in median(single) / median(spread); what is left is what spreading
    costs. Medians, so one odd lease (a noisy neighbour, a warm-up) does not move it. Clamped to
    [1, max_penalty]: spreading never speeds a job up in this model. None with fewer than `min_leases`
    positive ratios of either kind. Constant over the number of servers, as the core applies it
    (GENIE's log2(n) t_cross grows with n; our clusters rarely spread a job over more than two).
    """
    single = [r for r in single_server_ratios if r > 0]
    spread = [r for r in spread_ratios if r > 0]
    if len(single) < min_leases or len(spread) < min_leases:
        return None
    return min(max_penalty, max(1.0, _median(single) / _median(spread)))


# A learnt kappa rests on at least this many leases of each kind (alone, co-located).
KAPPA_MIN_LEASES = 3
# Above this, co-location is not interference but a fault (a saturated NIC, a broken peer).
KAPPA_MAX = 2.0


def fit_interference_kappa(
    alone_ratios: Sequence[float],
    colocated: Sequence[tuple[float, int]],
    *,
    min_leases: int = KAPPA_MIN_LEASES,
    max_kappa: float = KAPPA_MAX,
) -> float | None:
    """GENIE's interference coefficient kappa of a workload, learnt online from its communicating leases.

    Each ratio is one lease's measured speed over the speed its prediction gives without interference
    (and without the spread's slowdown): `alone_ratios` for leases with no other communicating job on
    their servers, `colocated` (ratio, x) for leases next to x >= 1 of them. What the prediction gets
    wrong for every lease cancels in r_alone / r, where r_alone is the median alone; each co-located
    lease then says kappa = (r_alone / r - 1) / x, from r = r_alone / (1 + kappa x). The median of
    those, clamped to [0, max_kappa] (co-location never speeds a job up in this model). None with fewer
    than `min_leases` positive ratios of either kind.
    """
    alone = [r for r in alone_ratios if r > 0]
    together = [(r, x) for r, x in colocated if r > 0 and x >= 1]
    if len(alone) < min_leases or len(together) < min_leases:
        return None
    r_alone = _median(alone)
    return min(max_kappa, max(0.0, _median([(r_alone / r - 1.0) / x for r, x in together])))
