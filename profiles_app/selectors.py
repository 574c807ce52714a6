"""Every read of workload knowledge; turns catalog rows into the core's SensitivityProfile."""

import json
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any
from uuid import UUID

from django.db.models import F, Q, Sum

from cluster_app.models import Server
from cluster_app.selectors import gpus_active
from profiles_app import optimistic
from profiles_app.conf import genie_profiling_conf
from profiles_app.models import (
    GenieFit,
    ProfilingKind,
    ProfilingRun,
    ProfilingRunStatus,
    SpeedObservation,
    Workload,
)
from scheduler_app.core.interference import communicates
from scheduler_app.core.predictor import Predictor, spread_slowdown
from scheduler_app.core.types import SensitivityProfile


def workload_profile(workload: Workload) -> SensitivityProfile | None:
    """The core profile of a catalog workload, or None when it has no sensitivity matrix yet.

    Its seconds per iteration are `workload_iter_time_s` (GENIE's fitted time on 1 GPU when the
    workload has a fit, the Synergy profile's otherwise) divided by the workload's `speed_correction`
    (GENIE's EWMA of measured / predicted speed), so every estimate of time the core makes (SRTF and
    SWAF keys, QoS fits, admission forecasts) learns from finished jobs. With a fit the profile carries
    the predictor (at the workload's per-GPU batch), so the core times each placement by it
    (throughput.job_profile, placement_slowdown); relative speeds (the matrix) are as stored.
    """
    grid_c = tuple(float(c) for c in workload.cpu_per_gpu_grid or ())
    grid_m = tuple(float(m) for m in workload.mem_gb_per_gpu_grid or ())
    tput = tuple(tuple(float(v) for v in row) for row in workload.tput_matrix or ())
    if not grid_c or not grid_m or len(tput) != len(grid_c) or any(len(r) != len(grid_m) for r in tput):
        return None
    return SensitivityProfile(
        name=workload.name,
        workload_class=workload.workload_class,
        cpu_per_gpu_grid=grid_c,
        mem_gb_per_gpu_grid=grid_m,
        tput=tput,
        best_cpus_per_gpu=workload.best_cpus_per_gpu,
        best_mem_gb_per_gpu=workload.best_mem_gb_per_gpu,
        speedup=workload.speedup,
        iter_time_s=workload_iter_time_s(workload) / workload.speed_correction,
        placement_penalty=workload.placement_penalty,
        predictor=_usable_predictor(workload),
        batch_per_gpu=_fit_batch(workload),
        interference_kappa=workload.interference_kappa,
    )


def _fit_batch(workload: Workload) -> float:
    """The per-GPU batch the workload's jobs run at, as its GENIE profile took it: its own batch size,
    else the profiling default (genie_profiling's reference batch)."""
    return float(workload.batch_size or genie_profiling_conf().default_batch)


def _usable_predictor(workload: Workload) -> Predictor | None:
    """The fitted predictor when it can time this workload's iterations (a positive time on 1 GPU at
    its batch), else None (the core then uses the Synergy profile alone)."""
    predictor = workload_predictor(workload)
    if predictor is None:
        return None
    try:
        ok = predictor.iter_time_s(1, 1, _fit_batch(workload)) > 0
    except ValueError:
        ok = False
    return predictor if ok else None


def workload_iter_time_s(workload: Workload, num_gpus: int = 1) -> float:
    """Seconds per iteration of a job of `num_gpus` GPUs on one server at the GPU-proportional share,
    before the speed correction: GENIE's fitted t(1, k, b) at the workload's batch size when it has a
    usable fit, else the Synergy profile's (one time for any GPU count: Synergy's perfect scaling)."""
    predictor = _usable_predictor(workload)
    if predictor is None:
        return workload.iter_time_s
    return predictor.iter_time_s(1, max(1, num_gpus), _fit_batch(workload))


