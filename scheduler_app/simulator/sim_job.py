"""One simulated job's mutable state: its progress, its lease and the JobView the core reads."""

from __future__ import annotations

import math
from collections.abc import Callable
from enum import Enum

from scheduler_app.core.restarts import Change, change_of
from scheduler_app.core.throughput import job_profile
from scheduler_app.core.types import JobView, Placement, SensitivityProfile
from scheduler_app.simulator.metrics import JobRecord
from scheduler_app.simulator.trace import TraceJob


def _view_builder() -> Callable[..., JobView]:
    """A function building a JobView from all its fields, positionally in their order, as the
    dataclass's own __init__ does (each slot set once), without its per-field attribute lookups:
    about 2.5x faster, and a simulation reading progress builds a view per running job per round."""
    names = JobView.__slots__
    namespace: dict = {"new": object.__new__, "JobView": JobView}
    for name in names:
        namespace[f"set_{name}"] = getattr(JobView, name).__set__
    body = "".join(f"    set_{name}(view, {name})\n" for name in names)
    source = f"def build({', '.join(names)}):\n    view = new(JobView)\n{body}    return view\n"
    exec(source, namespace)  # generated from JobView's own slots, as dataclasses generates __init__
    return namespace["build"]


# job_view() passes every field in this order: a field added to JobView must be added there too.
_VIEW_FIELDS = (
    "job_id",
    "num_gpus",
    "arrival_s",
    "profile",
    "total_iters",
    "done_iters",
    "attained_service_gpu_s",
    "cpus_per_gpu_override",
    "mem_gb_per_gpu_override",
    "deadline_s",
    "priority",
    "current",
    "team_id",
    "owner_id",
    "owner_usage_gpu_s",
    "num_nodes",
    "min_rate_iters_per_s",
    "gpu_choices",
    "startup_s",
    "checkpoint_every_s",
    "lease_started_s",
)
if JobView.__slots__ != _VIEW_FIELDS:
    raise ImportError("JobView's fields changed: update sim_job.py's _VIEW_FIELDS and SimJob.job_view")
_build_view = _view_builder()


class Lease(Enum):
    """What a round's placement is to a job's current lease."""

    CONTINUES = "continues"  # kept (or resized in place)
    FIRST = "first"  # the job's first start
    RESTART = "restart"  # moved, resized with a restart, or resumed after a pause


