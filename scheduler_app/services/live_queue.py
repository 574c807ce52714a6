"""The live queue read once for a forecast (services/forecasts.py): its jobs, who cannot run, its inputs."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

from django.db.models import signals
from django.db.models.base import ModelState

from cluster_app.models import Server
from cluster_app.selectors import servers_taking_work
from profiles_app.models import Workload
from scheduler_app.conf import scheduler_conf
from scheduler_app.core.restarts import RestartPolicy
from scheduler_app.models import Job, JobState, PendingReason
from scheduler_app.selectors import dependency_pending_reason, dependency_waits, round_inputs
from scheduler_app.selectors.rounds import RoundInputs
from scheduler_app.services.gc_pause import gc_paused

LIVE_STATES = (JobState.PENDING, JobState.RUNNING)


@dataclass
class LiveQueue:
    """The live queue as the forecast sees it: its jobs, who cannot run, and the round's inputs."""

    jobs: list[Job]
    held: set[int]
    never: set[int]
    waits: dict
    servers: list[Server]
    inputs: RoundInputs


def live_queue(extra_jobs: Sequence[Job] = ()) -> LiveQueue:
    """Read the live queue once (pending and running jobs, plus just-submitted `extra_jobs`) for a
    forecast and the queue positions. Without the collector's passes (services/gc_pause.py): the
    read's rows, Jobs and views are tens of thousands of objects without cycles, and each pass
    walked them again (the read, the forecast's preparation and the positions at 10,000 live jobs,
    paused there too: 0.31 to 0.34 s of CPU against 0.33 to 0.36, eight alternated runs each)."""
    with gc_paused():
        return _live_queue(extra_jobs)


def _live_queue(extra_jobs: Sequence[Job]) -> LiveQueue:
    jobs = live_jobs()
    known = {j.pk for j in jobs}
    jobs += [j for j in extra_jobs if j.pk not in known]
    # Held jobs do not run until released: not in the forecast. Jobs after others (afterok) join its
    # queue when those finish in it; a job after one that ended without completing never runs.
    held = {j.pk for j in jobs if j.held and j.state == JobState.PENDING}
    waits = dependency_waits(job_ids=[j.pk for j in jobs if j.state == JobState.PENDING and j.pk not in held])
    never = {
        job_id
        for job_id, deps in waits.items()
        if dependency_pending_reason(deps.values()) == PendingReason.DEPENDENCY_NEVER_SATISFIED
    }
    servers = list(servers_taking_work())
    inputs = round_inputs(servers=servers, jobs=[j for j in jobs if j.pk not in held and j.pk not in never])
    return LiveQueue(jobs=jobs, held=held, never=never, waits=waits, servers=servers, inputs=inputs)


def live_jobs() -> list[Job]:
    """Every pending and running job, each with its workload (the catalog read once and shared: a join
    would build, and decode the JSON of, one workload per job).

    The rows are read as values and made into Jobs the way Model.from_db makes them (every concrete
    field's value under its attname, the state of a row loaded from the database) without its
    per-row __init__: the same objects for a third of the CPU at 10,000 live jobs (0.06 against 0.18
    s, most of what reading the queue cost in Python; tests/scheduler_app/test_live_queue.py compares
    them field by field). Where a receiver listens to Job's pre_init or post_init (none in this
    project), __init__ runs, so that it still hears of every instance."""
    queryset = Job.objects.filter(state__in=LIVE_STATES)
    if signals.pre_init.has_listeners(Job) or signals.post_init.has_listeners(Job):
        jobs = list(queryset)
    else:
        names = [field.attname for field in Job._meta.concrete_fields]
        jobs = []
        new, append = Job.__new__, jobs.append
        db = queryset.db
        for row in queryset.values_list(*names):
            job = new(Job)
            state = ModelState()
            state.adding, state.db = False, db
            values = job.__dict__
            values.update(zip(names, row, strict=True))
            values["_state"] = state
            append(job)
    workloads = Workload.objects.in_bulk({j.workload_id for j in jobs if j.workload_id is not None})
    for job in jobs:
        workload_id = job.__dict__["workload_id"]
        if workload_id is not None:
            # What assigning job.workload does for a workload of this id (ForeignKey's descriptor),
            # without its checks on each of 10,000 rows; a fresh row's cache holds nothing else.
            job._state.fields_cache = {"workload": workloads[workload_id]}
    return jobs


def live_restarts(servers: Sequence[Server]) -> RestartPolicy | None:
    """The restart policy the live round decides with (services/rounds.py), for a forecast of it: the
    settings', with every server whose agent cannot resize a running job in place (`live_resize`
    off) static, a resize there being a restart. Without it a forecast priced those resizes as free
    and planned what the live round does not: at 10,000 live jobs on 500 servers without live
    resizes, 249 more starts in its first round than the round itself, genie then moving 865 running
    jobs each round and the guard pinning them, so that no round was reused (docs/performance.md)."""
    restarts = scheduler_conf().restarts
    if restarts is None:
        return None
    resizable = frozenset(s.id for s in servers if s.live_resize)
    return dataclasses.replace(restarts, static_servers=frozenset(s.id for s in servers) - resizable)