def workload_interference_factor(workload: Workload, num_gpus: int, colocated_comm_jobs: int) -> float:
    """GENIE's (1 + kappa x) for a job of `num_gpus` GPUs of this workload next to `colocated_comm_jobs`
    other communicating jobs: what core.interference.interference_factor says for its profile."""
    if colocated_comm_jobs <= 0 or workload.interference_kappa <= 0 or not communicates(num_gpus):
        return 1.0
    return 1.0 + workload.interference_kappa * colocated_comm_jobs


def workload_placement_slowdown(workload: Workload, num_gpus: int, num_servers: int) -> float:
    """How many times slower a job of `num_gpus` GPUs runs on `num_servers` servers than on one: the
    fitted predictor's when the workload has a usable fit, else its placement penalty (1 on one server);
    what the core's placement_slowdown says for this workload's profile."""
    if num_servers <= 1:
        return 1.0
    predictor = _usable_predictor(workload)
    if predictor is None:
        return workload.placement_penalty
    return spread_slowdown(predictor, _fit_batch(workload), num_gpus, num_servers)


def workload_predictor(workload: Workload) -> Predictor | None:
    """GENIE's predictor of a workload from its latest stored fit (a GenieFit, copied onto the workload's
    genie_* fields), or None when it has never been fitted. Coefficients are as fitted, in the
    workload's own time at the GPU-proportional CPU/memory share: terms that were not measured hold
    the platform model's value (the fit's `filled` says which); the speed correction is not applied."""
    if workload.genie_alpha_s is None or workload.genie_beta_s is None:
        return None
    return Predictor(
        alpha=workload.genie_alpha_s,
        beta=workload.genie_beta_s,
        t_intra=workload.genie_t_intra_s or 0.0,
        t_cross=workload.genie_t_cross_s or 0.0,
        startup_s=workload.genie_startup_s or 0.0,
    )


def workload_genie_fit(workload: Workload) -> GenieFit | None:
    """The workload's latest stored GENIE fit (samples, residuals, what was filled in), or None."""
    if workload.genie_alpha_s is None:
        return None  # never fitted: spares the query for most of the catalog
    return GenieFit.objects.filter(workload=workload).order_by("-created_at", "-id").first()


def workload_profiles(*, ids: Iterable[int]) -> dict[int, tuple[Workload, SensitivityProfile | None]]:
    """Workload id -> (row, core profile or None), in one query."""
    return {w.id: (w, workload_profile(w)) for w in Workload.objects.filter(id__in=set(ids))}


def workload_profile_json(workload: Workload) -> dict[str, Any]:
    """What a synthetic workload process needs to run at its speed: the profile it emulates.

    A demo/test workload's `ground_truth` is the process's physics (what a real job's code would
    be), so it wins over the profile the scheduler uses; nothing that decides reads it.
    """
    if workload.ground_truth:
        return dict(workload.ground_truth)
    return {
        "iter_time_s": workload.iter_time_s,
        "cpu_per_gpu_grid": list(workload.cpu_per_gpu_grid),
        "mem_gb_per_gpu_grid": list(workload.mem_gb_per_gpu_grid),
        "tput": [list(row) for row in workload.tput_matrix],
    }


def workload_launch(workload: Workload, *, iters: int) -> tuple[list[str], dict[str, str]]:
    """(argv, env) that run `iters` iterations of the workload, for a job lease or a profiling run.

    A workload with its own `argv` gets `--iters N` appended (the contract its command keeps, like the
    reference profiler's `--max-iterations`); otherwise it is the synthetic workload at its profile.
    """
    if workload.argv:
        return [*(str(a) for a in workload.argv), "--iters", str(iters)], {}
    argv = ["python", "-m", "agent.workload", "--model", workload.name, "--iters", str(iters)]
    env = {"ATTUNE_PROFILE_JSON": json.dumps(workload_profile_json(workload), separators=(",", ":"))}
    return argv, env


