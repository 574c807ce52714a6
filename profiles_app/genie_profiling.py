"""GENIE's lightweight profiling run: its plan, its measured points, and the predictor fit stored from them.

The flow (docs/genie.md, "The lightweight profiling run"):
1. `genie_profiling_run_queue` queues a ProfilingRun of kind genie_predictor (staff, or
   `manage.py profile_workload NAME --genie`).
2. Dispatch (scheduler_app/services/profiling.py, under the round lock) gives it 2 free GPUs of one
   server when it can (else 1) and 1 free GPU of a second server when one is free (the peer), each with
   the GPU-proportional share of cores and memory; `genie_profiling_run_assign` plans the
   configurations from what it got, and records why a term cannot be measured.
3. The agents measure the configurations (`profile` commands with `"method": "genie"`); each
   `profile_point` goes through `genie_point_record`. The cross-server configuration comes first, so
   the peer's GPU is released as soon as its part is measured.
4. Once every configuration is measured, `genie_profiling_run_succeed` fits the predictor
   (core.predictor.fit_predictor), fills in what could not be measured from the platform model of
   PAPERS 2.3 (t = 2 P / B, P the model's parameter bytes, B a bandwidth), and stores a GenieFit with its
   samples, residuals and R^2; the workload's genie_* fields copy it.
"""

from __future__ import annotations

import logging
import statistics
import uuid
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from django.db import transaction
from django.utils import timezone

from cluster_app.models import Server
from profiles_app import optimistic
from profiles_app.conf import GenieProfilingConf, genie_profiling_conf
from profiles_app.models import (
    ACTIVE_PROFILING_STATES,
    GenieFit,
    ProfilingKind,
    ProfilingRun,
    ProfilingRunStatus,
    Workload,
)
from profiles_app.services.profiling_runs import profiling_run_costs
from scheduler_app.core.predictor import Predictor, ProfileSample, fit_predictor

logger = logging.getLogger(__name__)

TERMS = ("alpha", "beta", "t_intra", "t_cross")
BYTES_PER_MB = 1_000_000
BITS_PER_BYTE = 8


def config_key(num_servers: int, gpus_per_server: int, batch: int) -> str:
    """A configuration's stable name: n servers x k GPUs each at per-GPU batch b, e.g. "n1k2b32"."""
    return f"n{num_servers}k{gpus_per_server}b{batch}"


def genie_batches(workload: Workload, conf: GenieProfilingConf) -> tuple[int, list[int]]:
    """(the workload's reference batch, the distinct per-GPU batch sizes to measure on 1 GPU)."""
    base = int(workload.batch_size or conf.default_batch)
    batches = sorted({max(1, round(base * f)) for f in conf.batch_factors})
    if len(batches) < 2:  # alpha and beta need two batch sizes at least
        batches = sorted({base, base * 2})
    return base, batches


def genie_configs(
    *, base_batch: int, batches: Sequence[int], intra: bool, cross: bool
) -> list[dict[str, Any]]:
    """The configurations of one run, in measurement order. Across servers first: the peer's GPU is
    then released as soon as its part is measured, instead of idling through the others."""
    shapes: list[tuple[int, int, int]] = []
    if cross:
        shapes.append((2, 1, base_batch))
    shapes += [(1, 1, b) for b in batches]
    if intra:
        shapes.append((1, 2, base_batch))
    return [
        {"key": config_key(n, k, b), "num_servers": n, "gpus_per_server": k, "batch": b} for n, k, b in shapes
    ]


def genie_profiling_run_queue(
    *,
    workload: Workload,
    max_s_per_config: float | None = None,
    iters: int | None = None,
    warmup_iters: int | None = None,
) -> ProfilingRun:
    """A QUEUED GENIE profiling run of `workload` (at most one run of any kind is active per workload:
    the database refuses a second, so callers check first). Defaults from settings."""
    conf = genie_profiling_conf()
    return ProfilingRun.objects.create(
        workload=workload,
        kind=ProfilingKind.GENIE_PREDICTOR,
        status=ProfilingRunStatus.QUEUED,
        iters_per_point=iters or conf.iters,
        warmup_iters=conf.warmup_iters if warmup_iters is None else warmup_iters,
        max_s_per_config=max_s_per_config or conf.max_s_per_config,
    )


