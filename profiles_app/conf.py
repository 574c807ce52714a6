"""GENIE profiling settings: the only place that reads settings.ATTUNE_GENIE_PROFILING."""

from __future__ import annotations

from dataclasses import dataclass

from django.conf import settings


@dataclass(frozen=True)
class GenieProfilingConf:
    """What a GENIE lightweight profiling run measures, its bound, and the platform model's defaults."""

    after_synergy: bool
    batch_factors: tuple[float, ...]
    default_batch: int
    iters: int
    warmup_iters: int
    max_s_per_config: float
    default_param_mb: float
    default_nic_gbps: float
    intra_gbps: float


def genie_profiling_conf() -> GenieProfilingConf:
    # Read on every call (a dict lookup) so that tests can override settings.
    raw = getattr(settings, "ATTUNE_GENIE_PROFILING", {})
    return GenieProfilingConf(
        after_synergy=bool(raw.get("after_synergy", True)),
        batch_factors=tuple(float(f) for f in raw.get("batch_factors", (0.5, 1.0, 2.0))),
        default_batch=int(raw.get("default_batch", 32)),
        iters=int(raw.get("iters", 30)),
        warmup_iters=int(raw.get("warmup_iters", 5)),
        max_s_per_config=float(raw.get("max_s_per_config", 60.0)),
        default_param_mb=float(raw.get("default_param_mb", 100.0)),
        default_nic_gbps=float(raw.get("default_nic_gbps", 10.0)),
        intra_gbps=float(raw.get("intra_gbps", 100.0)),
    )
