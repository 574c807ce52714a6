"""Every state change of workload knowledge: loading the catalog, recording profiles."""

from django.db import transaction

from profiles_app.catalog import DEFAULT_PROFILE_SET, load_catalog
from profiles_app.models import Workload

CATALOG_SOURCE = "msr-fiddle/synergy simulator model profiles (MIT licence)"


@transaction.atomic
def workload_catalog_load(*, profile_set: str = DEFAULT_PROFILE_SET) -> int:
    """Create or update a Workload row for every model of the shipped catalog; returns the count."""
    catalog = load_catalog(profile_set)
    for name, profile in catalog.items():
        Workload.objects.update_or_create(
            name=name,
            defaults={
                "workload_class": profile.workload_class,
                "source": CATALOG_SOURCE,
                "iter_time_s": profile.iter_time_s,
                "cpu_per_gpu_grid": list(profile.cpu_per_gpu_grid),
                "mem_gb_per_gpu_grid": list(profile.mem_gb_per_gpu_grid),
                "tput_matrix": [list(row) for row in profile.tput],
                "best_cpus_per_gpu": profile.best_cpus_per_gpu,
                "best_mem_gb_per_gpu": profile.best_mem_gb_per_gpu,
                "speedup": profile.speedup,
                "placement_penalty": profile.placement_penalty,
            },
        )
    return len(catalog)