# ---------------------------------------------------------------------------------------------------
# Profiling runs
# ---------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ProfilingHold:
    """What a running profiling run holds on its server (rounds subtract it)."""

    run_id: int
    server_id: int
    gpu_indices: tuple[int, ...]
    num_cpus: int
    mem_gb: float


_HOLD_FIELDS = (
    *("id", "server_id", "gpu_indices", "num_cpus", "mem_gb"),
    *("peer_server_id", "peer_gpu_indices", "peer_num_cpus", "peer_mem_gb", "peer_released_at"),
)


def profiling_holds() -> list[ProfilingHold]:
    """The resources every RUNNING profiling run holds (a GENIE run's peer server too, until released)."""
    holds = []
    running = ProfilingRun.objects.filter(status=ProfilingRunStatus.RUNNING, server__isnull=False)
    for r in running.values(*_HOLD_FIELDS):
        indices = tuple(int(i) for i in r["gpu_indices"] or ())
        holds.append(ProfilingHold(r["id"], r["server_id"], indices, r["num_cpus"], r["mem_gb"]))
        if r["peer_server_id"] is not None and r["peer_released_at"] is None:
            peer_indices = tuple(int(i) for i in r["peer_gpu_indices"] or ())
            holds.append(
                ProfilingHold(
                    r["id"], r["peer_server_id"], peer_indices, r["peer_num_cpus"], r["peer_mem_gb"]
                )
            )
    return holds


def profiling_runs_of_server(*, server: Server, lease_ids: Iterable[UUID]) -> dict[UUID, ProfilingRun]:
    """lease id -> profiling run, for the runs of `server` among `lease_ids` (any status); a GENIE run
    whose peer `server` is appears under its `peer_lease_id`."""
    ids = set(lease_ids)
    if not ids:
        return {}
    runs = ProfilingRun.objects.filter(
        Q(server=server, lease_id__in=ids) | Q(peer_server=server, peer_lease_id__in=ids)
    )
    return {(r.peer_lease_id if r.peer_server_id == server.pk else r.lease_id): r for r in runs}


def profiling_commands(*, server: Server) -> list[dict[str, Any]]:
    """The `profile` command of every RUNNING profiling run on `server` (docs/profiling.md), and of
    every GENIE run whose peer part still waits on it (docs/genie.md)."""
    runs = list(
        ProfilingRun.objects.filter(
            Q(server=server) | Q(peer_server=server, peer_released_at__isnull=True),
            status=ProfilingRunStatus.RUNNING,
        )
        .select_related("workload", "server")
        .order_by("id")
    )
    if not runs:
        return []
    uuids = {index: uuid for _gpu, _server, index, uuid in gpus_active(server_ids=[server.pk])}
    commands = []
    for run in runs:
        if run.kind == ProfilingKind.GENIE_PREDICTOR:
            commands.append(_genie_command(run, server=server, uuids=uuids))
            continue
        argv, env = workload_launch(run.workload, iters=run.warmup_iters + run.iters_per_point)
        env["ATTUNE_WARMUP_ITERS"] = str(run.warmup_iters)
        commands.append(
            {
                "kind": "profile",
                "lease_id": str(run.lease_id),
                "workload": run.workload.name,
                "argv": argv,
                "env": env,
                "gpu_uuids": [uuids[i] for i in run.gpu_indices if i in uuids],
                "num_cpus": run.num_cpus,
                "mem_gb": run.mem_gb,
                "cpu_counts": list(run.pending_cpus),
                # The first launch of a run warms the caches (dataset, page cache) and is not timed.
                "warmup": not run.measured_points,
                "iters": run.iters_per_point,
                "warmup_iters": run.warmup_iters,
            }
        )
    return commands


# The cross-server configuration's rendezvous port: the top of the rendezvous range, which the round's
# allocator hands out last (docs/genie.md; the synthetic and torch targets do not listen on it).
GENIE_RENDEZVOUS_PORT = 30499


