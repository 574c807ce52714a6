"""Resizing a running lease in place: new cores and memory applied to the job's processes, and the job told.

A round that keeps a job on its GPUs with other cores or memory does not restart it: the service sends
`resize` (docs/agent-protocol.md) and the agent applies it to every process of the lease's session
(the shim is its leader: start_new_session), in this order:

1. systemd-run isolation: the scope's AllowedCPUs and MemoryMax (`systemctl set-property --runtime`),
   else its cgroup's `cpuset.cpus` and `memory.max` written directly;
2. the CPU affinity of every thread of every process of the session (`sched_setaffinity`);
3. affinity+rlimit isolation: each job process's RLIMIT_AS (`prlimit`; raising a hard limit needs
   root, so an unprivileged agent can only lower it, and says so);
4. the lease's resources file (`ATTUNE_RESOURCES_FILE`, JSON: cpus, core_ids, mem_gb, changed_at) is
   rewritten atomically, and SIGWINCH goes to each process of the session that catches it (its
   handler is its opt-in: a process that does not catch SIGWINCH is not signalled at all, and
   SIGWINCH's default action is to ignore it anyway).

Standard library only, like the rest of the agent's process handling.
"""

from __future__ import annotations

import contextlib
import logging
import os
import resource
import shutil
import signal
import subprocess
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from agent.launch_spec import LaunchSpec
from agent.launcher import ISOLATION_AFFINITY, ISOLATION_SYSTEMD
from agent.lease_resources import resources_write

log = logging.getLogger(__name__)

CGROUP_ROOT = Path("/sys/fs/cgroup")


def resize_supported(isolation: str) -> bool:
    """Whether this agent can resize a running lease live under `isolation` (the `resize` feature it
    registers): always with affinity+rlimit; with systemd-run where systemctl can change the scope."""
    if isolation == ISOLATION_AFFINITY:
        return True
    return isolation == ISOLATION_SYSTEMD and shutil.which("systemctl") is not None


def resized_cpus(current: Sequence[int], num_cpus: int, use_count: dict[int, int]) -> tuple[int, ...]:
    """The lease's logical cores after a resize to `num_cpus`: a shrink keeps its first ones; a growth
    keeps them all and adds the lowest free cores (`use_count`: other holders per core), then the least
    used ones if the node's books disagree with the service's (as a start does, agent/leases.py)."""
    if num_cpus <= len(current):
        return tuple(current[:num_cpus])
    kept = set(current)
    others = sorted(
        (c for c in use_count if c not in kept), key=lambda c: (use_count[c] > 0, use_count[c], c)
    )
    return tuple(sorted([*current, *others[: num_cpus - len(current)]]))


def session_members(sid: int) -> list[int]:
    """The pids of session `sid` (the lease's shim and everything the job started, even in process
    groups of its own), from /proc."""
    members = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2 :].split()  # state ppid pgrp session ...
        if len(fields) > 3 and int(fields[3]) == sid:
            members.append(int(entry))
    return members


