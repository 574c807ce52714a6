"""Profiling on arrival (Synergy): hold jobs of unprofiled workloads, run their profiles on agents.

The flow (docs/profiling.md):
1. A round finds a PENDING job whose workload has no sensitivity matrix: it queues one ProfilingRun
   for the workload (enqueuing `workload_profile_task`) and leaves the job out of the round, PENDING
   with reason Profiling. Synergy profiles a job on arrival, before its first allocation.
2. Under the round lock (at the end of a round, or in the task) a queued run gets the GPUs, cores and
   memory left free on one server; rounds then leave them alone (round_inputs subtracts them).
3. The server's agent finds a `profile` command in its poll answer with the core counts to measure,
   and reports each point (`profile_point`) through its spool, under the run's lease id.
4. Each point goes through the pure CPU search (profiles_app.optimistic.next_cpu_counts), which names
   the next core counts, until there are none: the MinIO model derives the full matrix, the workload
   stores it, and an early round places the waiting jobs with it.
A run that fails leaves the workload unprofiled and its jobs are scheduled at the proportional share
(no automatic retry: staff can queue another run); a run whose server goes DOWN starts over elsewhere.

GENIE's lightweight profiling runs (kind genie_predictor, profiles_app/genie_profiling.py) share steps
2 and 3: dispatch gives them 2 GPUs of one server and 1 GPU of a second one when free, the agents
measure configurations instead of core counts, and the last point stores the predictor fit. No job
waits for them.
"""

from __future__ import annotations

import logging
import math
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any
from uuid import UUID

from django.db import transaction
from django.db.models import Q, Sum
from django.utils import timezone

from cluster_app.models import NodeState, Server
from cluster_app.selectors import gpus_active, servers_lock_all, servers_taking_work
from infra.task_send import task_send
from profiles_app import optimistic
from profiles_app.genie_profiling import (
    genie_holds_cpus,
    genie_point_record,
    genie_profiling_run_assign,
    genie_profiling_run_follow_up,
    genie_profiling_run_succeed,
)
from profiles_app.models import (
    ACTIVE_PROFILING_STATES,
    ProfilingKind,
    ProfilingReport,
    ProfilingRun,
    ProfilingRunStatus,
    Workload,
)
from profiles_app.selectors import profiling_holds, workload_profile
from profiles_app.services.profiling_runs import (
    profiling_point_record,
    profiling_run_assign,
    profiling_run_fail,
    profiling_run_queue,
    profiling_run_requeue,
    profiling_run_succeed,
)
from scheduler_app.models import Allocation, AllocationGpu, JobState, PendingReason
from scheduler_app.selectors import JobLike
from scheduler_app.services.job_lifecycle import job_event, job_events_record
from scheduler_app.services.pending_reasons import pending_reasons_mark
from scheduler_app.services.round_lock import round_lock_single_flight
from scheduler_app.services.round_requests import scheduling_round_request_on_commit
from scheduler_app.task_names import WORKLOAD_PROFILE_TASK

logger = logging.getLogger(__name__)

PROFILE_POINT = "profile_point"
PROFILE_ERROR = "profile_error"
PROFILING_REPORT_KINDS = (PROFILE_POINT, PROFILE_ERROR)


# ---------------------------------------------------------------------------------------------------
# The round's side
# ---------------------------------------------------------------------------------------------------


