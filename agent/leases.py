"""The leases an agent runs: starting, stopping (SIGTERM, grace, SIGKILL), supervising and reporting them."""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from agent.accounts import (
    TRAVERSE_ONLY_MODE,
    AccountError,
    JobIdentity,
)
from agent.bandwidth import NodeBandwidths
from agent.exit_status import ExitStatus, classify_oom
from agent.fence import FenceTimes, boot_clock_s, renewal_read, renewal_write
from agent.launch_spec import LaunchSpec
from agent.launcher import ISOLATION_SYSTEMD, Launcher
from agent.lease_cores import LeaseCores
from agent.lease_output import logs_spool, output_offsets_at_launch, progress_spool
from agent.lease_profiles import ProfileRuns
from agent.lease_spec import launch_spec_of
from agent.lease_state import Lease, StartError, output_tail_lines, spec_from_record
from agent.profiler import ProfileTask
from agent.spool import Spool

log = logging.getLogger(__name__)

DEFAULT_GRACE_S = 30.0


class LeaseManager(LeaseCores, ProfileRuns):
    """Brings the node to what the service's commands say, and turns what happens into spooled reports.

    Thread-safe: the sync thread calls `apply_commands`/`running_ids`, the supervisor thread `tick`, all
    under one lock. Nothing here blocks on the network; the syncer ships the spooled reports.

    Invariants: a lease id is launched at most once per node (running, or marked finished in the spool);
    a GPU is used by at most one local process group: a start whose GPUs are still held by a lease
    (typically one stopping after a preempt) waits until that lease's processes are gone.

    Profiling runs (`profile` commands, agent/profiler.py) live beside the leases: one measurement
    process at a time per run, on cores no lease uses, and a lease start waits for its GPUs like it
    waits for a stopping lease's.
    """

    def __init__(
        self,
        *,
        spool: Spool,
        launcher: Launcher,
        gpu_uuids: Sequence[str],
        num_cpus: int,
        work_dir: Path,
        time_scale: float = 1.0,
        progress_interval_s: float = 3.0,
        log_interval_s: float = 1.0,
        sync_interval_s: Callable[[], float] = lambda: 0.0,
        on_report: Callable[..., None] = lambda urgent=True: None,
        clock: Callable[[], float] = time.monotonic,
        bandwidths: NodeBandwidths | None = None,
        identity: JobIdentity | None = None,
        boot_clock: Callable[[], float] = boot_clock_s,
    ) -> None:
        self.spool = spool
        self.launcher = launcher
        self.gpu_uuids = tuple(gpu_uuids)
        self.num_cpus = num_cpus
        self.work_dir = work_dir
        self.time_scale = time_scale
        self.progress_interval_s = progress_interval_s
        self.log_interval_s = log_interval_s
        self.sync_interval_s = sync_interval_s
        self.on_report = on_report
        self.clock = clock
        self.leases: dict[str, Lease] = {}
        self.pending: dict[str, dict[str, Any]] = {}
        self.profiles: dict[str, ProfileTask] = {}
        self.bandwidths = bandwidths or NodeBandwidths(work_dir=work_dir)
        self.identity = identity or JobIdentity()
        self._prepare_work_dir()
        self.draining = False
        self.fence = FenceTimes()
        self.boot_clock = boot_clock
        # When the sync whose answer holds the queued starts was sent: a lease launched from it is renewed
        # as of then (the service counted it live when it answered).
        self._pending_sent_boot_s = 0.0
        self._lock = threading.RLock()

    def _prepare_work_dir(self) -> None:
        # Jobs of other accounts must reach their own directories below these, and must not list them
        # (lease ids, other jobs' checkpoint directories): traversable, not readable, by others.
        for path in (self.work_dir, *(self.work_dir / sub for sub in ("leases", "checkpoints", "profiles"))):
            path.mkdir(parents=True, exist_ok=True)
            os.chmod(path, TRAVERSE_ONLY_MODE)

    # -- queries -------------------------------------------------------------------------------

    def running_ids(self) -> list[str]:
        """Leases with a live process, stopping ones included (they still hold their GPUs), and the
        profiling runs this agent works on."""
        with self._lock:
            return sorted([*self.leases, *self.profiles])

    def sizes(self) -> dict[str, list[float]]:
        """Each running lease's size as applied now, [cores, memory GB] (a sync's `sizes`: the service
        answers `resize` for a lease whose size a round changed since); stopping leases are left out."""
        with self._lock:
            return {
                lease_id: [len(lease.spec.cpus), lease.spec.mem_gb]
                for lease_id, lease in self.leases.items()
                if lease.stop_kind is None
            }

    def busy_gpu_uuids(self) -> set[str]:
        with self._lock:
            return {uuid for lease in self.leases.values() for uuid in lease.spec.gpu_uuids} | {
                uuid for task in self.profiles.values() for uuid in task.gpu_uuids
            }

    # -- commands ------------------------------------------------------------------------------

    def apply_commands(self, commands: Iterable[dict[str, Any]]) -> None:
        """Carry out one sync answer. Starts are queued and launched by `tick` once their GPUs are free."""
        starts: dict[str, dict[str, Any]] = {}
        resizes: list[dict[str, Any]] = []
        draining = False
        with self._lock:
            for command in commands:
                kind = command.get("kind")
                if kind == "start" and command.get("lease_id"):
                    starts[str(command["lease_id"])] = command
                elif kind == "profile" and command.get("lease_id"):
                    self._profile_command(command)
                elif kind in ("preempt", "cancel") and command.get("lease_id"):
                    self.request_stop(
                        str(command["lease_id"]), kind, float(command.get("grace_s", DEFAULT_GRACE_S))
                    )
                elif kind == "resize" and command.get("lease_id"):
                    resizes.append(command)
                elif kind == "drain":
                    draining = True
                else:
                    log.warning("ignoring unknown command %r", command)
            # Shrinks first: the cores they free are the ones a growth in the same answer takes.
            for command in sorted(resizes, key=lambda c: self._size_change(c)):
                self._resize(command)
            if draining != self.draining:
                log.info(
                    "node %s: running leases finish, no new ones come",
                    "draining" if draining else "no longer draining",
                )
                self.draining = draining
            # The answer is recomputed from the service's database on every sync, so the queue is exactly
            # this answer's starts: a queued start that the service no longer asks for (it ended that lease
            # before the GPUs became free) is dropped here, never launched late.
            self.pending = {}
            for lease_id, command in starts.items():
                if lease_id in self.leases:
                    continue  # idempotent: already running
                if self.spool.is_finished(lease_id):
                    # The service has not yet applied our `exited` report; never run a lease twice.
                    log.debug("ignoring start of finished lease %s", lease_id)
                    continue
                self.pending[lease_id] = command

    def renew(self, *, listed: Iterable[str], sent_boot_s: float, fence: Any = None) -> None:
        """An answered sync renews the leases it listed as running that the service still counts live
        (those its answer stopped are stopping now, and renewed no more): as of when it was sent, since
        the service's clock for the node's last sync starts no earlier. Called after `apply_commands`."""
        with self._lock:
            self.fence = FenceTimes.from_answer(fence, self.fence)
            self._pending_sent_boot_s = sent_boot_s
            for lease_id in listed:
                lease = self.leases.get(lease_id)
                if lease is not None and lease.stop_kind is None and sent_boot_s > lease.renewed_boot_s:
                    self._renewal_write(lease, sent_boot_s)

    def _renewal_write(self, lease: Lease, renewed_boot_s: float) -> None:
        lease.renewed_boot_s = renewed_boot_s
        try:
            renewal_write(lease.spec.renewal_path, renewed_boot_s=renewed_boot_s, times=self.fence)
        except OSError as exc:  # the agent's own fence still holds; the shim's keeps the older renewal
            log.error("lease %s: cannot write its renewal: %s", lease.lease_id, exc)

    def request_stop(self, lease_id: str, kind: str, grace_s: float) -> None:
        """SIGTERM the lease's process group now; `tick` sends SIGKILL once `grace_s` has passed."""
        with self._lock:
            if lease_id in self.profiles:
                self._stop_profile(self.profiles[lease_id], kind, grace_s)
                return
            lease = self.leases.get(lease_id)
            if lease is None:
                if self.pending.pop(lease_id, None) is not None:
                    log.info("dropping queued start of lease %s (%s)", lease_id, kind)
                return
            if lease.stop_kind is not None:
                return  # already stopping: the first deadline stands, repeats of the command change nothing
            lease.stop_kind = kind
            lease.stop_deadline_s = time.time() + max(0.0, grace_s)
            log.info(
                "%s lease %s: SIGTERM to process group %d, SIGKILL in %.1fs",
                kind,
                lease_id,
                lease.process.pid,
                grace_s,
            )
            lease.process.signal_group(signal.SIGTERM)
            self.spool.lease_update(lease_id, lease.record())

    # -- supervision ---------------------------------------------------------------------------

    def restore(self) -> None:
        """Adopt the leases an earlier run of the agent left running (their shims outlive the agent)."""
        with self._lock:
            for lease_id, record in self.spool.leases().items():
                spec = spec_from_record(record["spec"])
                process = self.launcher.adopt(record["pid"], record.get("start_ticks"), spec.status_path)
                self.leases[lease_id] = Lease(
                    spec=spec,
                    process=process,
                    isolation=record["isolation"],
                    # Records from before per-file offsets knew only the shim's log.
                    log_offsets=dict(
                        record.get("log_offsets") or {str(spec.log_path): int(record.get("log_offset", 0))}
                    ),
                    stop_kind=record.get("stop_kind"),
                    stop_deadline_s=record.get("stop_deadline_s"),
                    killed=bool(record.get("killed")),
                    done_iters=record.get("done_iters"),
                    # A lease from before fencing has no renewal file: renewed by the first answered sync.
                    renewed_boot_s=renewal_read(spec.renewal_path) or self.boot_clock(),
                    launched_at=record.get("launched_at"),
                    startup_s=record.get("startup_s"),
                )
                log.info("adopted lease %s (shim pid %d)", lease_id, record["pid"])

    def tick(self) -> None:
        """One supervision step: reap, escalate stops, ship logs and progress, launch what can start."""
        with self._lock:
            for lease in list(self.leases.values()):
                try:
                    self._supervise(lease)
                except Exception:  # one broken lease must not stop the supervision of the others
                    log.exception("supervising lease %s failed", lease.lease_id)
            self._launch_pending()
            for task in list(self.profiles.values()):
                try:
                    self._supervise_profile(task)
                except Exception:
                    log.exception("supervising profiling run %s failed", task.run_id)

    def _supervise(self, lease: Lease) -> None:
        if lease.isolation == ISOLATION_SYSTEMD:
            lease.process.cgroup_oom_kills()  # sampled while the scope's cgroup still exists
        status = lease.process.exited()
        if status is not None:
            self._finish(lease, status)
            return
        if lease.stop_kind is None and self.boot_clock() - lease.renewed_boot_s > self.fence.fence_s:
            # The service may start this job elsewhere soon (docs/faults.md, "Fencing"): stop it here.
            log.warning(
                "lease %s not renewed for %.0f s (no answered sync; fence %g s): stopping it",
                lease.lease_id,
                self.boot_clock() - lease.renewed_boot_s,
                self.fence.fence_s,
            )
            self.request_stop(lease.lease_id, "fence", self.fence.grace_s)
        now = self.clock()
        if lease.stop_deadline_s is not None and not lease.killed and time.time() >= lease.stop_deadline_s:
            log.warning("lease %s did not exit within its grace period: SIGKILL", lease.lease_id)
            lease.process.signal_group(signal.SIGKILL)
            lease.killed = True
            self.spool.lease_update(lease.lease_id, lease.record())
        if now >= lease.next_log_at_s:
            lease.next_log_at_s = now + self.log_interval_s
            self._ship_logs(lease, final=False)
        if now >= lease.next_progress_at_s or lease.startup_pending:
            # At most one progress report per sync: they wait in the spool for the next sync anyway,
            # and the last one says all the others do (progress is cumulative, GPU time is credited
            # from the last report's date). With 10 s syncs, one every 3 s tripled a fleet's reports.
            lease.next_progress_at_s = now + max(self.progress_interval_s, self.sync_interval_s())
            self._read_progress(lease)

    def _finish(self, lease: Lease, status: ExitStatus) -> None:
        # Logs and the last progress first, so that `exited` is the lease's last seq.
        self._ship_logs(lease, final=True)
        self._read_progress(lease)
        oom = classify_oom(
            status,
            stop_requested=lease.stop_kind is not None or status.fenced,
            mem_cap_bytes=lease.spec.mem_cap_bytes,
            log_tail=output_tail_lines(lease.spec),
            cgroup_oom_kills=lease.process.cgroup_oom_kills() if lease.isolation == ISOLATION_SYSTEMD else 0,
        )
        data: dict[str, Any] = {
            "exit_code": status.exit_code,
            "signal": status.signal,
            "oom": oom,
            "done_iters": lease.done_iters,
            # The shim fenced it while the agent was down (or before the agent's own fence did).
            "stop": lease.stop_kind or ("fence" if status.fenced else None),
            "killed_after_grace": lease.killed,
            "peak_rss_mb": round(status.peak_rss_kb / 1024, 1) if status.peak_rss_kb else None,
        }
        if status.error:
            data["error"] = status.error
        self.spool.lease_finished(lease.lease_id, data)
        del self.leases[lease.lease_id]
        log.info(
            "lease %s exited: code=%s signal=%s oom=%s done_iters=%s",
            lease.lease_id,
            status.exit_code,
            status.signal,
            oom,
            lease.done_iters,
        )
        self.on_report()

    def _ship_logs(self, lease: Lease, *, final: bool) -> None:
        if logs_spool(lease, self.spool, final=final):
            # Lines go with the next sync; a lease's last ones with its exit, whose own notice (urgent)
            # follows: an urgent one here sent them in a sync of their own just before the exit's.
            self.on_report(urgent=False)
            # After the report: a crash in between re-ships these lines, it never loses them.
            self.spool.lease_update(lease.lease_id, lease.record())

    def _read_progress(self, lease: Lease) -> None:
        if progress_spool(lease, self.spool):
            self.spool.lease_update(lease.lease_id, lease.record())
            self.on_report(urgent=False)  # goes with the next sync

    # -- starting ------------------------------------------------------------------------------

    def _launch_pending(self) -> None:
        for lease_id, command in list(self.pending.items()):
            gpu_uuids = set(command.get("gpu_uuids") or [])
            if any(gpu_uuids & set(task.gpu_uuids) for task in self.profiles.values()):
                continue  # a profiling run holds them: the service started this lease before its end
            holders = [lease for lease in self.leases.values() if gpu_uuids & set(lease.spec.gpu_uuids)]
            if holders:
                # Preempt-then-start on the same GPUs arrives in one sync answer: the old process may still
                # be checkpointing. Starting now would put two jobs on one GPU (and likely OOM it).
                for holder in holders:
                    if holder.stop_kind is None and not holder.gpu_wait_logged:
                        holder.gpu_wait_logged = True
                        log.warning(
                            "lease %s waits for GPUs held by running lease %s, which the service "
                            "has not asked to stop",
                            lease_id,
                            holder.lease_id,
                        )
                continue
            cpus = self._choose_cpus(int(command.get("num_cpus") or 1))
            if cpus is None:
                continue
            del self.pending[lease_id]
            self._launch(lease_id, command, cpus)

    def _spec_for(self, lease_id: str, command: dict[str, Any], cpus: tuple[int, ...]) -> LaunchSpec:
        return launch_spec_of(
            lease_id,
            command,
            cpus,
            node_gpu_uuids=self.gpu_uuids,
            work_dir=self.work_dir,
            time_scale=self.time_scale,
            identity=self.identity,
        )

    def _launch(self, lease_id: str, command: dict[str, Any], cpus: tuple[int, ...]) -> None:
        try:
            spec = self._spec_for(lease_id, command, cpus)
            # Renewed as of the sync whose answer asked for it; written before the shim starts to read it.
            spec.lease_dir.mkdir(parents=True, exist_ok=True)
            renewed_boot_s = self._pending_sent_boot_s or self.boot_clock()
            renewal_write(spec.renewal_path, renewed_boot_s=renewed_boot_s, times=self.fence)
            log_offsets = output_offsets_at_launch(spec)  # before the process can write a line
            launched_at = time.time()  # its start-up runs from here to its first progress
            process, facts = self.launcher.launch(spec)
        except (StartError, AccountError, OSError, ValueError, TypeError) as exc:
            log.error("cannot start lease %s: %s", lease_id, exc)
            self.spool.lease_finished(
                lease_id,
                {
                    "exit_code": None,
                    "signal": None,
                    "oom": False,
                    "done_iters": None,
                    "stop": None,
                    "error": f"start failed: {exc}",
                },
            )
            self.on_report()
            return
        lease = Lease(
            spec=spec,
            process=process,
            isolation=facts["isolation"],
            log_offsets=log_offsets,
            renewed_boot_s=renewed_boot_s,
            launched_at=launched_at,
        )
        # A crash between the launch above and this commit would orphan the process unrecorded; the
        # window is a few milliseconds and the service would then re-send the start (a second copy).
        self.spool.lease_started(lease_id, lease.record(), facts)
        self.leases[lease_id] = lease
        log.info(
            "started lease %s (job %s): pid %d, cores %s, gpus %s, %s",
            lease_id,
            spec.job_id,
            process.pid,
            list(cpus),
            list(spec.gpu_uuids),
            facts["isolation"],
        )
        # Its `started` goes with the next sync (at the interval, or sooner with an exit): no command
        # waits for it (the answer that carried the start already holds a moved job's next lease back,
        # and its GPU time counts from the report's own date), and a sync of its own after every start
        # doubled the syncs that follow each round's wakes (docs/agent-protocol.md).
        self.on_report(urgent=False)

    # -- shutdown ------------------------------------------------------------------------------

    def stop_all(self, *, grace_s: float, wait_s: float = 5.0) -> None:
        """Stop every lease (SIGTERM, `grace_s`, SIGKILL) and wait for them; their exits are spooled."""
        with self._lock:
            self.pending.clear()
            for run_id in list(self.profiles):
                self.request_stop(run_id, "agent_exit", grace_s)
            for lease_id in list(self.leases):
                self.request_stop(lease_id, "agent_exit", grace_s)
            deadline = time.monotonic() + grace_s + wait_s
            while (self.leases or self.profiles) and time.monotonic() < deadline:
                self.tick()
                if self.leases or self.profiles:
                    time.sleep(0.02)
