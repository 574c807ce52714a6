"""Lease shim: runs one job command, outlives agent restarts and writes the job's exit status to a file.

Run by the launcher as a script (`python .../agent/shim.py --status F [--cpus 0,1] [--mem-bytes N] -- argv`),
standard library only. Like containerd's shim, it exists so that the job does not have to be the agent's
child: an agent that restarts adopts the running shim by pid and, when the shim is gone, still learns how
the job ended from the status file. It also applies the isolation that cannot be done in the agent
(a multi-threaded process must not use preexec_fn), and it reports the job's peak RSS for OOM detection.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import signal
import subprocess
import sys


def _write_status(path: str, status: dict) -> None:
    # Atomic and durable: the agent may read it after a crash of either process.
    tmp = f"{path}.tmp"
    with open(tmp, "w") as fh:
        json.dump(status, fh)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="attune-shim")
    parser.add_argument("--status", required=True, help="where to write the exit status (JSON)")
    parser.add_argument("--cpus", default="", help="comma list of CPU ids to pin to")
    parser.add_argument("--mem-bytes", type=int, default=0, help="RLIMIT_AS for the job (0: none)")
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("no command given")

    # The agent signals the whole process group, so the job receives SIGTERM directly. The shim must
    # outlive the job to record its status: it catches (not ignores: an ignored disposition would be
    # inherited by the job through exec, a caught one is reset to the default) the polite signals.
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, lambda _signum, _frame: None)

    if args.cpus:
        # Inherited by the job and everything it forks.
        os.sched_setaffinity(0, {int(c) for c in args.cpus.split(",")})

    def limit_memory() -> None:
        # In the job only, so that the shim can still write the status after the job hit its cap.
        if args.mem_bytes > 0:
            resource.setrlimit(resource.RLIMIT_AS, (args.mem_bytes, args.mem_bytes))

    try:
        child = subprocess.Popen(command, preexec_fn=limit_memory)  # the shim has one thread: safe here
    except OSError as exc:
        print(f"attune-shim: cannot start {command[0]!r}: {exc}", file=sys.stderr, flush=True)
        code = 126 if isinstance(exc, PermissionError) else 127  # the shell's conventions
        _write_status(
            args.status,
            {
                "exit_code": code,
                "signal": None,
                "peak_rss_kb": 0,
                "error": f"cannot start {command[0]!r}: {exc}",
            },
        )
        return code

    _pid, wait_status, usage = os.wait4(child.pid, 0)  # retried on EINTR (PEP 475)
    if os.WIFSIGNALED(wait_status):
        exit_code, signum = None, os.WTERMSIG(wait_status)
    else:
        exit_code, signum = os.WEXITSTATUS(wait_status), None
    child.returncode = exit_code if exit_code is not None else -signum  # reaped by wait4 above
    _write_status(args.status, {"exit_code": exit_code, "signal": signum, "peak_rss_kb": usage.ru_maxrss})
    return exit_code if exit_code is not None else 128 + signum


if __name__ == "__main__":
    sys.exit(main())
