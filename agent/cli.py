"""Command line of the node agent: parse options, pick the backends, run until SIGTERM/SIGINT."""

from __future__ import annotations

import argparse
import contextlib
import faulthandler
import logging
import os
import signal
import socket
import sys
from collections.abc import Callable
from pathlib import Path

from agent import __version__
from agent.accounts import (
    DEFAULT_JOB_PATH,
    DEFAULT_JOB_USER,
    DEFAULT_MIN_UID,
    AccountError,
    JobIdentity,
    traversable_by_others,
)
from agent.agent import Agent, AgentConfig, AgentFatalError
from agent.gpus import GpuBackendError, select_gpu_backend
from agent.host import PsutilHostBackend
from agent.launcher import ISOLATION_MODES
from agent.spool import SpoolLockedError

log = logging.getLogger("agent")

# Beyond the leases' grace and one HTTP call, a shutdown waits only on bounded joins: one still running
# this long after its signal is stuck somewhere, and an agent must not outlive what stopped it.
EXIT_WATCHDOG_MARGIN_S = 30.0


def build_parser() -> argparse.ArgumentParser:
    # `attune-agent` once installed (packaging/agent), `python -m agent` in a checkout.
    prog = "attune-agent" if Path(sys.argv[0]).name == "attune-agent" else "python -m agent"
    parser = argparse.ArgumentParser(prog=prog, description="Attune node agent.")
    parser.add_argument("--server", required=True, help="service base URL, e.g. http://attune:8000")
    parser.add_argument(
        "--token",
        default=os.environ.get("ATTUNE_AGENT_TOKEN"),
        help="this server's agent token (default: $ATTUNE_AGENT_TOKEN)",
    )
    parser.add_argument(
        "--name",
        default=socket.gethostname(),
        help="node name reported as hostname; seeds fake GPU UUIDs (default: hostname)",
    )
    parser.add_argument("--fake-gpus", type=int, default=None, metavar="N", help="run with N synthetic GPUs")
    parser.add_argument(
        "--fake-cpus",
        type=int,
        default=None,
        metavar="N",
        help="report N CPU cores (jobs' logical cores map onto the real ones)",
    )
    parser.add_argument(
        "--fake-mem-gb", type=float, default=None, metavar="GB", help="report this much memory"
    )
    parser.add_argument("--storage-mbps", type=float, default=0.0, help="storage read bandwidth to report")
    parser.add_argument("--spool-dir", type=Path, default=None, help="default: var/agent/<name>/spool")
    parser.add_argument(
        "--work-dir",
        type=Path,
        default=None,
        help="lease logs and checkpoints (default: var/agent/<name>/work)",
    )
    parser.add_argument(
        "--time-scale",
        type=float,
        default=1.0,
        help="ATTUNE_TIME_SCALE passed to jobs (synthetic workloads run this much faster)",
    )
    parser.add_argument("--isolation", default="auto", choices=["auto", *ISOLATION_MODES])
    parser.add_argument(
        "--stop-leases-on-exit",
        action="store_true",
        help="stop running leases when the agent exits (default: leave them to be adopted)",
    )
    parser.add_argument(
        "--job-user",
        default=os.environ.get("ATTUNE_AGENT_JOB_USER") or DEFAULT_JOB_USER,
        metavar="NAME",
        help="account of catalog workloads (run_as null) when the agent is root; never root "
        "(default: $ATTUNE_AGENT_JOB_USER or nobody)",
    )
    parser.add_argument(
        "--min-uid",
        type=int,
        default=int(os.environ.get("ATTUNE_AGENT_MIN_UID") or DEFAULT_MIN_UID),
        metavar="UID",
        help="as root, users' jobs run only as accounts with this uid or more (below: system accounts, "
        f"refused); never as --job-user (default: $ATTUNE_AGENT_MIN_UID or {DEFAULT_MIN_UID})",
    )
    parser.add_argument(
        "--job-path",
        default=DEFAULT_JOB_PATH,
        metavar="PATH",
        help=f"PATH of every job's environment (default: {DEFAULT_JOB_PATH})",
    )
    parser.add_argument(
        "--workload-python",
        default=None,
        metavar="PATH",
        help="interpreter of the shipped workloads (agent.workload, agent.torch_workload), run as "
        "--job-user (default: the agent's own, or, as root, a system python of the same version when "
        "the agent's own is not readable by that account)",
    )
    parser.add_argument(
        "--address",
        default="",
        help="where this node's peers reach it: the MASTER_ADDR of multi-node jobs whose rank 0 runs "
        "here (default: the service uses --name)",
    )
    parser.add_argument(
        "--no-live-resize",
        dest="live_resize",
        action="store_false",
        help="do not apply a running job's new cores or memory in place: the service then restarts it "
        "(as for an agent without the `resize` feature)",
    )
    parser.add_argument("--log-level", default=os.environ.get("ATTUNE_AGENT_LOG_LEVEL", "INFO"))
    parser.add_argument("--version", action="version", version=f"attune-agent {__version__}")
    return parser


def argv_without_token(argv: list[str]) -> list[str]:
    """The interpreter's command line without `--token X` / `--token=X` (which stays in the environment)."""
    out: list[str] = []
    skip = False
    for arg in argv:
        if skip:
            skip = False
        elif arg == "--token":
            skip = True
        elif not arg.startswith("--token="):
            out.append(arg)
    return out