def profiling_jobs_hold(
    *, jobs: Sequence[JobLike], servers: Sequence[Server], now: datetime, held_otherwise: Iterable[int] = ()
) -> set[int]:
    """Round hook: the ids of PENDING jobs that wait for their workload's profile (leave them out).

    Jobs in `held_otherwise` (waiting for their dependencies) get their workload profiled meanwhile,
    as on arrival, but keep the reason they already have.

    Called by the round with its lock held and `servers` then `jobs` locked. Queues a run for every
    unprofiled workload that has no active run and never failed one; restarts runs whose server is
    DOWN; gives each held job the pending reason Profiling (with an event when it changes).
    """
    down = {s.pk for s in servers if s.state == NodeState.DOWN}
    for run in ProfilingRun.objects.select_for_update().filter(
        Q(server_id__in=down) | Q(peer_server_id__in=down, peer_released_at__isnull=True),
        status=ProfilingRunStatus.RUNNING,
    ):
        profiling_run_requeue(run=run, reason=f"server {run.server_id} is down")

    pending = [j for j in jobs if j.state == JobState.PENDING and j.workload_id is not None]
    if not pending:
        return set()
    unprofiled = {
        w.pk: w
        for w in Workload.objects.filter(pk__in={j.workload_id for j in pending})
        if workload_profile(w) is None
    }
    if not unprofiled:
        return set()
    active = {
        r.workload_id: r
        for r in ProfilingRun.objects.filter(workload_id__in=unprofiled, status__in=ACTIVE_PROFILING_STATES)
    }
    failed = set(  # a failed GENIE run does not stop the Synergy profile its jobs wait for
        ProfilingRun.objects.filter(
            workload_id__in=unprofiled,
            status=ProfilingRunStatus.FAILED,
            kind=ProfilingKind.SYNERGY_CPU_SWEEP,
        ).values_list("workload_id", flat=True)
    )
    for workload_id, workload in unprofiled.items():
        if workload_id in active or workload_id in failed:
            continue
        run = profiling_run_queue(workload=workload)
        active[workload_id] = run
        logger.info("workload %s has no profile: profiling run %s queued", workload.name, run.pk)
        transaction.on_commit(lambda run_id=run.pk: enqueue_profile_task(run_id))

    held = [
        job
        for job in pending
        if job.workload_id in active  # else its workload's profiling failed: the proportional share
        and job.pk not in held_otherwise
    ]
    events = [
        job_event(
            job,
            "profiling",
            reason=PendingReason.PROFILING,
            at=now,
            data={"profiling_run": active[job.workload_id].pk, "workload": unprofiled[job.workload_id].name},
        )
        for job in pending_reasons_mark(held, PendingReason.PROFILING)
    ]
    job_events_record(events)
    return {job.pk for job in held}


def enqueue_profile_task(run_id: int) -> None:
    """Ask a worker to dispatch the run now (the next round would, too)."""
    try:
        task_send(WORKLOAD_PROFILE_TASK, args=(run_id,))
    except Exception:  # a broker outage: the next round's dispatch assigns the run anyway
        logger.warning(
            "could not enqueue profiling run %s; the next round dispatches it", run_id, exc_info=True
        )


def _free_resources() -> dict[int, dict[str, Any]]:
    """Per schedulable server: free GPU indices, cores and memory after leases and profiling holds."""
    servers = {s.pk: s for s in servers_taking_work().order_by("id")}
    held_gpus = set(AllocationGpu.objects.filter(released_at__isnull=True).values_list("gpu_id", flat=True))
    used = {
        row["server_id"]: row
        for row in Allocation.objects.filter(ended_at__isnull=True, server_id__in=servers)
        .values("server_id")
        .annotate(cpus=Sum("num_cpus"), mem_gb=Sum("mem_gb"))
    }
    free: dict[int, dict[str, Any]] = {
        sid: {
            "server": s,
            "gpus": [],
            "cpus": s.num_cpus - (used.get(sid, {}).get("cpus") or 0),
            "mem_gb": s.mem_gb - (used.get(sid, {}).get("mem_gb") or 0.0),
        }
        for sid, s in servers.items()
    }
    profiling_gpus: dict[int, set[int]] = defaultdict(set)
    for hold in profiling_holds():
        if hold.server_id in free:
            profiling_gpus[hold.server_id].update(hold.gpu_indices)
            free[hold.server_id]["cpus"] -= hold.num_cpus
            free[hold.server_id]["mem_gb"] -= hold.mem_gb
    for gpu_id, server_id, index, _uuid in gpus_active(server_ids=list(servers)):
        if gpu_id not in held_gpus and index not in profiling_gpus[server_id]:
            free[server_id]["gpus"].append(index)
    return free


