"""Launching leases as real processes: isolation (systemd-run or affinity+rlimit), the job's identity and
environment, the shim's command line."""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
import sysconfig
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from agent.accounts import (
    DEFAULT_JOB_PATH,
    PRIVATE_DIR_MODE,
    TRAVERSE_ONLY_MODE,
    Account,
    clean_env,
    give_to,
    make_private_dir,
    own_account,
)
from agent.host import real_cpu_ids
from agent.launch_spec import LaunchSpec
from agent.lease_process import AdoptedProcess, ChildProcess, LeaseProcess
from agent.lease_resources import resources_write

log = logging.getLogger(__name__)

ISOLATION_SYSTEMD = "systemd-run"
ISOLATION_AFFINITY = "affinity+rlimit"
ISOLATION_MODES = (ISOLATION_SYSTEMD, ISOLATION_AFFINITY)

SHIM_PATH = Path(__file__).resolve().parent / "shim.py"
AGENT_ROOT = Path(__file__).resolve().parent.parent  # the directory holding the `agent` package


class Launcher(Protocol):
    """Starts leases and re-attaches to the ones an earlier run of the agent left running."""

    isolation: str

    def launch(self, spec: LaunchSpec) -> tuple[LeaseProcess, dict[str, Any]]:
        """Start the lease; returns its process and the facts for the `started` report."""
        ...

    def adopt(self, pid: int, start_ticks: int | None, status_path: Path) -> LeaseProcess: ...

    def map_cpus(self, cpus: Sequence[int]) -> list[int]:
        """The real cores that logical cores `cpus` run on (for a resize: agent/resize.py)."""
        ...


