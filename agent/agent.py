"""The agent: registers, syncs with the service (usage, reports, commands), supervises leases (threads)."""

from __future__ import annotations

import logging
import socket
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from agent import __version__
from agent.accounts import (
    DEFAULT_JOB_PATH,
    DEFAULT_JOB_USER,
    DEFAULT_MIN_UID,
    JobIdentity,
    traversable_by_others,
)
from agent.bandwidth import NodeBandwidths
from agent.client import ServiceClient, ServiceError, call_with_retry
from agent.clock import utc_iso
from agent.fence import FenceTimes
from agent.gpus import GpuBackend, GpuBackendError
from agent.host import HostBackend
from agent.launcher import Launcher, ProcessLauncher, choose_isolation
from agent.leases import LeaseManager
from agent.resize import resize_supported
from agent.spool import Spool
from agent.syncer import Syncer

log = logging.getLogger(__name__)

STOP_POLL_S = 0.25  # how soon `run` acts on a stop asked by a signal handler


class AgentFatalError(RuntimeError):
    """The agent cannot run (bad token, GPU UUID conflict...); retrying will not help."""


@dataclass
class AgentConfig:
    """Settings of one agent; the intervals are defaults until the register answer overrides them."""

    server_url: str
    token: str
    name: str = socket.gethostname()
    spool_dir: Path = Path("var/agent/spool")
    work_dir: Path = Path("var/agent/work")
    time_scale: float = 1.0
    storage_mbps: float = 0.0
    isolation: str = "auto"
    sync_interval_s: float = 10.0
    progress_interval_s: float = 3.0
    log_interval_s: float = 1.0
    tick_s: float = 0.2
    max_backoff_s: float = 30.0
    http_timeout_s: float = 10.0
    stop_leases_on_exit: bool = False
    exit_grace_s: float = 10.0
    # The account of catalog workloads (run_as null) when the agent is root; None keeps them on the
    # agent's own identity (tests only: never root on a real node).
    job_user: str | None = DEFAULT_JOB_USER
    # Root mode: users' jobs run only as accounts with this uid or more, never as job_user.
    min_uid: int = DEFAULT_MIN_UID
    job_path: str = DEFAULT_JOB_PATH
    workload_python: str | None = None
    address: str = ""
    # Apply a running lease's new size in place (the `resize` feature, agent/resize.py); off, the
    # service restarts a job whose cores or memory change, as for an older agent.
    live_resize: bool = True