def genie_profiling_run_follow_up(*, workload: Workload) -> ProfilingRun | None:
    """GENIE's lightweight profile of a workload whose Synergy profile was just stored, queued by itself
    when settings ask for it (`after_synergy`, the default) and the workload has no fit yet and no other
    active run; None otherwise. Rounds dispatch it on their leftovers (profiling_runs_dispatch)."""
    if not genie_profiling_conf().after_synergy or workload.genie_alpha_s is not None:
        return None
    if ProfilingRun.objects.filter(workload=workload, status__in=ACTIVE_PROFILING_STATES).exists():
        return None
    return genie_profiling_run_queue(workload=workload)


def genie_profiling_run_assign(
    *,
    run: ProfilingRun,
    server: Server,
    gpu_indices: Sequence[int],
    num_cpus: int,
    mem_gb: float,
    peer: Server | None,
    peer_gpu_indices: Sequence[int] = (),
    peer_num_cpus: int = 0,
    peer_mem_gb: float = 0.0,
    unmeasured: Mapping[str, str],
    now: datetime,
) -> ProfilingRun:
    """QUEUED -> RUNNING on `server` (and `peer`), holding these GPUs, cores and memory, with its plan.

    `unmeasured` maps a term that this placement cannot measure ("t_intra": 1 GPU only, "t_cross": no
    peer) to why; the fit fills it in from the platform model and says so. The caller holds the round
    lock, so nothing else hands these resources out meanwhile.
    """
    base, batches = genie_batches(run.workload, genie_profiling_conf())
    run.server = server
    run.gpu_indices = [int(i) for i in gpu_indices]
    run.num_gpus = len(run.gpu_indices)
    run.num_cpus = int(num_cpus)
    run.mem_gb = float(mem_gb)
    run.peer_server = peer
    run.peer_lease_id = uuid.uuid4() if peer else None
    run.peer_gpu_indices = [int(i) for i in peer_gpu_indices] if peer else []
    run.peer_num_cpus = int(peer_num_cpus) if peer else 0
    run.peer_mem_gb = float(peer_mem_gb) if peer else 0.0
    run.peer_released_at = None
    run.configs = genie_configs(
        base_batch=base, batches=batches, intra=run.num_gpus >= 2, cross=peer is not None
    )
    run.status = ProfilingRunStatus.RUNNING
    run.started_at = now
    run.measured_points = []
    run.pending_cpus = []
    run.result = {"unmeasured": dict(unmeasured)}
    run.save()
    logger.info(
        "GENIE profiling run %s (%s): on %s GPUs %s%s; configurations %s; not measured: %s",
        run.pk,
        run.workload.name,
        server.name,
        run.gpu_indices,
        f" and {peer.name} GPUs {run.peer_gpu_indices}" if peer else "",
        [c["key"] for c in run.configs],
        dict(unmeasured) or "none",
    )
    return run


def _complete(run: ProfilingRun) -> dict[str, list[dict[str, Any]]]:
    """Configuration key -> its measured parts (one per node rank), for every fully measured one."""
    parts: dict[str, dict[int, dict[str, Any]]] = {}
    for p in run.measured_points:
        parts.setdefault(p["config"], {}).setdefault(int(p["node_rank"]), p)
    return {
        c["key"]: [parts[c["key"]][r] for r in range(c["num_servers"])]
        for c in run.configs
        if len(parts.get(c["key"], {})) == c["num_servers"]
    }


def genie_point_record(
    *, run: ProfilingRun, point: Mapping[str, Any], node_rank: int, now: datetime | None = None
) -> bool:
    """Store one measured part of a configuration (the first per configuration and rank wins).

    Returns True when every configuration is measured. Once the cross-server configuration has all its
    parts, the peer's GPU, cores and memory are released (`peer_released_at`). The caller locked `run`
    and checked the point's shape; an unknown configuration or rank raises ValueError.
    """
    config = next((c for c in run.configs if c["key"] == point["config"]), None)
    if config is None or not 0 <= node_rank < config["num_servers"]:
        raise ValueError(f"no configuration {point['config']!r} with node rank {node_rank} in this run")
    seen = {(p["config"], int(p["node_rank"])) for p in run.measured_points}
    if (config["key"], node_rank) not in seen:
        run.measured_points = [*run.measured_points, {**point, "node_rank": node_rank}]
    complete = _complete(run)
    fields = ["measured_points"]
    if run.peer_server_id and run.peer_released_at is None:
        cross = [c["key"] for c in run.configs if c["num_servers"] > 1]
        if all(key in complete for key in cross):
            run.peer_released_at = now or timezone.now()
            fields.append("peer_released_at")
            logger.info("GENIE profiling run %s: peer part measured, its GPU released", run.pk)
    run.save(update_fields=fields)
    return len(complete) == len(run.configs)


