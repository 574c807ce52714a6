"""Lease shim: runs one job command as its account, outlives agent restarts and writes the job's exit status.

Run by the launcher as a script, standard library only:
`python -I .../agent/shim.py --status F [--cpus 0,1] [--mem-bytes N] [--env-file F] [--user NAME]
[--workdir DIR] [--stdout PATH] [--stderr PATH] [--renewal-file F] -- argv`. Like containerd's shim, it
exists so that the job does not have to be the agent's child: an agent that restarts adopts the running
shim by pid and, when the shim is gone, still learns how the job ended from the status file. Like Slurm's
slurmstepd, it stays with the agent's identity (root, on a real node) to write that file, and starts the
job as its owner's account. It also applies the isolation that cannot be done in the agent (a
multi-threaded process must not run Python code between fork and exec), and it reports the job's peak
RSS for OOM detection.

It is the fence of last resort (docs/faults.md, "Fencing"): the agent writes the lease's renewal file
after every answered sync; once the renewal is older than the fence, the shim stops the job (SIGTERM to
its process group, SIGKILL after the grace), so a job outlives neither a dead agent nor a node cut off
from the service by more than the fence, and the service may then start it elsewhere.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import pwd
import resource
import select
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

FENCE_CHECK_S = 1.0  # how often the shim looks at the renewal file while the job runs
EXIT_CANNOT_EXECUTE = 126  # the shell's conventions: found but could not run, and not found
EXIT_NOT_FOUND = 127
OUTPUT_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOCTTY


class StartFailure(Exception):
    """The job could not be started; `code` is the exit code to record (126/127)."""

    def __init__(self, message: str, code: int = EXIT_CANNOT_EXECUTE) -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True)
class Identity:
    """The account the job switches to: initgroups semantics (primary gid plus every group of the name)."""

    name: str
    uid: int
    gid: int
    groups: list[int]


def resolve_identity(name: str) -> Identity:
    # Resolved here, before the fork: NSS (LDAP, sssd) must not run in the child between fork and exec.
    try:
        pw = pwd.getpwnam(name)
    except KeyError:
        raise StartFailure(f"no Unix account {name!r} on this node") from None
    if pw.pw_uid == 0:
        raise StartFailure(f"refusing to run a job as root (account {name!r} has uid 0)")
    return Identity(name, pw.pw_uid, pw.pw_gid, os.getgrouplist(name, pw.pw_gid))


def _write_status(path: str, status: dict) -> None:
    # Atomic and durable: the agent may read it after a crash of either process.
    tmp = f"{path}.tmp"
    with open(tmp, "w") as fh:
        json.dump(status, fh)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def _read_env(path: str) -> dict[str, str]:
    """The job's environment, which the agent wrote to a file only it can read (then not needed)."""
    try:
        with open(path) as fh:
            env = json.load(fh)
        os.unlink(path)
    except (OSError, ValueError) as exc:
        raise StartFailure(f"cannot read the job's environment {path!r}: {exc}") from exc
    return {str(k): str(v) for k, v in env.items()}


def _open_output(path: str, fd: int, what: str, who: str) -> None:
    """Open the job's output file as the job's account (its own permissions decide: a root-squashed NFS
    home works, and root's power never creates or appends to a file the account could not) onto `fd`."""
    try:
        opened = os.open(path, OUTPUT_FLAGS, 0o600)
    except OSError as exc:
        raise StartFailure(f"cannot open the {what} file {path!r} as {who}: {exc.strerror}") from exc
    if opened != fd:
        os.dup2(opened, fd)
        os.close(opened)


def child_setup(args: argparse.Namespace, identity: Identity | None) -> None:
    """Everything between fork and exec, in the job's process. Order matters: the rlimit first (any user
    may lower it), then groups, gid and uid (groups and gid need root, so uid last, and after setuid the
    process cannot regain root), then what must happen as the account: umask, chdir, output files."""
    for sig in (signal.SIGPIPE, signal.SIGXFSZ):
        signal.signal(sig, signal.SIG_DFL)  # Python ignores them; an ignored signal survives exec
    if args.mem_bytes > 0:
        # In the job only, so that the shim can still write the status after the job hit its cap.
        resource.setrlimit(resource.RLIMIT_AS, (args.mem_bytes, args.mem_bytes))
    who = "the agent's account"
    if identity is not None:
        who = f"account {identity.name!r}"
        try:
            os.setgroups(identity.groups)
            os.setgid(identity.gid)
            os.setuid(identity.uid)
        except OSError as exc:
            raise StartFailure(f"cannot switch to {who} (uid {identity.uid}): {exc.strerror}") from exc
    os.umask(0o077)  # what the job creates is its owner's alone unless it says otherwise
    if args.workdir:
        try:
            os.chdir(args.workdir)
        except OSError as exc:
            message = f"cannot enter the working directory {args.workdir!r} as {who}: {exc.strerror}"
            raise StartFailure(message) from exc
    if args.stdout:
        _open_output(args.stdout, 1, "stdout", who)
        if not args.stderr:
            os.dup2(1, 2)
    if args.stderr:
        _open_output(args.stderr, 2, "stderr", who)


