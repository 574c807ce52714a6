"""Synthetic workloads: Synergy's Philly-derived generator (PAPERS.md §3.5), GENIE's QoS workload (§2.3)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import replace
from typing import TYPE_CHECKING, Literal

from profiles_app.catalog import batch_size_for, load_catalog
from scheduler_app.core.throughput import REFERENCE_SHAPE, ServerShape, best_case, job_profile, with_penalty
from scheduler_app.core.types import SensitivityProfile
from scheduler_app.simulator.genie_fits import fitted_catalog, fitted_name
from scheduler_app.simulator.trace import TraceJob

if TYPE_CHECKING:
    import numpy as np

# The reference's model zoo per class, in its order (jobs/model_zoo.py): bert and vae are never drawn.
CLASS_MODELS: dict[str, tuple[str, ...]] = {
    "image": ("alexnet", "res18", "res50", "mobilenet", "shufflenet"),
    "language": ("gnmt", "transformer", "lstm"),
    "speech": ("m5", "deepspeech"),
}
CLASS_ORDER: tuple[str, ...] = ("image", "language", "speech")

# GPU-demand mix of the reference's synthetic multi-GPU workload (helpers/utils.py get_job_gpu_demand):
# the Philly log itself is not shipped, so multi-GPU mode draws from this mix (as synthmulti_* traces do).
MULTI_GPU_MIX: tuple[tuple[int, float], ...] = ((1, 0.70), (2, 0.10), (4, 0.15), (8, 0.05))

# Gavel-like durations (helpers/utils.py get_gavel_like_iter): 80 % short, 20 % long, log-uniform minutes.
LONG_JOB_FRACTION = 0.2
SHORT_LOG10_MIN = (1.5, 3.0)
LONG_LOG10_MIN = (3.0, 4.0)

STATIC_ARRIVAL_STEP_S = 0.001  # the reference's static traces: job i arrives at i ms

Assignment = Literal["overall", "random"]


def _draw_duration_s(rng: np.random.Generator) -> float:
    low, high = LONG_LOG10_MIN if rng.random() < LONG_JOB_FRACTION else SHORT_LOG10_MIN
    return 60.0 * 10.0 ** rng.uniform(low, high)


def _draw_gpus(rng: np.random.Generator) -> int:
    u = rng.random()
    cumulative = 0.0
    for gpus, probability in MULTI_GPU_MIX:
        cumulative += probability
        if u < cumulative:
            return gpus
    return MULTI_GPU_MIX[-1][0]


class _OverallSplitAssigner:
    """The reference's default model choice (ModelAssignment.OVERALL): deterministic, no randomness.

    The next job goes to the class furthest below its target share of all jobs so far (ties: image,
    language, speech); within a class the models are taken round-robin.
    """

    def __init__(self, split: tuple[float, float, float]) -> None:
        self.split = split
        self.counts = [0, 0, 0]
        self.next_model = [0, 0, 0]

    def next(self, rng: np.random.Generator) -> str:
        total = sum(self.counts)
        if total:
            # Same arithmetic as the reference (percent/100 - share) so that ties break identically.
            priorities = [self.split[i] / 100 - self.counts[i] / total for i in range(3)]
        else:
            priorities = [0.0, 0.0, 0.0]
        best = max(range(3), key=lambda i: (priorities[i], -i))
        self.counts[best] += 1
        models = CLASS_MODELS[CLASS_ORDER[best]]
        model = models[self.next_model[best] % len(models)]
        self.next_model[best] += 1
        return model


class _RandomSplitAssigner:
    """Class drawn with the split's probabilities, model uniformly within the class."""

    def __init__(self, split: tuple[float, float, float]) -> None:
        import numpy as np  # noqa: PLC0415 - numpy loads only when a trace is drawn (not for a trace file)

        weights = np.asarray(split, dtype=float)
        self.probabilities = weights / weights.sum()

    def next(self, rng: np.random.Generator) -> str:
        cls = CLASS_ORDER[int(rng.choice(3, p=self.probabilities))]
        models = CLASS_MODELS[cls]
        return models[int(rng.integers(len(models)))]