def scrub_token_from_command_line(token: str) -> None:
    """Start over (same pid) with the token in the environment instead of the command line, which every
    account on this node, jobs included, can read in /proc/<pid>/cmdline; the environment only we can."""
    clean = argv_without_token(sys.orig_argv)
    if any(token in arg for arg in clean):  # an abbreviated option (--tok X): do not loop
        log.warning("the agent token is readable on the command line: set $ATTUNE_AGENT_TOKEN instead")
        return
    log.info("moving the agent token from the command line to $ATTUNE_AGENT_TOKEN (re-exec)")
    for handler in logging.getLogger().handlers:
        handler.flush()
    os.execve(sys.executable, clean, {**os.environ, "ATTUNE_AGENT_TOKEN": token})


SYSTEM_PYTHON_DIRS = ("/usr/bin", "/usr/local/bin")


def default_workload_python() -> str | None:
    """A system interpreter of this one's version, for the shipped workloads, when a root agent's own
    interpreter sits where the job account cannot reach it (a virtualenv built from a python under
    /root); None when ours is reachable or there is no such interpreter."""
    if os.geteuid() != 0 or traversable_by_others(Path(sys.executable).resolve()):
        return None
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    for directory in SYSTEM_PYTHON_DIRS:
        candidate = Path(directory) / version
        if candidate.exists() and traversable_by_others(candidate.resolve()):
            return str(candidate)
    return None


def exit_watchdog_s(config: AgentConfig) -> float:
    """How long after its stop signal the agent's process may still run."""
    return config.exit_grace_s + config.http_timeout_s + EXIT_WATCHDOG_MARGIN_S


def arm_exit_watchdog(config: AgentConfig) -> float:
    """Dump every thread's stack to stderr and exit(1) unless the process has ended within
    exit_watchdog_s; returns it. faulthandler's own thread does it, without the GIL, so a thread stuck
    holding a lock or in a C call cannot hold it up."""
    exit_after_s = exit_watchdog_s(config)
    faulthandler.dump_traceback_later(exit_after_s, exit=True, file=sys.stderr)
    return exit_after_s


def stop_on_signal(agent: Agent, config: AgentConfig) -> Callable[[int, object], None]:
    """The agent's SIGTERM/SIGINT handler: asks the agent to stop, arms the exit watchdog once, logs.

    Signals can arrive in bursts and re-enter the handler, and it may interrupt any bytecode of the
    main thread, so it takes no lock: `ask_stop` sets a flag (Event.set() here once deadlocked on the
    Condition lock that the interrupted frame held, Event.wait's or an outer handler's set's)."""
    watchdog_armed = False

    def on_signal(signum: int, _frame: object) -> None:
        nonlocal watchdog_armed
        agent.ask_stop()
        if watchdog_armed:
            return
        watchdog_armed = True
        exit_after_s = arm_exit_watchdog(config)
        # A RuntimeError here: the signal interrupted this thread's own write to the stream.
        with contextlib.suppress(RuntimeError):
            log.info(
                "%s received: stopping (not stopped in %.0f s: every thread's stack goes to this log "
                "and the agent exits)",
                signal.Signals(signum).name,
                exit_after_s,
            )

    return on_signal


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(),
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s [%(threadName)s] %(message)s",
    )
    if logging.getLogger().getEffectiveLevel() > logging.DEBUG:
        logging.getLogger("httpx").setLevel(logging.WARNING)  # one INFO line per request is noise
    if not args.token:
        log.error(
            "no agent token: pass --token or set ATTUNE_AGENT_TOKEN (issue one with `manage.py node_token`)"
        )
        return 2
    identity = JobIdentity(job_user=args.job_user, node=args.name, min_uid=args.min_uid)
    try:
        identity.check()
    except AccountError as exc:
        log.error("--job-user %s: %s", args.job_user, exc)
        return 2
    if argv is None and any(args.token in arg for arg in sys.orig_argv):
        scrub_token_from_command_line(args.token)
    base_dir = Path("var") / "agent" / args.name
    work_dir = (args.work_dir or base_dir / "work").resolve()
    # Created before the umask below, so that its parents stay searchable: jobs of other accounts reach
    # their directories inside it.
    work_dir.mkdir(parents=True, exist_ok=True)
    # What the agent creates (spool with every job's log lines, lease files) is its own alone; the
    # launcher opens up exactly the directories that a job's account must reach.
    os.umask(0o077)
    try:
        gpu_backend = select_gpu_backend(fake_gpus=args.fake_gpus, agent_name=args.name)
        host_backend = PsutilHostBackend(report_cpus=args.fake_cpus, report_mem_gb=args.fake_mem_gb)
    except (GpuBackendError, ValueError) as exc:
        log.error("%s", exc)
        return 2
    config = AgentConfig(
        server_url=args.server,
        token=args.token,
        name=args.name,
        spool_dir=args.spool_dir or base_dir / "spool",
        work_dir=work_dir,
        time_scale=args.time_scale,
        storage_mbps=args.storage_mbps,
        isolation=args.isolation,
        stop_leases_on_exit=args.stop_leases_on_exit,
        job_user=args.job_user,
        min_uid=args.min_uid,
        job_path=args.job_path,
        workload_python=args.workload_python or default_workload_python(),
        address=args.address,
        live_resize=args.live_resize,
    )
    try:
        agent = Agent(config, gpu_backend=gpu_backend, host_backend=host_backend)
    except SpoolLockedError as exc:
        log.error("%s", exc)
        return 2

    on_signal = stop_on_signal(agent, config)
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    try:
        agent.run()
    except AgentFatalError:
        return 1  # already logged
    return 0