def spawn(command: list[str], env: dict[str, str] | None, setup: Callable[[], None]) -> int:
    """fork, `setup`, exec; the child's pid. A failure before exec comes back through a close-on-exec pipe
    (EOF means the exec happened) and is raised here as StartFailure with its message."""
    read_end, write_end = os.pipe()  # both close-on-exec (Python's default)
    pid = os.fork()
    if pid == 0:  # the child: never returns
        code, message = EXIT_CANNOT_EXECUTE, "unknown error"
        try:
            os.close(read_end)
            setup()
            if env is None:
                os.execvp(command[0], command)
            os.execvpe(command[0], command, env)
        except StartFailure as exc:
            code, message = exc.code, str(exc)
        except OSError as exc:
            code = EXIT_CANNOT_EXECUTE if isinstance(exc, PermissionError) else EXIT_NOT_FOUND
            message = f"cannot start {command[0]!r}: {exc}"
        except BaseException as exc:  # whatever it is, the parent must hear of it
            message = f"cannot start {command[0]!r}: {exc!r}"
        try:
            os.write(write_end, json.dumps({"code": code, "error": message}).encode())
        finally:
            os._exit(code)
    os.close(write_end)
    chunks = []
    while chunk := os.read(read_end, 65536):
        chunks.append(chunk)
    os.close(read_end)
    if chunks:
        os.waitpid(pid, 0)  # reap the child that reported the failure
        failure = json.loads(b"".join(chunks))
        raise StartFailure(failure["error"], failure["code"])
    return pid


def boot_clock_s() -> float:
    """The node's monotonic clock, counting suspend (CLOCK_BOOTTIME): the same for every process here,
    blind to wall-clock steps. The agent stamps renewals with it (agent/fence.py)."""
    return time.clock_gettime(time.CLOCK_BOOTTIME)


@dataclass(frozen=True)
class Renewal:
    """The lease's last renewal as the agent wrote it: when (boot clock), the fence and its grace."""

    renewed_boot_s: float
    fence_s: float
    grace_s: float

    def expired(self, now_boot_s: float) -> bool:
        return self.fence_s > 0 and now_boot_s - self.renewed_boot_s > self.fence_s


def read_renewal(path: str) -> Renewal | None:
    """The renewal file (atomic JSON, replaced by the agent); None if there is none or it is unreadable."""
    try:
        with open(path) as fh:
            data = json.load(fh)
        return Renewal(float(data["renewed_boot_s"]), float(data["fence_s"]), float(data["grace_s"]))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _group_members(pgid: int) -> list[int]:
    """The pids of the process group `pgid` but this process (from /proc: os.killpg would reach us too)."""
    members = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/stat") as fh:
                stat = fh.read()
        except OSError:
            continue
        # pid (comm) state ppid pgrp ...: comm may hold spaces and parentheses, so split after the last ')'.
        fields = stat[stat.rfind(")") + 2 :].split()
        if len(fields) > 2 and int(fields[2]) == pgid:
            members.append(int(entry))
    return members


class Fence:
    """Stops the job once its renewal is older than the fence: SIGTERM to the group, SIGKILL to every
    member but the shim after the grace. `fenced` says whether it did."""

    def __init__(self, renewal_file: str, clock: Callable[[], float] = boot_clock_s) -> None:
        self.renewal_file = renewal_file
        self.clock = clock
        self.last: Renewal | None = None
        self.fenced = False
        self.kill_at_s: float | None = None

    def check(self, pgid: int) -> None:
        if not self.renewal_file:
            return
        now = self.clock()
        if not self.fenced:
            # A vanished or half-written file keeps the last renewal read: it never extends the lease.
            self.last = read_renewal(self.renewal_file) or self.last
            if self.last is None or not self.last.expired(now):
                return
            self.fenced = True
            self.kill_at_s = now + max(0.0, self.last.grace_s)
            print(
                f"attune-shim: lease not renewed for {now - self.last.renewed_boot_s:.0f} s (fence "
                f"{self.last.fence_s:g} s): SIGTERM, SIGKILL in {self.last.grace_s:g} s",
                file=sys.stderr,
                flush=True,
            )
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pgid, signal.SIGTERM)  # the shim catches it; the job checkpoints
        elif self.kill_at_s is not None and now >= self.kill_at_s:
            self.kill_at_s = None
            for pid in _group_members(pgid):
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)