def philly_derived_trace(
    num_jobs: int,
    *,
    jobs_per_hour: float = 9.0,
    class_split: tuple[float, float, float] = (20, 70, 10),
    multi_gpu: bool = False,
    seed: int = 42,
    static: bool = False,
    assignment: Assignment = "overall",
    catalog: Mapping[str, SensitivityProfile] | None = None,
) -> list[TraceJob]:
    """Generate `num_jobs` jobs the way Synergy's simulator does (PAPERS.md §3.5), seeded and replayable.

    - Arrivals: Poisson at `jobs_per_hour`; inter-arrival gaps rounded up to whole seconds and the first
      job arriving one gap after 0 (the reference's convention). `static=True`: job i arrives at i ms.
    - Duration at the GPU-proportional point: 60 x 10^U(1.5, 3) s with probability 0.8, else
      60 x 10^U(3, 4) s; `total_iters = int(duration_s / iter_time_s)` of the chosen model (>= 1).
    - GPUs: 1, or with `multi_gpu` 1/2/4/8 with probability 0.70/0.10/0.15/0.05.
    - Model: class split (image, language, speech) in percent; "overall" assignment keeps the running
      class shares closest to the split (deterministic, as the reference), "random" draws them.
    Same arguments, same jobs (numpy's PCG64 Generator seeded with `seed`).
    """
    if num_jobs <= 0:
        raise ValueError(f"num_jobs must be positive, got {num_jobs}")
    if not static and not jobs_per_hour > 0:
        raise ValueError(f"jobs_per_hour must be positive, got {jobs_per_hour}")
    if len(class_split) != 3 or any(p < 0 for p in class_split) or sum(class_split) <= 0:
        raise ValueError(f"class_split must be three non-negative percentages, got {class_split}")
    if assignment not in ("overall", "random"):
        raise ValueError(f"assignment must be 'overall' or 'random', got {assignment!r}")
    profiles = load_catalog() if catalog is None else catalog
    split = (float(class_split[0]), float(class_split[1]), float(class_split[2]))
    assigner = _OverallSplitAssigner(split) if assignment == "overall" else _RandomSplitAssigner(split)
    import numpy as np  # noqa: PLC0415 - numpy loads only when a trace is drawn (not for a trace file)

    rng = np.random.default_rng(seed)
    mean_gap_s = 3600.0 / jobs_per_hour if jobs_per_hour > 0 else 0.0

    jobs: list[TraceJob] = []
    arrival_s = 0.0
    for job_id in range(num_jobs):
        model = assigner.next(rng)
        duration_s = _draw_duration_s(rng)
        num_gpus = _draw_gpus(rng) if multi_gpu else 1
        if static:
            arrival_s = round(job_id * STATIC_ARRIVAL_STEP_S, 3)
        else:
            arrival_s += math.ceil(rng.exponential(mean_gap_s))
        total_iters = max(1, int(duration_s / profiles[model].iter_time_s))
        jobs.append(TraceJob(job_id, model, float(arrival_s), total_iters, num_gpus))
    return jobs


# GENIE workload (PAPERS.md §2.3 "Setup", §5.9). CNN-heavy: GENIE characterised CNN tasks; the
# catalog's image models are CNNs (and m5 is a 1-D CNN), language and speech models make up the rest.
GENIE_CLASS_SPLIT: tuple[float, float, float] = (80, 10, 10)
GENIE_QOS_FACTOR = (1.2, 4.0)  # L = f x standalone best execution time, f ~ U[1.2, 4]
GENIE_URGENT_FACTOR = (1.05, 1.3)  # urgent ("emergency") jobs: f ~ U[1.05, 1.3]
GENIE_BURST_PROBABILITY = 0.05  # chance that an arrival starts a burst of urgent jobs
GENIE_BURST_SIZE = 4  # urgent jobs per burst (the arrival itself included)
GENIE_BURST_GAP_S = 1.0  # seconds between the urgent jobs of a burst


