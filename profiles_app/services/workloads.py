"""The workload catalog: the shipped models loaded and kept up to date, and workloads registered here."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from django.db import transaction

from profiles_app import optimistic
from profiles_app.catalog import DEFAULT_PROFILE_SET, batch_size_for, load_catalog
from profiles_app.models import Workload, WorkloadClass

CATALOG_SOURCE = "msr-fiddle/synergy simulator model profiles (MIT licence)"


@dataclass(frozen=True)
class CatalogLoad:
    """What workload_catalog_load did with each model of the shipped catalog."""

    created: int
    updated: int
    unchanged: int
    kept: int  # profiled or registered on this cluster: its own profile is not replaced by the shipped one

    @property
    def total(self) -> int:
        return self.created + self.updated + self.unchanged + self.kept


@transaction.atomic
def workload_catalog_load(*, profile_set: str = DEFAULT_PROFILE_SET) -> CatalogLoad:
    """Create the shipped catalog's missing workloads and bring those it shipped before up to date.

    Idempotent: a row already as shipped is not written at all. A workload whose profile was measured
    here (a profiling run) or that was registered here under a catalog name keeps its own profile, and
    what finished jobs taught (the speed correction, a learnt placement penalty) is never overwritten,
    so a deployment may run this at every start (docker-compose.yml does, after migrate).
    """
    catalog = load_catalog(profile_set)
    # Locked: two containers starting at once (web replicas) update the rows one after the other.
    existing = {w.name: w for w in Workload.objects.select_for_update().filter(name__in=list(catalog))}
    counts = {"created": 0, "updated": 0, "unchanged": 0, "kept": 0}
    for name, profile in catalog.items():
        fields: dict[str, Any] = {
            "workload_class": profile.workload_class,
            "source": CATALOG_SOURCE,
            "iter_time_s": profile.iter_time_s,
            "cpu_per_gpu_grid": list(profile.cpu_per_gpu_grid),
            "mem_gb_per_gpu_grid": list(profile.mem_gb_per_gpu_grid),
            "tput_matrix": [list(row) for row in profile.tput],
            "best_cpus_per_gpu": profile.best_cpus_per_gpu,
            "best_mem_gb_per_gpu": profile.best_mem_gb_per_gpu,
            "speedup": profile.speedup,
            "batch_size": batch_size_for(name, profile_set),  # GENIE's profile and predictor time it
        }
        row = existing.get(name)
        if row is None:
            Workload.objects.create(name=name, placement_penalty=profile.placement_penalty, **fields)
            counts["created"] += 1
            continue
        if row.source != CATALOG_SOURCE:
            counts["kept"] += 1
            continue
        # A penalty learnt on this cluster's network outlives a reload of the shipped one.
        if row.placement_penalty_leases == 0:
            fields["placement_penalty"] = profile.placement_penalty
        changed = [field for field, value in fields.items() if getattr(row, field) != value]
        if not changed:
            counts["unchanged"] += 1
            continue
        for field in changed:
            setattr(row, field, fields[field])
        row.save(update_fields=[*changed, "updated_at"])
        counts["updated"] += 1
    return CatalogLoad(**counts)


@transaction.atomic
def workload_register(
    *,
    name: str,
    argv: Sequence[str] = (),
    workload_class: str = WorkloadClass.OTHER,
    description: str = "",
    dataset_gb: float = 0.0,
    dataset_samples: int = 0,
    batch_size: int = 0,
    ground_truth: Mapping[str, Any] | None = None,
) -> Workload:
    """A workload known by name but not profiled yet (empty matrix): its first job gets it profiled.

    The best case and speed are placeholders (the proportional share, 1 s per iteration) until a
    profiling run stores the measured ones. `ground_truth` is for demos and tests (see Workload).
    """
    return Workload.objects.create(
        name=name,
        argv=[str(a) for a in argv],
        workload_class=workload_class,
        description=description,
        source="registered; not profiled yet",
        dataset_gb=dataset_gb,
        dataset_samples=dataset_samples,
        batch_size=batch_size,
        iter_time_s=1.0,
        cpu_per_gpu_grid=[],
        mem_gb_per_gpu_grid=[],
        tput_matrix=[],
        best_cpus_per_gpu=optimistic.FAIR_CPUS_PER_GPU,
        best_mem_gb_per_gpu=optimistic.FAIR_MEM_GB_PER_GPU,
        speedup=1.0,
        ground_truth=dict(ground_truth or {}),
    )