def wait_fenced(pid: int, fence: Fence) -> tuple[int, resource.struct_rusage]:
    """Wait for the job like os.wait4, checking the fence every FENCE_CHECK_S meanwhile. The wait is on a
    pidfd where the kernel has them (Linux 5.3), so the job's end is seen at once, not at the next check."""
    if not fence.renewal_file:
        _pid, wait_status, usage = os.wait4(pid, 0)  # retried on EINTR (PEP 475)
        return wait_status, usage
    try:
        poller: select.poll | None = select.poll()
        pidfd = os.pidfd_open(pid)
        poller.register(pidfd, select.POLLIN)
    except (AttributeError, OSError):
        poller = None
    while True:
        waited, wait_status, usage = os.wait4(pid, os.WNOHANG)
        if waited == pid:
            if poller is not None:
                os.close(pidfd)
            return wait_status, usage
        fence.check(os.getpgid(0))
        timeout_s = FENCE_CHECK_S if fence.kill_at_s is None else min(FENCE_CHECK_S, 0.2)
        if poller is not None:
            poller.poll(timeout_s * 1000)
        else:
            time.sleep(timeout_s)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="attune-shim")
    parser.add_argument("--status", required=True, help="where to write the exit status (JSON)")
    parser.add_argument("--cpus", default="", help="comma list of CPU ids to pin to")
    parser.add_argument("--mem-bytes", type=int, default=0, help="RLIMIT_AS for the job (0: none)")
    parser.add_argument("--env-file", default="", help="the job's environment (JSON); default: the shim's")
    parser.add_argument("--user", default="", help="run the job as this account (needs root)")
    parser.add_argument("--workdir", default="", help="the job's working directory")
    parser.add_argument("--stdout", default="", help="the job's stdout file (default: the shim's stdout)")
    parser.add_argument("--stderr", default="", help="the job's stderr file (default: with stdout)")
    parser.add_argument("--renewal-file", default="", help="the lease's renewal (JSON); none: no fence")
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("no command given")
    os.umask(0o077)  # the status file is the agent's alone

    # The agent signals the whole process group, so the job receives SIGTERM directly. The shim must
    # outlive the job to record its status: it catches (not ignores: an ignored disposition would be
    # inherited by the job through exec, a caught one is reset to the default) the polite signals.
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, lambda _signum, _frame: None)

    if args.cpus:
        # Inherited by the job and everything it forks.
        os.sched_setaffinity(0, {int(c) for c in args.cpus.split(",")})

    try:
        env = _read_env(args.env_file) if args.env_file else None
        identity = resolve_identity(args.user) if args.user else None
        # The shim has one thread, so running Python code between fork and exec is safe here.
        pid = spawn(command, env, lambda: child_setup(args, identity))
    except StartFailure as exc:
        # Into the lease's log (the shim's stdout/stderr are the agent's log file, shipped as `log`
        # reports) and the status (the `exited` report's error, shown to the job's owner).
        error = f"start failed: {exc}"
        print(f"attune-shim: {error}", file=sys.stderr, flush=True)
        _write_status(args.status, {"exit_code": exc.code, "signal": None, "peak_rss_kb": 0, "error": error})
        return exc.code

    fence = Fence(args.renewal_file)
    wait_status, usage = wait_fenced(pid, fence)
    if os.WIFSIGNALED(wait_status):
        exit_code, signum = None, os.WTERMSIG(wait_status)
    else:
        exit_code, signum = os.WEXITSTATUS(wait_status), None
    status = {"exit_code": exit_code, "signal": signum, "peak_rss_kb": usage.ru_maxrss}
    if fence.fenced:
        status["fenced"] = True
    _write_status(args.status, status)
    return exit_code if exit_code is not None else 128 + signum


if __name__ == "__main__":
    sys.exit(main())
