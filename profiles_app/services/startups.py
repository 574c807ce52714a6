"""Start-up learning: measured start-ups folded into their workloads' start-up times."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from django.db.models import F, FloatField, Value
from django.db.models.functions import Cast

from profiles_app.models import Workload


@dataclass(frozen=True)
class StartupMeasurement:
    """A lease's measured start-up (launch to first progress, in the workload's own time)."""

    workload_id: int
    startup_s: float


def workload_startups_learn(measurements: Sequence[StartupMeasurement]) -> int:
    """Fold measured start-ups into their workloads' `startup_s`: the running mean over the measured
    leases (`startup_leases` counts them; the first replaces the profile default). One atomic UPDATE per
    workload measured in the batch (a lease measures once, so batches hold few); returns the workloads
    updated."""
    sums: dict[int, list[float]] = {}
    for m in measurements:
        total = sums.setdefault(m.workload_id, [0.0, 0.0])
        total[0] += m.startup_s
        total[1] += 1
    for workload_id, (total_s, count) in sorted(sums.items()):
        # In the statement, not read-modify-write: two appliers measuring the same workload both count.
        leases = Cast(F("startup_leases"), FloatField())
        Workload.objects.filter(pk=workload_id).update(
            startup_s=(F("startup_s") * leases + Value(total_s)) / (leases + Value(count)),
            startup_leases=F("startup_leases") + int(count),
        )
    return len(sums)