class Agent:
    """One node's agent. `run()` blocks until `stop()`; the pieces are public so tests can drive them.

    Threads: supervisor (reaps and signals processes, ships logs/progress into the spool), sync (spool,
    usage and running leases -> service; commands back) and wait (the long-poll between syncs). Only
    sync and wait touch the network, so a slow or dead service never delays a SIGKILL that a grace
    period calls for.
    """

    def __init__(
        self,
        config: AgentConfig,
        *,
        gpu_backend: GpuBackend,
        host_backend: HostBackend,
        launcher: Launcher | None = None,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self.config = config
        self.gpu_backend = gpu_backend
        self.host_backend = host_backend
        self.gpus = gpu_backend.inventory()
        self.stop_event = threading.Event()
        self.spool = Spool(config.spool_dir / "spool.sqlite3")
        self.client = ServiceClient(
            config.server_url, config.token, timeout_s=config.http_timeout_s, transport=transport
        )
        self.identity = JobIdentity(job_user=config.job_user, node=config.name, min_uid=config.min_uid)
        self.launcher = launcher or ProcessLauncher(
            isolation=choose_isolation(config.isolation),
            job_path=config.job_path,
            workload_python=config.workload_python,
        )
        self.syncer = Syncer(
            self.spool,
            self.client,
            sample=self.usage_sample,
            running=lambda: self.leases.running_ids(),
            sizes=(lambda: self.leases.sizes()) if self._resizes() else None,
            apply_commands=lambda commands: self.leases.apply_commands(commands),
            renew=lambda listed, sent_boot_s, fence: self.leases.renew(
                listed=listed, sent_boot_s=sent_boot_s, fence=fence
            ),
            reregister=self._reregister,
            interval_s=config.sync_interval_s,
            stop_event=self.stop_event,
            max_backoff_s=config.max_backoff_s,
        )
        self.leases = LeaseManager(
            spool=self.spool,
            launcher=self.launcher,
            gpu_uuids=[g.uuid for g in self.gpus],
            num_cpus=host_backend.inventory().num_cpus,
            work_dir=config.work_dir,
            time_scale=config.time_scale,
            progress_interval_s=config.progress_interval_s,
            log_interval_s=config.log_interval_s,
            sync_interval_s=lambda: self.syncer.interval_s,  # the service's, once it answered
            on_report=self.syncer.notify,
            bandwidths=NodeBandwidths(work_dir=config.work_dir, storage_mbps=config.storage_mbps),
            identity=self.identity,
        )
        self.registered = threading.Event()
        self.fatal_error: AgentFatalError | None = None
        self._threads: list[threading.Thread] = []
        self._shut_down = False
        # Set by a signal handler, which must take no lock: Event.set() there can deadlock on the
        # Condition's lock that the interrupted frame (Event.wait, or an outer handler's set) holds.
        self.stop_asked = False

    # -- protocol steps ------------------------------------------------------------------------

    def registration(self) -> dict[str, Any]:
        inventory = self.host_backend.inventory()
        return {
            "agent_version": __version__,
            "hostname": self.config.name,
            "address": self.config.address,
            "num_cpus": inventory.num_cpus,
            "mem_gb": inventory.mem_gb,
            "storage_mbps": self.config.storage_mbps,
            "gpus": [g.as_json() for g in self.gpus],
            "cgroup_mode": self.launcher.isolation,
            "time_scale": self.config.time_scale,
            "features": ["resize"] if self._resizes() else [],
        }

    def _resizes(self) -> bool:
        """Whether this agent resizes running leases in place (configured, and possible here)."""
        return self.config.live_resize and resize_supported(self.launcher.isolation)

    def register(self) -> dict[str, Any]:
        """Register, retrying with backoff until the service answers; AgentFatalError on a 4xx."""
        payload = self.registration()
        try:
            answer = call_with_retry(
                lambda: self.client.register(payload),
                stop_event=self.stop_event,
                max_backoff_s=self.config.max_backoff_s,
                what="register",
            )
        except ServiceError as exc:
            if self.stop_event.is_set() and exc.retryable:
                raise
            if exc.status_code == 409:
                raise AgentFatalError(f"another server already registered these GPUs: {exc.body}") from exc
            if exc.status_code in (401, 403):
                raise AgentFatalError(f"the service refused the agent token: {exc.body}") from exc
            raise AgentFatalError(f"registration refused: {exc}") from exc
        self.syncer.interval_s = float(answer.get("sync_interval_s") or self.syncer.interval_s)
        self.leases.fence = FenceTimes.from_answer(answer.get("fence"), self.leases.fence)
        log.info(
            "registered as %s: %d GPUs (%s), %d cores, %.1f GB, isolation %s; sync every %.1fs; "
            "leases fenced after %gs unrenewed",
            answer.get("server", self.config.name),
            len(self.gpus),
            self.gpu_backend.name,
            payload["num_cpus"],
            payload["mem_gb"],
            self.launcher.isolation,
            self.syncer.interval_s,
            self.leases.fence.fence_s,
        )
        self.registered.set()
        return answer

    def usage_sample(self) -> dict[str, Any]:
        """The node's usage now (a sync's `sample`); GPUs left out when NVML fails, the rest still sent."""
        host = self.host_backend.sample()
        try:
            gpus = [s.as_json() for s in self.gpu_backend.sample(self.leases.busy_gpu_uuids())]
        except GpuBackendError as exc:  # still tell the service we are alive
            log.warning("GPU usage unavailable: %s", exc)
            gpus = []
        return {
            "sampled_at": utc_iso(),
            "cpu_util_pct": host.cpu_util_pct,
            "mem_used_gb": host.mem_used_gb,
            "gpus": gpus,
        }

    def sync_once(self) -> dict[str, Any]:
        """One sync now (tests drive the agent with it); raises ServiceError."""
        answer, _ = self.syncer.sync_once()
        return answer

    # -- threads -------------------------------------------------------------------------------

    def _supervise_loop(self) -> None:
        while not self.stop_event.is_set():
            try:
                self.leases.tick()
            except Exception:
                log.exception("supervision failed")
            self.stop_event.wait(self.config.tick_s)

    def _spawn(self, name: str, target: Callable[..., None], *args: Any) -> None:
        thread = threading.Thread(target=target, args=args, name=name, daemon=True)
        thread.start()
        self._threads.append(thread)

    def start(self) -> None:
        """Adopt surviving leases, then run every thread; registration runs in its own thread too."""
        log.info("%s", self.identity.describe())
        if self.identity.is_root and not traversable_by_others(self.config.work_dir.resolve()):
            log.warning(
                "work dir %s: a directory above it is not searchable by other accounts, so jobs cannot "
                "reach their files there (chmod o+x the parents, or choose another --work-dir)",
                self.config.work_dir,
            )
        workload_python = Path(self.config.workload_python or sys.executable).resolve()
        if self.identity.is_root and not traversable_by_others(workload_python):
            log.warning(
                "%s: a directory above it is not searchable by other accounts, so catalog workloads "
                "(run as %s) cannot start: install the agent where every account can read it, or give "
                "--workload-python (a system python of the same version)",
                workload_python,
                self.config.job_user,
            )
        elif self.config.workload_python:
            log.info("catalog workloads run with %s (and this agent's packages)", workload_python)
        self.leases.restore()
        self._spawn("supervisor", self._supervise_loop)
        self._spawn("register", self._main)

    def _main(self) -> None:
        if self._register_or_stop():
            self.syncer.start()

    def _reregister(self) -> None:
        """Register again from the sync thread (the service answered a sync `not_registered`); the jobs
        keep running meanwhile."""
        self._register_or_stop()

    def _register_or_stop(self) -> bool:
        """Register; a refusal that needs an operator stops the agent. False unless registered."""
        try:
            self.register()
        except AgentFatalError as exc:
            self.fatal_error = exc
            log.error("%s", exc)
            self.stop_event.set()
            return False
        except ServiceError:
            return False  # stopped while retrying
        return True

    def run(self) -> None:
        """Start and block until stopped (signal handler or fatal error). Raises AgentFatalError."""
        self.start()
        # A short timed wait: a signal handler runs in this thread between waits and only sets
        # `stop_asked`; the event is set here, in plain code, where no frame below holds its lock.
        while not self.stop_asked and not self.stop_event.wait(STOP_POLL_S):
            pass
        self.stop_event.set()
        self.shutdown()
        if self.fatal_error is not None:
            raise self.fatal_error

    def stop(self) -> None:
        """Stop from another thread (tests, an embedding process); not from a signal handler."""
        self.stop_event.set()

    def ask_stop(self) -> None:
        """Stop from a signal handler: a plain flag, no lock taken, safe however often it re-enters;
        `run` sees it within STOP_POLL_S."""
        self.stop_asked = True

    def shutdown(self, *, timeout_s: float = 5.0) -> None:
        """Stop the threads and close the spool.

        By default running leases keep running (each shim leads its own session, so the agent's exit does
        not touch it), and the next agent adopts them; with `stop_leases_on_exit` they get SIGTERM,
        `exit_grace_s`, SIGKILL, and their `exited` reports are spooled (sent now if the service answers
        at once, else by the next agent).
        """
        if self._shut_down:
            return
        self._shut_down = True
        self.stop_event.set()
        for thread in self._threads:
            thread.join(timeout_s)
        self.syncer.join(timeout_s)
        if self.config.stop_leases_on_exit:
            self.leases.stop_all(grace_s=self.config.exit_grace_s)
            try:
                self.syncer.sync_once()  # one attempt, no retries: the exits go now or with the next agent
            except ServiceError as exc:
                log.info("exit reports stay spooled for the next agent: %s", exc)
        left = self.leases.running_ids()
        if left:
            log.info(
                "leaving %d lease(s) running for the next agent to adopt: %s", len(left), ", ".join(left)
            )
        self.client.close()
        self.spool.close()
        self.gpu_backend.close()
