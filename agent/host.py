"""Host backends: the node's CPU and memory inventory and usage (psutil), optionally a pretend bigger box."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Protocol

import psutil

# "GB" in Attune means GiB (2**30 bytes), as `free -g` prints; the service and the agent agree on it.
BYTES_PER_GB = 1024**3


@dataclass(frozen=True, slots=True)
class HostInventory:
    """What the node offers the scheduler: CPU cores and memory in GB."""

    num_cpus: int
    mem_gb: float


@dataclass(frozen=True, slots=True)
class HostSample:
    """Node-wide usage at one moment."""

    cpu_util_pct: float
    mem_used_gb: float


class HostBackend(Protocol):
    """Inventory is fixed for the agent's lifetime; `sample()` reads current usage (non-blocking)."""

    def inventory(self) -> HostInventory: ...

    def sample(self) -> HostSample: ...


def real_cpu_ids() -> list[int]:
    """The CPU cores this agent may run jobs on (its own affinity: respects taskset/containers)."""
    return sorted(os.sched_getaffinity(0))


class PsutilHostBackend:
    """Measures the machine with psutil. `report_cpus` / `report_mem_gb` replace the REPORTED inventory.

    The overrides let several agents on one small test box each pretend to be a 24-core, 500 GB server
    (--fake-cpus / --fake-mem-gb); the usage samples are still the real machine's.
    """

    def __init__(self, *, report_cpus: int | None = None, report_mem_gb: float | None = None) -> None:
        self._inventory = HostInventory(
            num_cpus=report_cpus if report_cpus is not None else len(real_cpu_ids()),
            mem_gb=(
                float(report_mem_gb)
                if report_mem_gb is not None
                else round(psutil.virtual_memory().total / BYTES_PER_GB, 1)
            ),
        )
        if self._inventory.num_cpus <= 0 or self._inventory.mem_gb <= 0:
            raise ValueError(f"host inventory must be positive: {self._inventory}")
        psutil.cpu_percent(interval=None)  # the first call only primes the counter (always returns 0.0)

    @property
    def is_fake(self) -> bool:
        return self._inventory.num_cpus != len(real_cpu_ids())

    def inventory(self) -> HostInventory:
        return self._inventory

    def sample(self) -> HostSample:
        memory = psutil.virtual_memory()
        return HostSample(
            cpu_util_pct=float(psutil.cpu_percent(interval=None)),
            mem_used_gb=round((memory.total - memory.available) / BYTES_PER_GB, 3),
        )


class StaticHostBackend:
    """A fixed inventory and a fixed sample, for tests."""

    def __init__(self, inventory: HostInventory, sample: HostSample | None = None) -> None:
        self._inventory = inventory
        self._sample = sample or HostSample(cpu_util_pct=0.0, mem_used_gb=0.0)

    def inventory(self) -> HostInventory:
        return self._inventory

    def sample(self) -> HostSample:
        return self._sample