def systemd_run_unavailable_reason() -> str | None:
    """None when `systemd-run --scope` can pin cores and cap memory here; else why not."""
    if not Path("/sys/fs/cgroup/cgroup.controllers").exists():
        return "the cgroup v2 unified hierarchy is not mounted at /sys/fs/cgroup"
    exe = shutil.which("systemd-run")
    if exe is None:
        return "systemd-run is not installed"
    probe = [
        exe,
        *(["--user"] if os.geteuid() != 0 else []),
        "--scope",
        "--quiet",
        "--collect",
        "-p",
        f"AllowedCPUs={real_cpu_ids()[0]}",
        "-p",
        "MemoryMax=64M",
        "true",
    ]
    try:
        result = subprocess.run(probe, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"systemd-run failed: {exc}"
    if result.returncode != 0:
        return f"systemd-run failed: {result.stderr.strip() or result.returncode}"
    return None


def choose_isolation(requested: str = "auto") -> str:
    """The isolation mode: systemd-run where it works (or when forced), else affinity+rlimit."""
    if requested in ISOLATION_MODES:
        return requested
    if requested != "auto":
        raise ValueError(f"unknown isolation mode {requested!r}; valid: auto, {', '.join(ISOLATION_MODES)}")
    reason = systemd_run_unavailable_reason()
    if reason is None:
        return ISOLATION_SYSTEMD
    log.info("isolation: %s (systemd-run unavailable: %s)", ISOLATION_AFFINITY, reason)
    return ISOLATION_AFFINITY


# What the shim process itself may inherit from the agent. The shim runs as root before it drops to the
# job's account, so nothing the job's owner chose (LD_PRELOAD, PYTHONPATH...) may reach it: the job's
# environment travels in a root-only file instead. `systemd-run --user` needs the session bus variables.
SHIM_ENV_PASSTHROUGH = ("XDG_RUNTIME_DIR", "DBUS_SESSION_BUS_ADDRESS")
SHIM_PATH_DEFAULT = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def _write_private(path: Path, data: bytes, mode: int = 0o600) -> None:
    """Write a file only its owner can read (created with `mode`, never briefly world-readable)."""
    path.unlink(missing_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode)
    with os.fdopen(fd, "wb") as fh:
        fh.write(data)


@dataclass
class ProcessLauncher:
    """Starts each lease as `[systemd-run --scope ...] python -I shim.py ... -- argv` in a new session.

    The shim starts as the agent's user and drops to the job's account (spec.account) itself, just before
    exec, so that it can still write the exit status into the agent's lease directory. The job gets a
    clean environment (login variables from the passwd entry, `job_path`, the command's env and the
    lease variables), nothing of the agent's own.

    Fake-host mode (the one mock at the edge of what a small test box lacks): when the agent reports more
    cores than the machine has (--fake-cpus), logical core i runs on real core real_cpus[i mod len], and
    a job whose cores collapse onto fewer real ones gets ATTUNE_CPUS_GRANTED=<num_cpus> so the synthetic
    workload knows what it was granted. On a real node the variable is never set and the workload
    reads its own affinity.
    """

    isolation: str = ISOLATION_AFFINITY
    real_cpus: list[int] = field(default_factory=real_cpu_ids)
    python: str = sys.executable
    job_path: str = DEFAULT_JOB_PATH
    # The interpreter of the shipped workloads, run as the job account: the agent's own unless it sits
    # where that account cannot reach it (a venv built from an interpreter under /root).
    workload_python: str | None = None

    def map_cpus(self, cpus: Sequence[int]) -> list[int]:
        return sorted({self.real_cpus[c % len(self.real_cpus)] for c in cpus})

    def build_env(self, spec: LaunchSpec, real_cpus: Sequence[int]) -> dict[str, str]:
        # Built from nothing: the agent's environment holds its token and settings, none of the job's
        # business. The command's env comes next, then the lease's variables (which win: they are the
        # agent's contract with the job).
        env = clean_env(spec.account or own_account(), path=self.job_path)
        env.update(spec.env)
        env.update(
            {
                "CUDA_VISIBLE_DEVICES": ",".join(spec.gpu_uuids),
                "ATTUNE_LEASE_ID": spec.lease_id,
                "ATTUNE_RESUME_ITERS": str(spec.resume_iters),
                "ATTUNE_CHECKPOINT_PATH": str(spec.checkpoint_path),
                "ATTUNE_CHECKPOINT_DIR": str(spec.checkpoint_path.parent),
                "ATTUNE_PROGRESS_PATH": str(spec.progress_path),
                "ATTUNE_TIME_SCALE": repr(spec.time_scale),
                "ATTUNE_MEM_GB": repr(spec.mem_gb),
                "ATTUNE_RESOURCES_FILE": str(spec.resources_path),
            }
        )
        if spec.job_id is not None:
            env["ATTUNE_JOB_ID"] = str(spec.job_id)
        else:
            env.pop("ATTUNE_JOB_ID", None)
        if len(real_cpus) < len(spec.cpus):
            env["ATTUNE_CPUS_GRANTED"] = str(len(spec.cpus))
        return env

    def job_argv(self, spec: LaunchSpec, env: dict[str, str]) -> list[str]:
        """The job's own command line (what the shim execs)."""
        if spec.script is not None:
            return ["bash", str(spec.script_path)]
        argv = list(spec.argv)
        if argv[:2] in (["python", "-m"], ["python3", "-m"]) and argv[2:3] and argv[2].startswith("agent."):
            # The workloads that ship with the agent (agent.workload, agent.torch_workload): run them with
            # the agent's interpreter and make the package importable from the lease's working directory.
            # The job's account must be able to read both (true of a system-wide install).
            argv[0] = self.workload_python or self.python
            paths = [env.get("PYTHONPATH"), str(AGENT_ROOT)]
            if self.workload_python:
                # Another interpreter of the same version: the agent's packages (numpy, torch) are still
                # the ones to import.
                paths.append(sysconfig.get_paths()["purelib"])
            env["PYTHONPATH"] = os.pathsep.join(p for p in paths if p)
        return argv

    def shim_args(self, spec: LaunchSpec, cpu_list: str) -> list[str]:
        # -I (isolated): the shim, possibly root, ignores PYTHON* variables and the user site directory.
        shim = [self.python, "-I", str(SHIM_PATH), "--status", str(spec.status_path), "--cpus", cpu_list]
        shim += ["--env-file", str(spec.env_path), "--workdir", str(spec.cwd)]
        if spec.renewal_path.exists():  # written by the lease manager before a lease's launch
            shim += ["--renewal-file", str(spec.renewal_path)]
        if spec.account is not None and spec.account.uid != os.geteuid():
            shim += ["--user", spec.account.name]
        if spec.stdout_file is not None:
            shim += ["--stdout", str(spec.stdout_file)]
        if spec.stderr_file is not None:
            shim += ["--stderr", str(spec.stderr_file)]
        return shim

    def build_argv(self, spec: LaunchSpec, real_cpus: Sequence[int], env: dict[str, str]) -> list[str]:
        argv = self.job_argv(spec, env)
        cpu_list = ",".join(str(c) for c in real_cpus)
        shim = self.shim_args(spec, cpu_list)
        if self.isolation == ISOLATION_SYSTEMD:
            # cgroup v2 does the pinning and the cap (RSS, not address space): no rlimit in the shim.
            # `--scope` makes systemd-run exec the shim in place, so the shim keeps the pid we track.
            return [
                "systemd-run",
                *(["--user"] if os.geteuid() != 0 else []),
                "--scope",
                "--quiet",
                "--collect",
                f"--unit=attune-lease-{spec.lease_id}",
                "-p",
                f"AllowedCPUs={cpu_list}",
                "-p",
                f"MemoryMax={spec.mem_cap_bytes}",
                "--",
                *shim,
                "--",
                *argv,
            ]
        # RLIMIT_AS caps address space, a coarse stand-in for memory (CUDA reserves large address ranges,
        # so GPU nodes should run in systemd-run mode).
        return [*shim, "--mem-bytes", str(spec.mem_cap_bytes), "--", *argv]

    def shim_env(self) -> dict[str, str]:
        env = {"PATH": os.environ.get("PATH") or SHIM_PATH_DEFAULT, "LANG": "C.UTF-8"}
        env.update({k: os.environ[k] for k in SHIM_ENV_PASSTHROUGH if k in os.environ})
        return env

    def prepare_dirs(self, spec: LaunchSpec, account: Account) -> None:
        """The lease directory (the agent's: traversable, not listable), the job's own directory inside it
        (progress file, script) and the job's private checkpoint directory."""
        spec.lease_dir.mkdir(parents=True, exist_ok=True)
        os.chmod(spec.lease_dir, TRAVERSE_ONLY_MODE)
        spec.status_path.unlink(missing_ok=True)
        spec.job_dir.mkdir(exist_ok=True)
        if spec.script is not None:
            # Written before the directory is handed over, so the account never sees a half-written file;
            # 0500: the job may run it, and its owner could change it anyway.
            _write_private(spec.script_path, spec.script.encode(), 0o500)
            give_to(spec.script_path, account, 0o500)
        if spec.job_dir != spec.lease_dir:
            give_to(spec.job_dir, account, PRIVATE_DIR_MODE)
        make_private_dir(spec.checkpoint_path.parent, account)

    def launch(self, spec: LaunchSpec) -> tuple[LeaseProcess, dict[str, Any]]:
        if not spec.argv and spec.script is None:
            raise ValueError("empty argv")
        account = spec.account or own_account()
        self.prepare_dirs(spec, account)
        real_cpus = self.map_cpus(spec.cpus)
        env = self.build_env(spec, real_cpus)
        argv = self.build_argv(spec, real_cpus, env)
        # The job's environment goes to the shim in a file only the agent's user can read, never through
        # the shim's own environment (see SHIM_ENV_PASSTHROUGH) or its command line (world-readable).
        _write_private(spec.env_path, json.dumps(env).encode())
        resources_write(spec.resources_path, cpus=len(spec.cpus), real_cpus=real_cpus, mem_gb=spec.mem_gb)
        log_fd = os.open(spec.log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o600)
        with os.fdopen(log_fd, "ab") as log_file:
            os.fchmod(log_fd, 0o600)  # an older agent created it world-readable
            popen = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=log_file,
                stderr=subprocess.STDOUT,
                cwd=spec.lease_dir,
                env=self.shim_env(),
                close_fds=True,
                # setsid in the child (done in C, safe in a threaded agent): the lease gets its own
                # session and process group, so group signals reach all of the job and never the agent,
                # and a Ctrl-C or hangup aimed at the agent does not reach the jobs.
                start_new_session=True,
            )
        facts = {
            "pid": popen.pid,
            "isolation": self.isolation,
            "cpus": list(spec.cpus),
            "real_cpus": real_cpus,
            "mem_gb": spec.mem_gb,
            "gpu_uuids": list(spec.gpu_uuids),
            "user": account.name,
            "uid": account.uid,
        }
        return ChildProcess(popen, spec.status_path), facts

    def adopt(self, pid: int, start_ticks: int | None, status_path: Path) -> LeaseProcess:
        return AdoptedProcess(pid, start_ticks, status_path)
