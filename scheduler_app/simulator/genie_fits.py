"""Synthetic GENIE fits of the catalog's models, so that the simulator runs with the predictor in the loop.

GENIE's paper gives no coefficients per model (PAPERS.md §2.3 [I]); these are ours, from each catalog
profile's own time per iteration `T` at its reference per-GPU batch `b0` (profiles_app.catalog):
- compute: `alpha·b0 = COMPUTE_SHARE·T`, `beta = (1 - COMPUTE_SHARE)·T`, so t(1, 1, b0) = T and a job of
  batch b takes `alpha·b + beta`;
- communication: one all-reduce step across servers `t_cross = COMM_SHARE[class]·T` (language models
  move more bytes per unit of compute than CNNs), and inside a server `t_intra = t_cross · NIC_GBPS /
  INTRA_GBPS`, the ratio of the two bandwidths of PAPERS' platform model 2P/B (the profiling run's
  defaults, profiles_app/conf.py: 10 Gb/s NICs, 100 Gb/s inside a server).
An 8-GPU CNN job spread over two servers (4 + 4 GPUs) is then 1.21x slower than on one, a language
model's 1.39x: the range that published cluster studies report, not a measurement. A fitted model is named
`model@b<batch>` in `fitted_catalog`, whose profiles carry the predictor (core/throughput.py times
every placement with it); `genie_trace(..., batch_factors=...)` draws each job's batch.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import replace

from scheduler_app.core.predictor import Predictor
from scheduler_app.core.types import SensitivityProfile

COMPUTE_SHARE = 0.8  # of an iteration at the reference batch, the part linear in the batch
COMM_SHARE = {"image": 0.25, "language": 0.5, "speech": 0.3, "other": 0.1}  # t_cross / T per class
NIC_GBPS = 10.0
INTRA_GBPS = 100.0
BATCH_FACTORS = (0.5, 1.0, 2.0)  # the lightweight profile's batch sizes, x the reference batch


def synthetic_predictor(profile: SensitivityProfile, reference_batch: float) -> Predictor:
    """The model's GENIE coefficients as this module's docstring derives them."""
    if not reference_batch > 0:
        raise ValueError(f"reference_batch must be positive, got {reference_batch}")
    t = profile.iter_time_s
    t_cross = COMM_SHARE.get(profile.workload_class, COMM_SHARE["other"]) * t
    return Predictor(
        alpha=COMPUTE_SHARE * t / reference_batch,
        beta=(1.0 - COMPUTE_SHARE) * t,
        t_intra=t_cross * NIC_GBPS / INTRA_GBPS,
        t_cross=t_cross,
    )


def fitted_name(model: str, batch: float) -> str:
    """The catalog name of `model` fitted at per-GPU batch `batch`."""
    return f"{model}@b{batch:g}"


def fitted_profile(profile: SensitivityProfile, reference_batch: float, batch: float) -> SensitivityProfile:
    """`profile` with its synthetic fit at per-GPU batch `batch`: timed on 1 GPU by the fit."""
    predictor = synthetic_predictor(profile, reference_batch)
    return replace(
        profile,
        name=fitted_name(profile.name, batch),
        predictor=predictor,
        batch_per_gpu=float(batch),
        iter_time_s=predictor.iter_time_s(1, 1, batch),
        scaled_for_gpus=1,
    )


def fitted_catalog(
    catalog: Mapping[str, SensitivityProfile],
    reference_batches: Mapping[str, float],
    batch_factors: Iterable[float] = BATCH_FACTORS,
) -> dict[str, SensitivityProfile]:
    """`model@b<batch>` -> the model fitted at that batch, for each model and factor x its reference
    batch (the plain names too, unfitted, so one catalog serves traces with and without fits)."""
    factors = tuple(batch_factors)
    out = dict(catalog)
    for name, profile in catalog.items():
        b0 = float(reference_batches[name])
        for factor in factors:
            batch = max(1.0, round(b0 * factor))
            out[fitted_name(name, batch)] = fitted_profile(profile, b0, batch)
    return out