def genie_pending_configs(run: ProfilingRun, *, node_rank: int) -> list[dict[str, Any]]:
    """The configurations that `node_rank`'s server has still to measure, in the run's order."""
    done = {(p["config"], int(p["node_rank"])) for p in run.measured_points}
    return [c for c in run.configs if node_rank < c["num_servers"] and (c["key"], node_rank) not in done]


def _genie_command(run: ProfilingRun, *, server: Server, uuids: dict[int, str]) -> dict[str, Any]:
    """A GENIE run's `profile` command for one of its servers: the configurations it still measures."""
    peer = server.pk != run.server_id
    node_rank = 1 if peer else 0
    indices = run.peer_gpu_indices if peer else run.gpu_indices
    held_cpus = run.peer_num_cpus if peer else run.num_cpus
    argv, env = workload_launch(run.workload, iters=run.warmup_iters + run.iters_per_point)
    env["ATTUNE_WARMUP_ITERS"] = str(run.warmup_iters)
    master = run.server.address or run.server.hostname or run.server.name if run.server else "127.0.0.1"
    configs = []
    for c in genie_pending_configs(run, node_rank=node_rank):
        k, n = c["gpus_per_server"], c["num_servers"]
        config_env = {}
        if n > 1:
            config_env = {
                "NNODES": str(n),
                "NODE_RANK": str(node_rank),
                "WORLD_SIZE": str(n * k),
                "LOCAL_WORLD_SIZE": str(k),
                "MASTER_ADDR": master,
                "MASTER_PORT": str(GENIE_RENDEZVOUS_PORT),
            }
        configs.append(
            {
                "key": c["key"],
                "argv": [*argv, "--batch", str(c["batch"])],
                "env": config_env,
                "gpus": k,
                "num_cpus": max(1, min(held_cpus, round(optimistic.FAIR_CPUS_PER_GPU * k))),
                "batch": c["batch"],
                "num_servers": n,
                "node_rank": node_rank,
            }
        )
    return {
        "kind": "profile",
        "method": "genie",
        "lease_id": str(run.peer_lease_id if peer else run.lease_id),
        "workload": run.workload.name,
        "argv": argv,
        "env": env,
        "gpu_uuids": [uuids[i] for i in indices if i in uuids],
        "num_cpus": held_cpus,
        "mem_gb": run.peer_mem_gb if peer else run.mem_gb,
        "configs": configs,
        "max_s_per_config": run.max_s_per_config,
        "warmup": False,
        "iters": run.iters_per_point,
        "warmup_iters": run.warmup_iters,
    }


# ---------------------------------------------------------------------------------------------------
# Speed observations
# ---------------------------------------------------------------------------------------------------


def speed_observations_by_allocation(*, allocation_ids: Iterable[int]) -> dict[int, SpeedObservation]:
    """Allocation id -> its predicted-versus-measured speed row, in one query (absent: none reported)."""
    ids = set(allocation_ids)
    if not ids:
        return {}
    return {o.allocation_id: o for o in SpeedObservation.objects.filter(allocation_id__in=ids)}


def measured_iters_per_s_by_job(*, job_ids: Iterable[int]) -> dict[int, float]:
    """Job id -> its measured iterations per second over its leases, in one query (absent: no report).

    Each lease's measured speed (the agent's reports, in the workload's own time) weighted by its number
    of reports, as the speed correction weighs them: a minimum-rate job's rate is judged with it.
    """
    ids = set(job_ids)
    if not ids:
        return {}
    rows = (
        SpeedObservation.objects.filter(job_id__in=ids, samples__gt=0)
        .order_by()
        .values("job_id")
        .annotate(weighted=Sum(F("measured_iters_per_s") * F("samples")), reports=Sum("samples"))
    )
    return {r["job_id"]: r["weighted"] / r["reports"] for r in rows if r["reports"]}