def standalone_best_s(
    profile: SensitivityProfile, total_iters: float, num_gpus: int, shape: ServerShape = REFERENCE_SHAPE
) -> float:
    """Execution time alone on an empty cluster of `shape` servers, at the best placement.

    Best placement: the fewest servers (consolidated) with the best-case CPU/memory, i.e.
    total_iters x iter_time_s / best-case speed-up (divided by the placement penalty when the job
    needs more than one server).
    """
    profile = job_profile(profile, num_gpus)
    speed = best_case(profile, num_gpus, shape).speed
    speed = with_penalty(speed, profile, -(-num_gpus // shape.num_gpus), num_gpus)
    return total_iters * profile.iter_time_s / speed


def genie_trace(
    num_jobs: int,
    *,
    jobs_per_hour: float = 6.0,
    class_split: tuple[float, float, float] = GENIE_CLASS_SPLIT,
    multi_gpu: bool = True,
    qos_factor: tuple[float, float] = GENIE_QOS_FACTOR,
    urgent_factor: tuple[float, float] = GENIE_URGENT_FACTOR,
    burst_probability: float = GENIE_BURST_PROBABILITY,
    burst_size: int = GENIE_BURST_SIZE,
    shape: ServerShape = REFERENCE_SHAPE,
    seed: int = 42,
    catalog: Mapping[str, SensitivityProfile] | None = None,
    min_rate_share: float = 0.0,
    batch_factors: tuple[float, ...] = (),
    gpu_ranges: bool = False,
) -> list[TraceJob]:
    """GENIE's evaluation workload, reconstructed (PAPERS.md §2.3): every job is a QoS job.

    - Arrivals: Poisson at `jobs_per_hour` (gaps rounded up to whole seconds, as philly_derived_trace).
      With probability `burst_probability` an arrival starts a burst: it and the next
      `burst_size - 1` jobs are urgent and arrive `GENIE_BURST_GAP_S` apart.
    - Model: class drawn with `class_split` (image, language, speech) percent, model uniform within
      the class; duration and GPU count as philly_derived_trace (1/2/4/8 GPUs when `multi_gpu`).
    - QoS latency L = f x standalone_best_s (servers of `shape`), f ~ U[qos_factor] or, for urgent
      jobs, U[urgent_factor]; deadline_s = arrival_s + L.
    - `min_rate_share` (0 to 1): each job is, with this probability, a minimum-rate job instead
      (GENIE's other QoS kind): the same job, with `min_rate_iters_per_s = total_iters / L` (the rate
      that would finish it within L of its start, i.e. its best-case rate / f) and no deadline. The
      choice is drawn from a second generator, so the jobs themselves do not change with the share,
      and 0 (the default) gives exactly the trace it always gave.
    - `batch_factors` (GENIE's per-job batch sizes, with the predictor in the loop): each job's per-GPU
      batch is its model's reference batch x one of these, drawn from a third generator, and its model
      is that fit, `model@b<batch>` (simulator/genie_fits.py; simulate with `genie_fitted_catalog()`):
      its iterations, its latency and every decision about it are timed by GENIE's predictor. Empty
      (the default): no fits, the trace it always gave.
    - `gpu_ranges`: a multi-GPU job accepts every power of two up to its drawn count
      (`TraceJob.gpu_choices`; GENIE's allocator picks, the others run it on its count); its work and
      latency are those of its count.
    Same arguments, same jobs (numpy PCG64 seeded with `seed`).
    """
    if num_jobs <= 0:
        raise ValueError(f"num_jobs must be positive, got {num_jobs}")
    if not jobs_per_hour > 0:
        raise ValueError(f"jobs_per_hour must be positive, got {jobs_per_hour}")
    if not 0.0 <= burst_probability <= 1.0 or burst_size < 1:
        raise ValueError("burst_probability must be in [0, 1] and burst_size >= 1")
    for low, high in (qos_factor, urgent_factor):
        if not 1.0 <= low <= high:
            raise ValueError(f"QoS factors must satisfy 1 <= low <= high, got {(low, high)}")
    if not 0.0 <= min_rate_share <= 1.0:
        raise ValueError(f"min_rate_share must be in [0, 1], got {min_rate_share}")
    import numpy as np  # noqa: PLC0415 - numpy loads only when a trace is drawn (not for a trace file)

    # A generator of its own: the share picks target kinds without moving the main stream's draws.
    kind_rng = np.random.default_rng([seed, 1]) if min_rate_share > 0 else None
    batch_rng = np.random.default_rng([seed, 2]) if batch_factors else None
    profiles = load_catalog() if catalog is None else catalog
    if batch_factors:
        profiles = genie_fitted_catalog(batch_factors, profiles)
    split = (float(class_split[0]), float(class_split[1]), float(class_split[2]))
    assigner = _RandomSplitAssigner(split)
    rng = np.random.default_rng(seed)
    mean_gap_s = 3600.0 / jobs_per_hour
    jobs: list[TraceJob] = []
    arrival_s = 0.0
    burst_left = 0
    for job_id in range(num_jobs):
        if burst_left > 0:
            arrival_s += GENIE_BURST_GAP_S
            burst_left -= 1
            urgent = True
        else:
            arrival_s += math.ceil(rng.exponential(mean_gap_s))
            urgent = bool(rng.random() < burst_probability)
            if urgent:
                burst_left = burst_size - 1
        model = assigner.next(rng)
        if batch_rng is not None:
            factor = batch_factors[int(batch_rng.integers(len(batch_factors)))]
            model = fitted_name(model, max(1.0, round(batch_size_for(model) * factor)))
        profile = profiles[model]
        num_gpus = min(_draw_gpus(rng) if multi_gpu else 1, shape.num_gpus)
        total_iters = max(1, int(_draw_duration_s(rng) / job_profile(profile, num_gpus).iter_time_s))
        low, high = urgent_factor if urgent else qos_factor
        latency_s = float(rng.uniform(low, high)) * standalone_best_s(profile, total_iters, num_gpus, shape)
        deadline_s = arrival_s + latency_s
        job = TraceJob(job_id, model, float(arrival_s), total_iters, num_gpus, deadline_s=deadline_s)
        if gpu_ranges and num_gpus > 1:
            fewer = tuple(2**i for i in range(num_gpus.bit_length()) if 2**i < num_gpus)
            job = replace(job, gpu_choices=fewer)
        if kind_rng is not None and kind_rng.random() < min_rate_share:
            job = replace(job, deadline_s=None, min_rate_iters_per_s=total_iters / latency_s)
        jobs.append(job)
    return jobs


def genie_fitted_catalog(
    batch_factors: tuple[float, ...] = (0.5, 1.0, 2.0),
    catalog: Mapping[str, SensitivityProfile] | None = None,
) -> dict[str, SensitivityProfile]:
    """The catalog plus each model's synthetic GENIE fit at its reference batch x each factor
    (`model@b<batch>`, simulator/genie_fits.py): what a trace of genie_trace(batch_factors=...) runs on."""
    profiles = load_catalog() if catalog is None else catalog
    references = {name: float(batch_size_for(name)) for name in profiles if "@" not in name}
    plain = {name: p for name, p in profiles.items() if "@" not in name}
    return fitted_catalog(plain, references, batch_factors)