class SimJob:
    """Mutable per-job state; `view` caches the JobView until the job's state changes."""

    __slots__ = (
        "arrival_s",
        "attained_gpu_s",
        "charges_work",
        "checkpoint_every_s",
        "ckpt_iters",
        "cpus_per_gpu_override",
        "current",
        "deadline_s",
        "done_iters",
        "finish_s",
        "first_start_waits",
        "gpu_choices",
        "has_run",
        "iter_time_s",
        "job_id",
        "lease_started_s",
        "lost_gpu_s",
        "mem_gb_per_gpu_override",
        "min_rate_iters_per_s",
        "model",
        "moves",
        "num_gpus",
        "num_nodes",
        "owner_base_usage_gpu_s",
        "owner_id",
        "preemptions",
        "priority",
        "profile",
        "resources",
        "restart_lease",
        "since_ckpt_s",
        "start_s",
        "startup_left_s",
        "startup_s",
        "team_id",
        "total_iters",
        "view",
    )

    def __init__(self, trace_job: TraceJob, profile: SensitivityProfile) -> None:
        self.job_id = trace_job.job_id
        self.model = trace_job.model
        self.num_gpus = trace_job.num_gpus
        self.num_nodes = trace_job.num_nodes
        self.arrival_s = float(trace_job.arrival_s)
        self.total_iters = float(trace_job.total_iters)
        self.deadline_s = None if trace_job.deadline_s is None else float(trace_job.deadline_s)
        self.min_rate_iters_per_s = trace_job.min_rate_iters_per_s
        self.gpu_choices = trace_job.gpu_choices
        # The workload's profile for this GPU count (a GENIE fit times k GPUs apart from 1), as the
        # live service's JobView holds it.
        self.profile = profile = job_profile(profile, trace_job.num_gpus)
        self.iter_time_s = profile.iter_time_s
        self.done_iters = 0.0
        self.attained_gpu_s = 0.0
        self.current: Placement | None = None
        self.view: JobView | None = None
        self.resources: tuple[int, float, float, float, float] | None = None  # of `current`
        self.start_s: float | None = None
        self.finish_s: float | None = None
        self.has_run = False
        self.preemptions = 0  # leases ended by the scheduler (moved, paused, resized with a restart)
        self.moves = 0  # of which onto other GPUs or servers
        self.lost_gpu_s = 0.0  # GPU-seconds of restarts' start-ups and of work done again
        self.cpus_per_gpu_override: float | None = None
        self.mem_gb_per_gpu_override: float | None = None
        self.priority = 0
        self.team_id: int | None = None
        self.owner_id = trace_job.owner_id
        # The owner's usage from before the simulation (a forecast of the live queue); what the
        # owner's jobs attain during it is added by the run (SimRun.owner_gained_gpu_s).
        self.owner_base_usage_gpu_s = 0.0
        # Restart costs (set_costs); the defaults charge nothing.
        self.startup_s = 0.0
        self.checkpoint_every_s: float | None = None
        self.charges_work = False  # a restart loses the run since the last checkpoint
        self.first_start_waits = False  # the first start waits its start-up too
        # The current lease.
        self.lease_started_s: float | None = None
        self.startup_left_s = 0.0
        self.since_ckpt_s = 0.0  # run (after the start-up) since the last checkpoint
        self.ckpt_iters = 0.0  # progress saved at the last checkpoint
        self.restart_lease = False  # this lease is a restart: its start-up is a loss

    @classmethod
    def from_view(cls, view: JobView, model: str = "", *, now_s: float = 0.0, costs: bool = False) -> SimJob:
        """A live job as the core sees it (progress, service, overrides and placement kept).

        With `costs`, its start-up and checkpoint interval are the view's, and a running job's lease
        (from `view.lease_started_s`, on the clock of `now_s`) is part-way through its start-up or
        its checkpoint interval accordingly.
        """
        job = cls(
            TraceJob(view.job_id, model, view.arrival_s, 1, view.num_gpus, view.deadline_s), view.profile
        )
        job.total_iters = float(view.total_iters)
        job.done_iters = float(view.done_iters)
        job.attained_gpu_s = float(view.attained_service_gpu_s)
        job.cpus_per_gpu_override = view.cpus_per_gpu_override
        job.mem_gb_per_gpu_override = view.mem_gb_per_gpu_override
        job.priority = view.priority
        job.team_id = view.team_id
        job.owner_id = view.owner_id
        job.num_nodes = view.num_nodes
        job.min_rate_iters_per_s = view.min_rate_iters_per_s
        job.gpu_choices = view.gpu_choices
        job.owner_base_usage_gpu_s = view.owner_usage_gpu_s
        job.current = view.current
        job.has_run = view.current is not None
        if costs:
            job.set_costs(view.startup_s, view.checkpoint_every_s, charges_work=True, first_start_waits=True)
        job.ckpt_iters = job.done_iters
        if view.current is not None:
            job.lease_started_s = started = now_s if view.lease_started_s is None else view.lease_started_s
            elapsed_s = max(0.0, now_s - started)
            if costs:
                job.startup_left_s = max(0.0, job.startup_s - elapsed_s)
                run_s = max(0.0, elapsed_s - job.startup_s)
                every_s = job.checkpoint_every_s
                job.since_ckpt_s = run_s % every_s if every_s else run_s
                rate = view.current.speedup / view.profile.iter_time_s
                job.ckpt_iters = max(0.0, job.done_iters - job.since_ckpt_s * rate)
        return job

    def set_costs(
        self,
        startup_s: float,
        checkpoint_every_s: float | None,
        *,
        charges_work: bool,
        first_start_waits: bool,
    ) -> None:
        self.startup_s = float(startup_s)
        self.checkpoint_every_s = checkpoint_every_s
        self.charges_work = charges_work
        self.first_start_waits = first_start_waits
        self.view = None

    def job_view(self, owner_usage_gpu_s: float = 0.0) -> JobView:
        view = self.view
        if view is None or view.owner_usage_gpu_s != owner_usage_gpu_s:
            view = _build_view(
                self.job_id,
                self.num_gpus,
                self.arrival_s,
                self.profile,
                self.total_iters,
                self.done_iters,
                self.attained_gpu_s,
                self.cpus_per_gpu_override,
                self.mem_gb_per_gpu_override,
                self.deadline_s,
                self.priority,
                self.current,
                self.team_id,
                self.owner_id,
                owner_usage_gpu_s,
                self.num_nodes,
                self.min_rate_iters_per_s,
                self.gpu_choices,
                self.startup_s,
                self.checkpoint_every_s,
                self.lease_started_s if self.current is not None else None,
            )
            self.view = view
        return view

    def lease_of(self, placement: Placement, in_place: bool) -> Lease:
        """What running on `placement` this round is to the job's lease."""
        change = change_of(self.current, placement)
        if change is None:
            return Lease.RESTART if self.has_run else Lease.FIRST
        if change is Change.KEPT or (change is Change.RESIZED and in_place):
            return Lease.CONTINUES
        return Lease.RESTART

    def startup_for(self, lease: Lease) -> float:
        """Seconds without progress that a placement of kind `lease` begins with."""
        if lease is Lease.CONTINUES:
            return self.startup_left_s
        if lease is Lease.FIRST and not self.first_start_waits:
            return 0.0
        return self.startup_s

    def remaining_after(self, lease: Lease) -> float:
        """Iterations left once a placement of kind `lease` has begun (a restart redoes lost work)."""
        rolls_back = lease is Lease.RESTART and self.charges_work and self.current is not None
        return self.total_iters - (self.ckpt_iters if rolls_back else self.done_iters)

    def end_lease(self) -> None:
        """The scheduler stops the job: its run since the last checkpoint is lost where that is charged."""
        if self.charges_work and self.current is not None:
            lost_s = self.since_ckpt_s
            self.lost_gpu_s += lost_s * self.current.num_gpus
            self.done_iters = min(self.done_iters, self.ckpt_iters)
        self.since_ckpt_s = 0.0
        self.startup_left_s = 0.0
        self.lease_started_s = None

    def begin_lease(self, lease: Lease, now_s: float) -> None:
        self.startup_left_s = self.startup_for(lease)
        self.lease_started_s = now_s
        self.since_ckpt_s = 0.0
        self.ckpt_iters = self.done_iters
        self.restart_lease = lease is Lease.RESTART

    def progress(self, run_s: float, iters: float, iters_per_s: float, whole: bool) -> None:
        """Credit `iters` iterations done in `run_s` seconds at `iters_per_s`, saving a checkpoint at
        every `checkpoint_every_s` seconds of run (`whole`: checkpoints hold whole iterations)."""
        before = self.done_iters
        self.done_iters += iters
        every_s = self.checkpoint_every_s
        total_s = self.since_ckpt_s + run_s
        saves = math.floor(total_s / every_s) if every_s else 0
        if saves:
            at_s = saves * every_s - self.since_ckpt_s  # seconds into this stretch of the last save
            saved = at_s * iters_per_s
            self.ckpt_iters = min(self.done_iters, before + (math.floor(saved) if whole else saved))
            total_s -= saves * every_s
        self.since_ckpt_s = total_s

    def record(self) -> JobRecord:
        jct_s = None if self.finish_s is None else self.finish_s - self.arrival_s
        rate = None
        if self.min_rate_iters_per_s is not None and self.finish_s is not None and self.start_s is not None:
            # Its average rate from its first start to its finish (pauses and restarts count against it).
            rate = self.total_iters / max(self.finish_s - self.start_s, 1e-9)
        return JobRecord(
            job_id=self.job_id,
            model=self.model,
            num_gpus=self.num_gpus,
            arrival_s=self.arrival_s,
            start_s=self.start_s,
            finish_s=self.finish_s,
            jct_s=jct_s,
            preemptions=self.preemptions,
            deadline_s=self.deadline_s,
            min_rate_iters_per_s=self.min_rate_iters_per_s,
            avg_rate_iters_per_s=rate,
            moves=self.moves,
            restart_lost_gpu_s=self.lost_gpu_s,
        )