def platform_comm_s(*, param_bytes: float, gbps: float) -> float:
    """PAPERS 2.3's platform model of one all-reduce step: t = 2 P / B (P bytes, B in Gb/s)."""
    return 2.0 * param_bytes * BITS_PER_BYTE / (gbps * 1e9)


def genie_samples(run: ProfilingRun) -> list[dict[str, Any]]:
    """One sample per measured configuration: the mean of its parts' seconds per iteration (the ranks
    of a synchronous data-parallel step run the same steps: their mean only averages out noise)."""
    complete = _complete(run)
    samples = []
    for c in run.configs:
        parts = complete.get(c["key"])
        if not parts:
            continue
        samples.append(
            {
                "config": c["key"],
                "num_servers": c["num_servers"],
                "gpus_per_server": c["gpus_per_server"],
                "batch": c["batch"],
                "iter_time_s": statistics.fmean(float(p["sec_per_iter"]) for p in parts),
                "ranks": [float(p["sec_per_iter"]) for p in parts],
            }
        )
    return samples


def genie_fit_store(
    *,
    workload: Workload,
    samples: Sequence[Mapping[str, Any]],
    unmeasured: Mapping[str, str],
    startup_s: float | None,
    param_bytes: float | None,
    nic_gbps: float,
    run: ProfilingRun | None = None,
) -> GenieFit:
    """Fit GENIE's predictor to the samples, fill in what was not measured, store it on the workload.

    A term without a sample (no 2-GPU run: t_intra; no 2-server run: t_cross) comes from the platform
    model, 2 P / B: P = `param_bytes` as the workload reported it, else the configured default; B =
    `nic_gbps` across servers, the configured intra-server bandwidth inside one. `unmeasured` says why
    each such term was not measured; `filled` on the stored fit keeps both. Raises ValueError without
    two single-GPU batch sizes (fit_predictor's condition).
    """
    conf = genie_profiling_conf()
    fit = fit_predictor(
        [
            ProfileSample(s["num_servers"], s["gpus_per_server"], float(s["batch"]), float(s["iter_time_s"]))
            for s in samples
        ],
        startup_s=max(0.0, startup_s or 0.0),
    )
    p = fit.predictor
    bytes_known = bool(param_bytes and param_bytes > 0)
    size = float(param_bytes) if bytes_known else conf.default_param_mb * BYTES_PER_MB
    origin = "reported by the workload" if bytes_known else "the configured default"
    size_text = f"{size / BYTES_PER_MB:g} MB of parameters, {origin}"
    filled: dict[str, str] = {}
    t_intra, t_cross = p.t_intra, p.t_cross
    if not fit.has_intra:
        t_intra = platform_comm_s(param_bytes=size, gbps=conf.intra_gbps)
        why = unmeasured.get("t_intra", "no 2-GPU run")
        filled["t_intra"] = (
            f"t_intra from the platform model: {why} (2 x {size_text} / {conf.intra_gbps:g} Gb/s)"
        )
    if not fit.has_cross:
        t_cross = platform_comm_s(param_bytes=size, gbps=nic_gbps)
        why = unmeasured.get("t_cross", "no 2-server run")
        filled["t_cross"] = f"t_o from the platform model: {why} (2 x {size_text} / {nic_gbps:g} Gb/s)"
    if startup_s is None:
        filled["startup_s"] = "startup_s is 0: the workload did not report its start-up time"
    predictor = Predictor(
        alpha=p.alpha, beta=p.beta, t_intra=t_intra, t_cross=t_cross, startup_s=max(0.0, startup_s or 0.0)
    )
    residuals = []
    for s in samples:
        predicted = predictor.iter_time_s(s["num_servers"], s["gpus_per_server"], float(s["batch"]))
        measured = float(s["iter_time_s"])
        residuals.append(
            {
                "config": s["config"],
                "measured_s": measured,
                "predicted_s": predicted,
                "error_pct": 100.0 * (predicted - measured) / measured,
            }
        )
    measured_terms = (
        ["alpha", "beta"] + (["t_intra"] if fit.has_intra else []) + (["t_cross"] if fit.has_cross else [])
    )
    stored = GenieFit.objects.create(
        workload=workload,
        run=run,
        alpha_s=predictor.alpha,
        beta_s=predictor.beta,
        t_intra_s=predictor.t_intra,
        t_cross_s=predictor.t_cross,
        startup_s=predictor.startup_s,
        r2=fit.r2,  # the filled terms touch no sample: the model's R^2 over its samples is the fit's
        r2_compute=fit.r2_compute,
        samples=[dict(s) for s in samples],
        residuals=residuals,
        measured=measured_terms,
        filled=filled,
    )
    Workload.objects.filter(pk=workload.pk).update(
        genie_alpha_s=predictor.alpha,
        genie_beta_s=predictor.beta,
        genie_t_intra_s=predictor.t_intra,
        genie_t_cross_s=predictor.t_cross,
        genie_startup_s=predictor.startup_s,
        genie_fit_r2=fit.r2,
    )
    logger.info(
        "GENIE fit of %s: alpha %.4g s, beta %.4g s, t_intra %.4g s, t_o %.4g s, start-up %.3g s, R2 %.4f%s",
        workload.name,
        predictor.alpha,
        predictor.beta,
        predictor.t_intra,
        predictor.t_cross,
        predictor.startup_s,
        fit.r2,
        "; " + "; ".join(filled.values()) if filled else "",
    )
    return stored


