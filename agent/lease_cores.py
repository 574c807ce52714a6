"""A lease's cores: which ones a start takes, and changing a running lease's cores or memory in place
(`resize`); part of the LeaseManager (agent/leases.py), under its lock."""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

from agent.launcher import Launcher
from agent.lease_state import Lease
from agent.profiler import ProfileTask
from agent.resize import lease_resize, resized_cpus
from agent.spool import Spool

log = logging.getLogger(__name__)


class LeaseCores:
    """The cores half of agent/leases.py's LeaseManager, which provides these attributes."""

    leases: dict[str, Lease]
    profiles: dict[str, ProfileTask]
    num_cpus: int
    launcher: Launcher
    spool: Spool

    def _cpu_use(self) -> dict[int, int]:
        use_count = dict.fromkeys(range(self.num_cpus), 0)
        held = [lease.spec.cpus for lease in self.leases.values()]
        held += [task.cpus_held for task in self.profiles.values()]
        for cpus in held:
            for cpu in cpus:
                if cpu in use_count:
                    use_count[cpu] += 1
        return use_count

    def _choose_cpus(self, num_cpus: int) -> tuple[int, ...] | None:
        """Lowest free logical cores; None to wait for a stopping lease's cores; overlap as a last resort."""
        use_count = self._cpu_use()
        free = [cpu for cpu, used in use_count.items() if used == 0]
        if len(free) >= num_cpus:
            return tuple(free[:num_cpus])
        if any(task.process is not None for task in self.profiles.values()):
            return None  # a profiling point ends within minutes and frees its cores
        if any(lease.stop_kind is not None for lease in self.leases.values()):
            return None
        # The service's books say the cores are free but ours do not (a lease it forgot, or an overcommit):
        # share the least used cores rather than refuse the service forever.
        log.warning("only %d free cores for a %d-core lease: sharing cores", len(free), num_cpus)
        by_use = sorted(use_count, key=lambda cpu: (use_count[cpu], cpu))
        return tuple(sorted(by_use[: min(num_cpus, self.num_cpus)]))

    def _size_change(self, command: dict[str, Any]) -> int:
        lease = self.leases.get(str(command["lease_id"]))
        return int(command.get("num_cpus") or 0) - (len(lease.spec.cpus) if lease else 0)

    def _resize(self, command: dict[str, Any]) -> None:
        """Apply a `resize` to a running lease in place: the same process, other cores or memory
        (agent/resize.py). A lease not running here (ended, not yet started) is left to its start."""
        lease = self.leases.get(str(command["lease_id"]))
        try:
            num_cpus, mem_gb = int(command["num_cpus"]), float(command["mem_gb"])
        except (KeyError, TypeError, ValueError):
            log.warning("ignoring malformed resize %r", command)
            return
        if lease is None or lease.stop_kind is not None or num_cpus < 1 or mem_gb <= 0:
            return
        use_count = self._cpu_use()
        for cpu in lease.spec.cpus:
            use_count[cpu] = use_count.get(cpu, 1) - 1  # its own holds do not count
        cpus = resized_cpus(lease.spec.cpus, num_cpus, use_count)
        old = (len(lease.spec.cpus), lease.spec.mem_gb)
        spec = dataclasses.replace(lease.spec, cpus=cpus, mem_gb=mem_gb)
        try:
            done = lease_resize(
                spec,
                shim_pid=lease.process.pid,
                isolation=lease.isolation,
                real_cpus=self.launcher.map_cpus(cpus),
            )
        except Exception:  # never the sync's other commands: the old size stays, the next sync retries
            log.exception("resizing lease %s failed", lease.lease_id)
            return
        lease.spec = spec
        self.spool.lease_update(lease.lease_id, lease.record())
        log.log(
            logging.WARNING if done["errors"] else logging.INFO,
            "resized lease %s in place (pid %d): %d -> %d cores %s, %g -> %g GB; %s",
            lease.lease_id,
            lease.process.pid,
            old[0],
            num_cpus,
            list(cpus),
            old[1],
            mem_gb,
            done,
        )