def profiling_runs_dispatch(
    *, now: datetime, run_ids: Sequence[int] | None = None, genie: bool = True
) -> list[ProfilingRun]:
    """Give QUEUED runs (oldest first) what is left free on one server each; returns the runs assigned.
    `genie=False` leaves GENIE's runs queued (a round's first dispatch: they gate no job, so they take
    only what the round's plan leaves free, at its second).

    Call with the round lock held (the end of a round, or profiling_run_dispatch), so that no round
    hands the same GPUs out meanwhile. A run needs `num_gpus` free GPUs on one server and at least the
    proportional share of cores; it holds every free core up to the grid's maximum (the search starts
    at the most cores it can measure) and memory up to the grid's maximum (the dataset cached).
    """
    queued = ProfilingRun.objects.select_for_update(of=("self",)).filter(status=ProfilingRunStatus.QUEUED)
    if not genie:
        queued = queued.exclude(kind=ProfilingKind.GENIE_PREDICTOR)
    if run_ids is not None:
        queued = queued.filter(pk__in=list(run_ids))
    queued = list(queued.select_related("workload").order_by("created_at", "id"))
    if not queued:
        return []
    free = _free_resources()
    assigned = []
    for run in queued:
        if run.kind == ProfilingKind.GENIE_PREDICTOR:
            if _genie_dispatch(run, free, now=now):
                assigned.append(run)
            continue
        need_cpus = math.ceil(optimistic.FAIR_CPUS_PER_GPU * run.num_gpus)
        candidates = [
            f
            for f in free.values()
            if len(f["gpus"]) >= run.num_gpus
            and f["cpus"] >= min(need_cpus, f["server"].num_cpus)
            and f["mem_gb"] > 0
        ]
        if not candidates:
            logger.info(
                "profiling run %s waits: no server has %d free GPU(s) and cores", run.pk, run.num_gpus
            )
            continue
        best = max(candidates, key=lambda f: (f["cpus"], f["mem_gb"], -f["server"].pk))
        cpus = int(min(best["cpus"], max(optimistic.CPU_GRID) * run.num_gpus))
        mem_gb = float(min(best["mem_gb"], max(optimistic.MEM_GRID) * run.num_gpus))
        gpus = best["gpus"][: run.num_gpus]
        profiling_run_assign(
            run=run, server=best["server"], gpu_indices=gpus, num_cpus=cpus, mem_gb=mem_gb, now=now
        )
        best["gpus"] = best["gpus"][run.num_gpus :]
        best["cpus"] -= cpus
        best["mem_gb"] -= mem_gb
        assigned.append(run)
    return assigned


