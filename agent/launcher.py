"""Launching leases as real processes: identity, isolation (systemd-run or affinity+rlimit), exit status."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import sysconfig
from abc import ABC, abstractmethod
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
from agent.host import BYTES_PER_GB, real_cpu_ids
from agent.lease_resources import RESOURCES_FILE_NAME, resources_write

log = logging.getLogger(__name__)

ISOLATION_SYSTEMD = "systemd-run"
ISOLATION_AFFINITY = "affinity+rlimit"
ISOLATION_MODES = (ISOLATION_SYSTEMD, ISOLATION_AFFINITY)

SHIM_PATH = Path(__file__).resolve().parent / "shim.py"
AGENT_ROOT = Path(__file__).resolve().parent.parent  # the directory holding the `agent` package

# Exit code 137 (128 + SIGKILL) is what shells and container runtimes report for an OOM-killed process;
# a job the agent did not stop that exits with it is classified OOM (agent.workload uses it on MemoryError).
OOM_EXIT_CODE = 137
# A job killed by SIGKILL that the agent did not send counts as OOM when its peak RSS reached this
# fraction of its memory cap (the kernel's OOM killer picks the biggest process).
OOM_NEAR_CAP_FRACTION = 0.9


@dataclass(frozen=True, slots=True)
class LaunchSpec:
    """Everything needed to start one lease. `cpus` are the agent's logical core ids (0..num_cpus-1).

    `account` is who the job runs as (None: the agent's own identity, no switch). `workdir` "" is the
    job directory; `stdout_path`/`stderr_path` "" mean the shim's log and "merged into stdout", relative
    ones are relative to the working directory. With `script`, the job is `bash <script file>` and
    `argv` is not used. Layout of `lease_dir`: the shim's log, status and the job's environment, root's
    alone; `job/` (the job's own, 0700: progress file, script). `job_subdir` is False only for leases
    started by an agent from before that layout (their progress file is in `lease_dir` itself).
    """

    lease_id: str
    job_id: int | None
    argv: tuple[str, ...]
    env: dict[str, str]
    gpu_uuids: tuple[str, ...]
    cpus: tuple[int, ...]
    mem_gb: float
    resume_iters: int
    lease_dir: Path
    checkpoint_path: Path
    time_scale: float = 1.0
    account: Account | None = None
    workdir: str = ""
    script: str | None = None
    stdout_path: str = ""
    stderr_path: str = ""
    job_subdir: bool = True

    @property
    def log_path(self) -> Path:
        return self.lease_dir / "output.log"

    @property
    def status_path(self) -> Path:
        return self.lease_dir / "exit-status.json"

    @property
    def renewal_path(self) -> Path:
        """The lease's last renewal (agent/fence.py), which its shim enforces."""
        return self.lease_dir / "renewal.json"

    @property
    def env_path(self) -> Path:
        return self.lease_dir / "job-env.json"

    @property
    def resources_path(self) -> Path:
        """What the job holds now (agent/lease_resources.py), rewritten when the lease is resized."""
        return self.lease_dir / RESOURCES_FILE_NAME

    @property
    def job_dir(self) -> Path:
        return self.lease_dir / "job" if self.job_subdir else self.lease_dir

    @property
    def progress_path(self) -> Path:
        return self.job_dir / "progress.json"

    @property
    def script_path(self) -> Path:
        return self.job_dir / "batch-script"

    @property
    def cwd(self) -> Path:
        return self.job_dir / self.workdir if self.workdir else self.job_dir  # an absolute workdir wins

    @property
    def stdout_file(self) -> Path | None:
        return self.cwd / self.stdout_path if self.stdout_path else None

    @property
    def stderr_file(self) -> Path | None:
        """The job's separate stderr file; None when stderr goes with stdout."""
        path = self.cwd / self.stderr_path if self.stderr_path else None
        return None if path == self.stdout_file else path

    @property
    def job_output_files(self) -> tuple[Path, ...]:
        """Files the job itself opened for its output (owned by its account)."""
        return tuple(p for p in (self.stdout_file, self.stderr_file) if p is not None)

    @property
    def job_uid(self) -> int:
        return self.account.uid if self.account is not None else os.geteuid()

    @property
    def mem_cap_bytes(self) -> int:
        return int(self.mem_gb * BYTES_PER_GB)


@dataclass(frozen=True, slots=True)
class ExitStatus:
    """How a lease's process ended: an exit code or a signal number; `error` when it never ran or was lost."""

    exit_code: int | None
    signal: int | None
    peak_rss_kb: int | None = None
    error: str | None = None
    fenced: bool = False  # the shim stopped the job: its lease went unrenewed past the fence


def classify_oom(
    status: ExitStatus,
    *,
    stop_requested: bool,
    mem_cap_bytes: int,
    log_tail: Sequence[str] = (),
    cgroup_oom_kills: int = 0,
) -> bool:
    """Did the job die of memory exhaustion? Pure, so that each rule is tested on its own.

    - the cgroup recorded an OOM kill (systemd-run mode);
    - it failed with a Python MemoryError in its last log lines (RLIMIT_AS makes allocations fail);
    - it exited with OOM_EXIT_CODE, or died of a SIGKILL that the agent did not send while its peak RSS
      was near its cap. When the agent itself stopped the job, SIGKILL/137 are the agent's doing.
    """
    if cgroup_oom_kills > 0:
        return True
    if status.exit_code not in (None, 0) and any("MemoryError" in line for line in log_tail[-20:]):
        return True
    if stop_requested:
        return False
    if status.exit_code == OOM_EXIT_CODE:
        return True
    if status.signal == signal.SIGKILL and status.peak_rss_kb and mem_cap_bytes > 0:
        return status.peak_rss_kb * 1024 >= OOM_NEAR_CAP_FRACTION * mem_cap_bytes
    return False


def read_exit_status(path: Path) -> ExitStatus | None:
    """The status the shim wrote, or None when there is none (the shim was killed or never ran)."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return ExitStatus(
        data.get("exit_code"),
        data.get("signal"),
        data.get("peak_rss_kb"),
        data.get("error"),
        fenced=bool(data.get("fenced")),
    )


def proc_start_ticks(pid: int) -> int | None:
    """The process's start time in clock ticks since boot (with the pid, a unique process identity)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2 :].split()  # the command name may contain spaces and parentheses
    if fields[0] == "Z":  # a zombie has ended; only its parent's wait is missing
        return None
    return int(fields[19])


def _signal_group(pgid: int, signum: int) -> None:
    # The lease runs in its own session and process group (start_new_session), so a group signal reaches
    # the job and everything it forked, and never the agent.
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signum)


class LeaseProcess(ABC):
    """A running lease: its shim is the leader of the lease's process group (pgid == pid)."""

    def __init__(self, pid: int, start_ticks: int | None, status_path: Path) -> None:
        self.pid = pid
        self.start_ticks = start_ticks
        self.status_path = status_path
        self._cgroup_events: Path | None = None
        self._oom_kills = 0

    def signal_group(self, signum: int) -> None:
        _signal_group(self.pid, signum)

    @abstractmethod
    def exited(self) -> ExitStatus | None:
        """Non-blocking: None while the shim runs; once it has ended, its status (group stragglers killed)."""

    def cgroup_oom_kills(self) -> int:
        """OOM kills recorded by the lease's cgroup v2 (0 outside systemd-run mode); remembers the maximum.

        Read while the lease runs, since a scope's cgroup disappears with its last process.
        """
        if self._cgroup_events is None:
            try:
                line = Path(f"/proc/{self.pid}/cgroup").read_text().splitlines()[0]
            except (OSError, IndexError):
                return self._oom_kills
            if not line.startswith("0::"):
                return self._oom_kills
            self._cgroup_events = Path("/sys/fs/cgroup") / line[3:].lstrip("/") / "memory.events"
        try:
            for entry in self._cgroup_events.read_text().splitlines():
                key, _, value = entry.partition(" ")
                if key == "oom_kill":
                    self._oom_kills = max(self._oom_kills, int(value))
        except (OSError, ValueError):
            pass
        return self._oom_kills


class ChildProcess(LeaseProcess):
    """A shim this agent started (its child)."""

    def __init__(self, popen: subprocess.Popen, status_path: Path) -> None:
        super().__init__(popen.pid, proc_start_ticks(popen.pid), status_path)
        self.popen = popen
        self._status: ExitStatus | None = None

    def exited(self) -> ExitStatus | None:
        if self._status is not None:
            return self._status
        try:
            # WNOWAIT: look without reaping. While the leader is an unreaped zombie its pid, and so the
            # pgid, cannot be reused, which makes the straggler kill below safe.
            info = os.waitid(os.P_PID, self.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:
            info = True  # already reaped
        if info is None:
            return None
        # Processes the job forked and left behind would keep its GPUs busy: end them with the job.
        _signal_group(self.pid, signal.SIGKILL)
        returncode = self.popen.wait()
        status = read_exit_status(self.status_path)
        if status is None:  # the shim itself died (SIGKILL from us or the OOM killer)
            status = (
                ExitStatus(None, -returncode)
                if returncode < 0
                else ExitStatus(returncode, None, error="the shim ended without an exit status")
            )
        self._status = status
        return status


class AdoptedProcess(LeaseProcess):
    """A shim started by an earlier run of the agent, found alive at start-up (not our child)."""

    def exited(self) -> ExitStatus | None:
        if self.start_ticks is not None and proc_start_ticks(self.pid) == self.start_ticks:
            return None
        # A zombie re-parented to us (agent running as PID 1 in a container) must be reaped here.
        with contextlib.suppress(ChildProcessError):
            os.waitpid(self.pid, os.WNOHANG)
        # Members left in the group keep the pgid from being reused, so this reaches only them.
        _signal_group(self.pid, signal.SIGKILL)
        status = read_exit_status(self.status_path)
        return status or ExitStatus(
            None, None, error="lost: the job ended while the agent was down and left no exit status"
        )


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
