"""Every read of workload knowledge; turns catalog rows into the core's SensitivityProfile."""

from collections.abc import Iterable
from typing import Any

from profiles_app.models import Workload
from scheduler_app.core.types import SensitivityProfile


def workload_profile(workload: Workload) -> SensitivityProfile | None:
    """The core profile of a catalog workload, or None when it has no sensitivity matrix yet."""
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
        iter_time_s=workload.iter_time_s,
        placement_penalty=workload.placement_penalty,
    )


def workload_profiles(*, ids: Iterable[int]) -> dict[int, tuple[Workload, SensitivityProfile | None]]:
    """Workload id -> (row, core profile or None), in one query."""
    return {w.id: (w, workload_profile(w)) for w in Workload.objects.filter(id__in=set(ids))}


def workload_profile_json(workload: Workload) -> dict[str, Any]:
    """What a synthetic workload process needs to run at the speed its profile predicts."""
    return {
        "iter_time_s": workload.iter_time_s,
        "cpu_per_gpu_grid": list(workload.cpu_per_gpu_grid),
        "mem_gb_per_gpu_grid": list(workload.mem_gb_per_gpu_grid),
        "tput": [list(row) for row in workload.tput_matrix],
    }