def _genie_dispatch(run: ProfilingRun, free: dict[int, dict[str, Any]], *, now: datetime) -> bool:
    """Give a GENIE run 2 free GPUs of one server (else 1) and 1 free GPU of a second server when one is
    free, each with the GPU-proportional share of cores and memory; False when no server has a free
    GPU and a core. `free` is updated. What it cannot measure here, it fills in from the platform
    model, and says why (the run is short: it does not wait for a better placement)."""

    def usable(f: dict[str, Any]) -> bool:
        return bool(f["gpus"]) and f["cpus"] >= 1 and f["mem_gb"] > 0

    candidates = [f for f in free.values() if usable(f)]
    if not candidates:
        logger.info("GENIE profiling run %s waits: no server has a free GPU and core", run.pk)
        return False

    def take(f: dict[str, Any], gpus: int) -> tuple[list[int], int, float]:
        cpus = genie_holds_cpus(gpus, f["cpus"], f["server"].num_cpus)
        mem_gb = float(min(f["mem_gb"], optimistic.FAIR_MEM_GB_PER_GPU * gpus))
        indices = f["gpus"][:gpus]
        f["gpus"], f["cpus"], f["mem_gb"] = f["gpus"][gpus:], f["cpus"] - cpus, f["mem_gb"] - mem_gb
        return indices, cpus, mem_gb

    primary = max(candidates, key=lambda f: (min(len(f["gpus"]), 2), f["cpus"], f["mem_gb"], -f["server"].pk))
    unmeasured: dict[str, str] = {}
    gpus = 2 if len(primary["gpus"]) >= 2 else 1
    if gpus == 1:
        unmeasured["t_intra"] = (
            "no server had 2 free GPUs"
            if any(f["server"].num_gpus >= 2 for f in free.values())
            else "no server has 2 GPUs"
        )
    indices, cpus, mem_gb = take(primary, gpus)
    peers = [f for f in candidates if f is not primary and usable(f)]
    peer = max(peers, key=lambda f: (f["cpus"], f["mem_gb"], -f["server"].pk)) if peers else None
    peer_hold: tuple[list[int], int, float] = ([], 0, 0.0)
    if peer is None:
        others = Server.objects.exclude(pk=primary["server"].pk).exists()
        unmeasured["t_cross"] = "no second server was free" if others else "the cluster has one server"
    else:
        peer_hold = take(peer, 1)
    genie_profiling_run_assign(
        run=run,
        server=primary["server"],
        gpu_indices=indices,
        num_cpus=cpus,
        mem_gb=mem_gb,
        peer=peer["server"] if peer else None,
        peer_gpu_indices=peer_hold[0],
        peer_num_cpus=peer_hold[1],
        peer_mem_gb=peer_hold[2],
        unmeasured=unmeasured,
        now=now,
    )
    return True


def profiling_run_dispatch(*, run_id: int) -> str:
    """Try to start one queued run now (the task's service); returns its status, or "busy" when a
    round holds the lock (that round dispatches queued runs itself at its end)."""
    with round_lock_single_flight() as acquired:
        if not acquired:
            return "busy"
        servers_lock_all()  # the round's lock order: servers first
        run = ProfilingRun.objects.filter(pk=run_id).first()
        if run is None:
            return "missing"
        if run.status == ProfilingRunStatus.QUEUED:
            profiling_runs_dispatch(now=timezone.now(), run_ids=[run_id])
            run.refresh_from_db()
        return run.status


# ---------------------------------------------------------------------------------------------------
# The agent's side
# ---------------------------------------------------------------------------------------------------


def _point(data: Mapping[str, Any]) -> dict[str, Any] | None:
    """A validated measured point, or None when the report is unusable."""
    cpus, seconds = data.get("cpus"), data.get("sec_per_iter")
    if not isinstance(cpus, int) or isinstance(cpus, bool) or cpus < 1:
        return None
    if not isinstance(seconds, int | float) or isinstance(seconds, bool) or not seconds > 0:
        return None
    keep = ("iters", "wall_s", "peak_rss_mb", "mem_gbps", "disk_mbps", "time_scale")
    return {
        "cpus": cpus,
        "sec_per_iter": float(seconds),
        **{
            k: data[k]
            for k in keep
            if isinstance(data.get(k), int | float) and not isinstance(data.get(k), bool)
        },
    }


def profiling_reports_ingest(
    *, server: Server, runs: Mapping[UUID, ProfilingRun], reports: Sequence[Any]
) -> list[tuple[str, int]]:
    """Apply an agent's reports about its profiling runs, each exactly once; returns the acked pairs.

    Called inside agent_reports_ingest's transaction. Each run's row is locked, and (lease_id, seq)
    is unique, so a retried batch applies nothing twice.
    """
    acked: list[tuple[str, int]] = []
    ended = False
    by_run: dict[UUID, list[Any]] = defaultdict(list)
    for r in reports:
        by_run[r.lease_id].append(r)
    for lease_id in sorted(by_run, key=str):
        run = (
            ProfilingRun.objects.select_for_update(of=("self",))
            .select_related("workload", "server")
            .get(pk=runs[lease_id].pk)
        )
        for r in sorted(by_run[lease_id], key=lambda r: r.seq):
            _, created = ProfilingReport.objects.get_or_create(
                lease_id=r.lease_id,
                seq=r.seq,
                defaults={"run": run, "kind": r.kind, "at": r.at, "data": r.data},
            )
            acked.append((str(r.lease_id), r.seq))
            if not created or run.status != ProfilingRunStatus.RUNNING or lease_id not in _lease_ids(run):
                continue  # seen before, or the run ended (a late point) or was requeued meanwhile
            if run.kind == ProfilingKind.GENIE_PREDICTOR:
                ended |= _apply_genie_report(run, r, node_rank=1 if lease_id == run.peer_lease_id else 0)
            else:
                ended |= _apply_profiling_report(run, r)
    if ended:
        scheduling_round_request_on_commit(trigger="profiled")
    return acked


