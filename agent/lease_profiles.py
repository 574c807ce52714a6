"""Profiling runs beside the leases (`profile` commands, agent/profiler.py): one measurement process at a
time per run, on cores no lease uses; part of the LeaseManager, under its lock."""

from __future__ import annotations

import logging
import re
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from agent.accounts import JobIdentity
from agent.bandwidth import NodeBandwidths
from agent.exit_status import ExitStatus
from agent.launcher import Launcher
from agent.lease_state import Lease
from agent.profiler import GENIE_TERM_GRACE_S, POINT_TIMEOUT_S, ProfileTask, point_result, point_spec
from agent.spool import Spool

log = logging.getLogger(__name__)

SAFE_LEASE_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")  # it names a directory


class ProfileRuns:
    """The profiling half of agent/leases.py's LeaseManager, which provides these attributes."""

    profiles: dict[str, ProfileTask]
    leases: dict[str, Lease]
    spool: Spool
    launcher: Launcher
    identity: JobIdentity
    bandwidths: NodeBandwidths
    work_dir: Path
    time_scale: float
    draining: bool
    on_report: Callable[..., None]
    _cpu_use: Callable[[], dict[int, int]]  # each core's lease and run count

    def _profile_command(self, command: dict[str, Any]) -> None:
        """A `profile` command: start the task, or take the service's new list of core counts."""
        run_id = str(command["lease_id"])
        if not SAFE_LEASE_ID.match(run_id):
            log.error("ignoring profiling run with unsafe id %r", run_id)
            return
        task = self.profiles.get(run_id)
        if task is None:
            self.profiles[run_id] = ProfileTask(run_id, command, warmup_pending=bool(command.get("warmup")))
            log.info(
                "profiling run %s (%s): %s cores held, measuring %s",
                run_id,
                command.get("workload"),
                command.get("num_cpus"),
                command.get("cpu_counts"),
            )
        elif task.stop_kind is None:
            task.command = command

    def _stop_profile(self, task: ProfileTask, kind: str, grace_s: float) -> None:
        """The service ended the run (done, failed, or gone): stop its measurement, then forget it."""
        if task.stop_kind is not None:
            return
        task.stop_kind = kind
        if task.process is None:
            del self.profiles[task.run_id]
            log.info("profiling run %s ended (%s)", task.run_id, kind)
            return
        task.stop_deadline_s = time.time() + max(0.0, grace_s)
        task.process.signal_group(signal.SIGTERM)

    def _supervise_profile(self, task: ProfileTask) -> None:
        if task.process is not None:
            status = task.process.exited()
            if status is None:
                now = time.time()
                overdue = task.stop_deadline_s is not None and now >= task.stop_deadline_s
                limit = task.current.max_s if task.current is not None else None
                if limit is not None and not task.term_sent and now - task.started_s >= limit:
                    # GENIE's bound per configuration: the workload checkpoints on SIGTERM and its
                    # progress file keeps the speed it measured, so the point still counts.
                    log.info(
                        "profiling run %s: %s reached its %.0f s bound", task.run_id, task.current_key, limit
                    )
                    task.process.signal_group(signal.SIGTERM)
                    task.term_sent = True
                    task.stop_deadline_s = task.stop_deadline_s or now + GENIE_TERM_GRACE_S
                timed_out = now - task.started_s > POINT_TIMEOUT_S
                if not task.killed and (overdue or timed_out):
                    log.warning("profiling run %s: point %s killed", task.run_id, task.current_key)
                    task.process.signal_group(signal.SIGKILL)
                    task.killed = True
                return
            self._profile_point_done(task, status)
        if task.stop_kind is not None:
            del self.profiles[task.run_id]
            log.info("profiling run %s ended (%s)", task.run_id, task.stop_kind)
            return
        if task.failed or self.draining:
            return
        plan = task.next_point()
        if plan is None:
            return  # measured all it was asked for: the service answers with more, or ends the run
        if any(set(plan.gpu_uuids) & set(lease.spec.gpu_uuids) for lease in self.leases.values()):
            return  # a stopping lease still holds the GPUs
        use_count = self._cpu_use()
        free = [cpu for cpu, used in use_count.items() if used == 0]
        if len(free) < plan.cpus:
            return  # never share cores while measuring: the time would be wrong
        warmup = task.warmup_pending
        try:
            # Catalog-like: as the agent's job account, never as the profiled job's owner.
            spec = point_spec(
                task,
                plan,
                work_dir=self.work_dir,
                cpus=tuple(free[: plan.cpus]),
                time_scale=self.time_scale,
                warmup=warmup,
                account=self.identity.account_for(None),
            )
            process, _facts = self.launcher.launch(spec)
        except (OSError, ValueError, TypeError, KeyError) as exc:
            task.failed = True
            self.spool.append(task.run_id, "profile_error", {**plan.ident, "error": f"start failed: {exc}"})
            self.on_report()
            return
        task.process, task.spec, task.current = process, spec, plan
        task.current_is_warmup, task.started_s = warmup, time.time()
        task.killed = task.term_sent = False
        task.stop_deadline_s = None
        log.info(
            "profiling run %s: %s %s (pid %d)",
            task.run_id,
            "warm-up" if warmup else "point",
            task.current_key,
            process.pid,
        )

    def _profile_point_done(self, task: ProfileTask, status: ExitStatus) -> None:
        assert task.spec is not None and task.current is not None
        wall_s = time.time() - task.started_s
        spec, plan, warmup = task.spec, task.current, task.current_is_warmup
        point = task.current_key
        stopped_at_limit = task.term_sent and task.stop_kind is None
        task.process = task.spec = task.current = None
        task.term_sent = False
        task.stop_deadline_s = None if task.stop_kind is None else task.stop_deadline_s
        if task.stop_kind is not None:
            return  # stopped on the service's word: nothing to report
        kind, data = point_result(
            spec,
            status,
            ident=plan.ident,
            wall_s=wall_s,
            time_scale=self.time_scale,
            stopped_at_limit=stopped_at_limit,
        )
        if warmup and kind == "profile_point":
            task.warmup_pending = False
            log.info("profiling run %s: warm-up %s took %.1f s", task.run_id, point, wall_s)
            return
        if kind == "profile_point":
            task.measured.add(plan.key)
            data.update(self.bandwidths.get())
            log.info(
                "profiling run %s: %s -> %.4g s/iteration (%.1f s)",
                task.run_id,
                point,
                data["sec_per_iter"],
                wall_s,
            )
        else:
            task.failed = True
            log.error("profiling run %s: %s", task.run_id, data["error"])
        self.spool.append(task.run_id, kind, data)
        self.on_report()
