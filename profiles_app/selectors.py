"""Every read of workload knowledge; turns catalog rows into the core's SensitivityProfile."""

import json
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any
from uuid import UUID

from cluster_app.models import Server
from cluster_app.selectors import gpus_active
from profiles_app.models import ProfilingRun, ProfilingRunStatus, SpeedObservation, Workload
from scheduler_app.core.types import SensitivityProfile


def workload_profile(workload: Workload) -> SensitivityProfile | None:
    """The core profile of a catalog workload, or None when it has no sensitivity matrix yet.

    Its seconds per iteration are the stored ones divided by the workload's `speed_correction` (GENIE's
    EWMA of measured / predicted speed), so every estimate of time the core makes (SRTF and SWAF keys,
    QoS fits, admission forecasts) learns from finished jobs. Relative speeds (the matrix) are as stored.
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
        iter_time_s=workload.estimated_iter_time_s,
        placement_penalty=workload.placement_penalty,
    )


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


def profiling_holds() -> list[ProfilingHold]:
    """The resources every RUNNING profiling run holds."""
    return [
        ProfilingHold(run_id, server_id, tuple(int(i) for i in indices or ()), cpus, mem_gb)
        for run_id, server_id, indices, cpus, mem_gb in ProfilingRun.objects.filter(
            status=ProfilingRunStatus.RUNNING, server__isnull=False
        ).values_list("id", "server_id", "gpu_indices", "num_cpus", "mem_gb")
    ]


def profiling_runs_of_server(*, server: Server, lease_ids: Iterable[UUID]) -> dict[UUID, ProfilingRun]:
    """lease id -> profiling run, for the runs of `server` among `lease_ids` (any status)."""
    ids = set(lease_ids)
    if not ids:
        return {}
    return {r.lease_id: r for r in ProfilingRun.objects.filter(server=server, lease_id__in=ids)}


def profiling_commands(*, server: Server) -> list[dict[str, Any]]:
    """The `profile` command of every RUNNING profiling run on `server` (docs/profiling.md)."""
    runs = list(
        ProfilingRun.objects.filter(server=server, status=ProfilingRunStatus.RUNNING)
        .select_related("workload")
        .order_by("id")
    )
    if not runs:
        return []
    uuids = {index: uuid for _gpu, _server, index, uuid in gpus_active(server_ids=[server.pk])}
    commands = []
    for run in runs:
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


# ---------------------------------------------------------------------------------------------------
# Speed observations
# ---------------------------------------------------------------------------------------------------


def speed_observations_by_allocation(*, allocation_ids: Iterable[int]) -> dict[int, SpeedObservation]:
    """Allocation id -> its predicted-versus-measured speed row, in one query (absent: none reported)."""
    ids = set(allocation_ids)
    if not ids:
        return {}
    return {o.allocation_id: o for o in SpeedObservation.objects.filter(allocation_id__in=ids)}