def _lease_ids(run: ProfilingRun) -> tuple[UUID, ...]:
    """The lease ids the run's agents report under: its own, and its GENIE peer's while it has one."""
    return (run.lease_id, run.peer_lease_id) if run.peer_lease_id else (run.lease_id,)


def _apply_profiling_report(run: ProfilingRun, r: Any) -> bool:
    """Apply one new report to a RUNNING run; True when the run ended."""
    if r.kind == PROFILE_ERROR:
        error = str(r.data.get("error") or "the agent could not measure a point")
        profiling_run_fail(run=run, error=f"{error} (at {r.data.get('cpus')} cores)")
        return True
    if r.kind != PROFILE_POINT:
        return False
    point = _point(r.data)
    if point is None:
        profiling_run_fail(run=run, error=f"unusable point {r.data!r}")
        return True
    if not profiling_point_record(run=run, point=point):
        return False
    try:
        workload = profiling_run_succeed(run=run)
    except optimistic.ProfilingError as exc:
        profiling_run_fail(run=run, error=f"no profile from the points: {exc}")
        return True
    # GENIE's profile follows by itself; a round dispatches it on what its plan leaves free, so that
    # the jobs that waited for this profile are placed first.
    genie_profiling_run_follow_up(workload=workload)
    return True


def _genie_point(data: Mapping[str, Any]) -> dict[str, Any] | None:
    """A validated GENIE point (its configuration and time), or None when the report is unusable."""
    config, seconds = data.get("config"), data.get("sec_per_iter")
    if not isinstance(config, str) or not config:
        return None
    if not isinstance(seconds, int | float) or isinstance(seconds, bool) or not 0 < seconds < math.inf:
        return None
    keep = ("iters", "wall_s", "peak_rss_mb", "time_scale", "param_bytes", "startup_s")
    point: dict[str, Any] = {"config": config[:64], "sec_per_iter": float(seconds)}
    for k in keep:
        v = data.get(k)
        if isinstance(v, int | float) and not isinstance(v, bool) and 0 <= v < math.inf:
            point[k] = v
    point["stopped_at_limit"] = data.get("stopped_at_limit") is True
    return point


def _apply_genie_report(run: ProfilingRun, r: Any, *, node_rank: int) -> bool:
    """Apply one new report to a RUNNING GENIE run; True when the run ended. The node rank is the
    lease id's (the run's own: 0, its peer's: 1), never what the report says."""
    if r.kind == PROFILE_ERROR:
        error = str(r.data.get("error") or "the agent could not measure a configuration")
        profiling_run_fail(run=run, error=f"{error} (configuration {r.data.get('config')}, rank {node_rank})")
        return True
    if r.kind != PROFILE_POINT:
        return False
    point = _genie_point(r.data)
    if point is None:
        profiling_run_fail(run=run, error=f"unusable point {r.data!r}")
        return True
    try:
        complete = genie_point_record(run=run, point=point, node_rank=node_rank)
    except ValueError as exc:
        profiling_run_fail(run=run, error=str(exc))
        return True
    if not complete:
        return False
    try:
        genie_profiling_run_succeed(run=run)
    except ValueError as exc:
        profiling_run_fail(run=run, error=f"no GENIE fit from the points: {exc}")
    return True
