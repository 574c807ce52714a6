"""A lease's running process, started by this agent or adopted from an earlier run: its identity, its
process group, its exit status once it has ended."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from abc import ABC, abstractmethod
from pathlib import Path

from agent.exit_status import ExitStatus, read_exit_status


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