def catches(pid: int, signum: int) -> bool:
    """Whether the process has a handler for `signum` (its SigCgt mask in /proc/<pid>/status)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("SigCgt:"):
                return bool(int(line.split()[1], 16) >> (signum - 1) & 1)
    except (OSError, ValueError, IndexError):
        pass
    return False


def _threads(pid: int) -> list[int]:
    try:
        return [int(t) for t in os.listdir(f"/proc/{pid}/task")]
    except OSError:
        return [pid]


def affinity_set(pids: Iterable[int], real_cpus: Sequence[int]) -> tuple[int, list[str]]:
    """Pin every thread of `pids` to `real_cpus`: how many threads were pinned (gone ones are skipped),
    and the errors as text (another account's process for an unprivileged agent)."""
    pinned, errors = 0, []
    for pid in pids:
        for tid in _threads(pid):
            try:
                os.sched_setaffinity(tid, set(real_cpus))
                pinned += 1
            except ProcessLookupError:
                continue
            except OSError as exc:
                errors.append(f"thread {tid}: {exc}")
    return pinned, errors


def rlimit_set(pids: Iterable[int], cap_bytes: int) -> list[str]:
    """RLIMIT_AS = `cap_bytes` on each of `pids`; errors as text. Without CAP_SYS_RESOURCE a hard limit
    cannot be raised: the soft one then goes as high as the hard one allows."""
    errors = []
    for pid in pids:
        try:
            resource.prlimit(pid, resource.RLIMIT_AS, (cap_bytes, cap_bytes))
        except ProcessLookupError:
            continue
        except PermissionError:
            try:
                _soft, hard = resource.prlimit(pid, resource.RLIMIT_AS)
                soft = cap_bytes if hard == resource.RLIM_INFINITY else min(cap_bytes, hard)
                resource.prlimit(pid, resource.RLIMIT_AS, (soft, hard))
                if soft < cap_bytes:
                    errors.append(f"pid {pid}: memory cap kept at {hard} bytes (raising it needs root)")
            except OSError as exc:
                errors.append(f"pid {pid}: {exc}")
    return errors


def cgroup_set(shim_pid: int, unit: str, real_cpus: Sequence[int], cap_bytes: int) -> list[str]:
    """The scope's AllowedCPUs and MemoryMax through systemd, else its cgroup files; errors as text."""
    cpu_list = ",".join(str(c) for c in real_cpus)
    systemctl = shutil.which("systemctl")
    if systemctl is not None:
        argv = [systemctl, *(["--user"] if os.geteuid() != 0 else []), "set-property", "--runtime", unit]
        argv += [f"AllowedCPUs={cpu_list}", f"MemoryMax={cap_bytes}"]
        try:
            result = subprocess.run(argv, capture_output=True, text=True, timeout=10)
            if result.returncode == 0:
                return []
        except (OSError, subprocess.TimeoutExpired):
            pass
    try:
        line = Path(f"/proc/{shim_pid}/cgroup").read_text().splitlines()[0]
    except (OSError, IndexError) as exc:
        return [f"no cgroup for pid {shim_pid}: {exc}"]
    if not line.startswith("0::"):
        return [f"not a cgroup v2 process: {line}"]
    group = CGROUP_ROOT / line[3:].lstrip("/")
    errors = []
    for name, value in (("cpuset.cpus", cpu_list), ("memory.max", str(cap_bytes))):
        try:
            (group / name).write_text(value)
        except OSError as exc:
            errors.append(f"{group / name}: {exc}")
    return errors


def lease_resize(
    spec: LaunchSpec, *, shim_pid: int, isolation: str, real_cpus: Sequence[int]
) -> dict[str, Any]:
    """Apply `spec`'s cores (`real_cpus`: where they run) and memory to the running lease whose shim is
    `shim_pid`, then tell the job. Returns what was done (threads pinned, processes signalled, errors)."""
    errors: list[str] = []
    if isolation == ISOLATION_SYSTEMD:
        errors += cgroup_set(shim_pid, f"attune-lease-{spec.lease_id}.scope", real_cpus, spec.mem_cap_bytes)
    members = session_members(shim_pid)
    pinned, failed = affinity_set(members, real_cpus)
    errors += failed
    if isolation == ISOLATION_AFFINITY:
        # The shim has no cap of its own (it must outlive the job's OOM to write its status).
        errors += rlimit_set([pid for pid in members if pid != shim_pid], spec.mem_cap_bytes)
    resources_write(spec.resources_path, cpus=len(spec.cpus), real_cpus=real_cpus, mem_gb=spec.mem_gb)
    signalled = 0
    for pid in members:
        if pid != shim_pid and catches(pid, signal.SIGWINCH):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGWINCH)
                signalled += 1
    return {"threads_pinned": pinned, "signalled": signalled, "errors": errors}