def _reported(run: ProfilingRun, key: str, *, single_gpu_only: bool) -> list[float]:
    single = {c["key"] for c in run.configs if c["num_servers"] == 1 and c["gpus_per_server"] == 1}
    return [
        float(p[key])
        for p in run.measured_points
        if isinstance(p.get(key), int | float) and (not single_gpu_only or p["config"] in single)
    ]


@transaction.atomic
def genie_profiling_run_succeed(*, run: ProfilingRun, now: datetime | None = None) -> GenieFit:
    """Every configuration is measured: store the fit (with its fill-ins), the run becomes SUCCEEDED
    with its costs. Start-up: the median over single-GPU launches of what the workload reported."""
    now = now or timezone.now()
    workload = Workload.objects.select_for_update().get(pk=run.workload_id)
    startups = _reported(run, "startup_s", single_gpu_only=True)
    sizes = _reported(run, "param_bytes", single_gpu_only=False)
    server_nic = float(run.server.nic_gbps) if run.server and run.server.nic_gbps > 0 else 0.0
    nic_gbps = server_nic or genie_profiling_conf().default_nic_gbps
    fit = genie_fit_store(
        workload=workload,
        samples=genie_samples(run),
        unmeasured=run.result.get("unmeasured") or {},
        startup_s=statistics.median(startups) if startups else None,
        param_bytes=max(sizes) if sizes else None,
        nic_gbps=nic_gbps,
        run=run,
    )
    run.status = ProfilingRunStatus.SUCCEEDED
    run.finished_at = now
    run.result = {
        **run.result,
        "fit": fit.pk,
        "alpha_s": fit.alpha_s,
        "beta_s": fit.beta_s,
        "t_intra_s": fit.t_intra_s,
        "t_cross_s": fit.t_cross_s,
        "startup_s": fit.startup_s,
        "r2": fit.r2,
        "measured": fit.measured,
        "filled": fit.filled,
    }
    profiling_run_costs(run, now)
    run.save()
    return fit


def genie_holds_cpus(gpus: int, free_cpus: int, server_cpus: int) -> int:
    """Cores a GENIE run holds for `gpus` GPUs: the GPU-proportional share (the predictor's speed-up
    1.0 point), within what is free and at least one."""
    return max(1, int(min(free_cpus, server_cpus, round(optimistic.FAIR_CPUS_PER_GPU * gpus))))
