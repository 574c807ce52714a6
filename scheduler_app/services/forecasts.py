"""One forecast of the live queue: when each pending or running job starts and finishes, from now.

Every time the service shows (the queue, the job page, the API, `cli queue` and `cli show`) reads the
estimate this module stores (JobForecast: services/forecast_store.py), refreshed after scheduling
rounds (on the forecasts worker in parts, services/forecast_cycle.py) and at submission, with
as of when it holds (services/forecast_as_of.py);
the prediction made at submission (services/admission.py) comes from the same function, so the two
differ only by what happened in between.

The forecast plays the queue forward with the simulator's forecast (the same core, policy and
allocator as the live rounds, no future arrivals) in wall-clock time: a running job goes at the speed
its agent measures, a job not yet measured at its profile's speed times its servers' time scale (a
fake node with time scale 0.05 runs its synthetic jobs 20 times faster than their profiles).
"""

from __future__ import annotations

import dataclasses
import logging
import math
import statistics
import time
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.db import transaction
from django.db.models import Max
from django.utils import timezone

from cluster_app.models import Server
from notify_app.services.events import notification_qos_at_risk
from scheduler_app.conf import scheduler_conf
from scheduler_app.core.move_guard import one_server_views
from scheduler_app.core.types import ClusterSnapshot, JobView
from scheduler_app.models import Job, JobForecast, JobState
from scheduler_app.selectors import (
    array_limits_of,
    borrowing_teams,
    jobs_run_time_s,
    next_round_at,
    own_command_iter_time_s,
    team_quotas_left,
)
from scheduler_app.selectors.rounds import RoundInputs
from scheduler_app.services.forecast_as_of import forecast_confirm
from scheduler_app.services.forecast_store import (  # noqa: F401 (also this module's: admission.py's)
    Estimate,
    job_forecasts_store,
    job_positions_store,
)
from scheduler_app.services.gc_pause import gc_paused
from scheduler_app.services.live_queue import LiveQueue, live_queue, live_restarts
from scheduler_app.simulator.forecast import ForecastRun
from scheduler_app.simulator.forecast import JobForecast as JobForecastTimes

logger = logging.getLogger(__name__)

OWN_COMMAND_UNKNOWN = "own command without a time limit: its finish cannot be predicted"
NEVER_STARTS = "a job it depends on ended without completing: it will not start"
HELD = "held: it starts only once released"
NOT_SCHEDULABLE = "the job's servers are not schedulable"
TIME_LIMIT_ENDS = "ends at its time limit (TIMEOUT), before the work it asked for is done"
UNKNOWN_LENGTH_ITER_S = 1e12  # far past any horizon
BEYOND_WINDOW = "queued behind the {window} jobs the forecast plays forward (the last of them starts {after})"


def _at(seconds: float | None) -> datetime | None:
    if seconds is None or not math.isfinite(seconds):
        return None
    return datetime.fromtimestamp(seconds, tz=timezone.get_current_timezone())


def cluster_time_scale(servers: Sequence[Server]) -> float:
    """How much faster than wall time the schedulable servers run their jobs' iterations: 1 on real
    nodes; a fake node's --time-scale (0.05: 20 times faster). The median, should they differ."""
    scales = [s.time_scale for s in servers if s.time_scale and s.time_scale > 0]
    return statistics.median(scales) if scales else 1.0


def _in_wall_time(view: JobView, job: Job, leases, scale: float, now_s: float) -> JobView:
    """The view with its profile's seconds per iteration (and its start-up) in wall time: from the speed
    the job's agent measures while it runs (its current placement's speed-up over the measured
    iterations per second), else the profile's times the cluster's time scale; an own command sized
    by its time limit is as long as that limit in wall time. An own command that nothing sizes (no
    measure, no time limit) never ends in the forecast: what waits for its GPUs gets no time, not a
    guess."""
    measured = [lease.iters_per_s for lease in leases if lease.iters_per_s] if job.total_iters else []
    if job.workload_id is None and own_command_iter_time_s(job, measured) is None:
        iter_time_s = UNKNOWN_LENGTH_ITER_S
    elif job.workload_id is None and not measured:
        # Sized by its time limit, which the service enforces in wall time on every node: already
        # wall seconds (scaled, a demo's own command looked 20 times shorter than its limit).
        iter_time_s = view.profile.iter_time_s
    elif measured and view.current is not None and view.current.speedup > 0:
        iter_time_s = view.current.speedup / max(measured)
    else:
        iter_time_s = view.profile.iter_time_s * scale
    # The start-up is in the job's own time too (agents divide a fake node's measure by its scale), and
    # so is its lease's age (round_inputs counts it back from `now_s` in the job's own seconds).
    startup_s = view.startup_s * scale
    lease_started_s = view.lease_started_s
    if lease_started_s is not None:
        lease_started_s = now_s - (now_s - lease_started_s) * scale
    if (iter_time_s, startup_s, lease_started_s) == (
        view.profile.iter_time_s,
        view.startup_s,
        view.lease_started_s,
    ):
        return view
    return dataclasses.replace(
        view,
        profile=dataclasses.replace(view.profile, iter_time_s=iter_time_s),
        startup_s=startup_s,
        lease_started_s=lease_started_s,
    )


@dataclass
class QueueForecast:
    """A forecast of the live queue made ready to play (live_forecast's first half): the estimates
    known without playing anything (held jobs, jobs that never start or that no schedulable server
    takes), the jobs to play forward and those behind the window, and what turns the forecast's
    times into estimates. `run`: the forecast itself, when queue_forecast made it (None: nothing to
    play). Picklable, so that the refresh can play it over several tasks (services/forecast_cycle.py)."""

    now: datetime
    known: dict[int, Estimate]
    placeable: list[int]
    behind: list[int]
    window_jobs: int | None
    horizon: str
    # What _estimate reads of each placeable job: its workload id and the run time its time limit
    # leaves it from `now` (None: no limit).
    lengths: dict[int, tuple[int | None, float | None]] = dataclasses.field(default_factory=dict)
    started: set[int] = dataclasses.field(default_factory=set)  # placeable jobs already running
    run: ForecastRun | None = None

    def estimates(
        self,
        predicted: Mapping[int, JobForecastTimes],
        job_ids: Iterable[int],
        *,
        cut_short: bool,
        budget_s: float,
        reached: datetime | None = None,
    ) -> dict[int, Estimate]:
        """The placeable `job_ids`' estimates from the forecast's times (`predicted`). `reached`: where
        a forecast cut short stopped (its next round's time), the earliest start or finish of a job it
        had not started or finished by then."""
        out = {}
        for job_id in job_ids:
            workload_id, limit_left_s = self.lengths[job_id]
            one = predicted[job_id]
            start = _at(one.start_s)
            limit_end = None
            if limit_left_s is not None and start is not None:
                # Its run time is charged from its start on (a running job's: from now), and the
                # service ends it there (TIMEOUT) whatever work is left.
                limit_end = max(start, self.now) + timedelta(seconds=max(0.0, limit_left_s))
            out[job_id] = _estimate(
                workload_id,
                limit_end if one.timed_out or workload_id is None else None,
                start,
                _at(one.finish_s),
                cut_short,
                budget_s,
                self.horizon,
                reached,
            )
        return out

    def behind_estimates(self, played: Mapping[int, Estimate]) -> dict[int, Estimate]:
        """The estimates of the jobs behind the window, once `played` holds every placeable job's."""
        if not self.behind:
            return {}
        if not self.placeable:
            return _behind(self.behind, self.window_jobs, _latest_stored_start())
        starts = [played[job_id].start_at for job_id in self.placeable if job_id not in self.started]
        return _behind(self.behind, self.window_jobs, max(starts) if starts and all(starts) else None)


@dataclass
class _Play:
    """A prepared forecast's arguments: simulator/forecast.py's `forecast` or ForecastRun's."""

    snapshot: ClusterSnapshot
    views: list[JobView]
    kwargs: dict[str, Any]


def live_forecast(
    *,
    now: datetime,
    budget_s: float,
    targets: Collection[int] | None = None,
    extra_jobs: Sequence[Job] = (),
    early_round: bool = False,
    queue: LiveQueue | None = None,
    window_jobs: int | None = None,
) -> dict[int, Estimate]:
    """Estimates for the `targets` (default: every pending or running job), from one forecast of the
    live queue. `extra_jobs`: jobs to add to the queue as they are (just submitted, not yet visible).
    `early_round`: a submission asks for a round right away (inline) or after early_round_delay_s,
    so the forecast's first round is then, not the next periodic one.

    `window_jobs`: play forward only until the running jobs and the first `window_jobs` pending ones
    in the policy's order have finished; the pending jobs behind them are told so (BEYOND_WINDOW, with
    the latest start in the window as the earliest theirs can be). Under a static order (FIFO) the
    jobs behind are not simulated at all, so the forecast's cost follows the window, not the queue."""
    # Made ready without the collector too: its views and (without `queue`) the queue's read are tens
    # of thousands of objects that reference counting frees (services/gc_pause.py).
    with gc_paused():
        ready, play = _prepared(now, targets, extra_jobs, early_round, queue, window_jobs)
    out = dict(ready.known)
    if play is None:
        out.update(ready.behind_estimates({}))
        return out
    wall_start = time.perf_counter()
    # Without the collector's passes (services/gc_pause.py): a forecast builds and frees, round after
    # round, views, plans and states that reference counting frees (its cyclic garbage: under a
    # hundred objects), while each full pass walked every live job's objects again: 4.2 of 15 s of
    # CPU in the whole forecast at 4,000 GPUs (bench.forecast_refresh), the same estimates.
    with gc_paused():
        run = ForecastRun(play.snapshot, play.views, **play.kwargs)
        cut_short = not run.play(lambda _round_cpu_s: time.perf_counter() - wall_start > budget_s)
        predicted = run.results()
    reached = _at(run.next_round_s) if cut_short else None
    played = ready.estimates(
        predicted, ready.placeable, cut_short=cut_short, budget_s=budget_s, reached=reached
    )
    out.update(played)
    out.update(ready.behind_estimates(played))
    return out


def queue_forecast(
    *, now: datetime, window_jobs: int | None = None, queue: LiveQueue | None = None
) -> QueueForecast:
    """The forecast of every live job (live_forecast's, on the same arguments) made ready to play in
    parts: its ForecastRun built, no round played yet."""
    with gc_paused():  # as live_forecast's; building the run copies every played job's state
        ready, play = _prepared(now, None, (), False, queue, window_jobs)
        if play is not None:
            ready.run = ForecastRun(play.snapshot, play.views, **play.kwargs)
    return ready


def _prepared(
    now: datetime,
    targets: Collection[int] | None,
    extra_jobs: Sequence[Job],
    early_round: bool,
    queue: LiveQueue | None,
    window_jobs: int | None,
) -> tuple[QueueForecast, _Play | None]:
    """live_forecast's forecast made ready, and its arguments (None: nothing to play forward)."""
    conf = scheduler_conf()
    queue = queue or live_queue(extra_jobs)
    inputs = queue.inputs
    wanted = set(targets) if targets is not None else {j.pk for j in queue.jobs}
    out: dict[int, Estimate] = {job_id: Estimate(None, None, HELD) for job_id in queue.held & wanted}
    placeable = []
    for job_id in sorted(wanted - out.keys()):
        if job_id in queue.never:
            out[job_id] = Estimate(None, None, NEVER_STARTS)
        elif job_id not in inputs.jobs:
            out[job_id] = Estimate(None, None, NOT_SCHEDULABLE)
        else:
            placeable.append(job_id)
    horizon = f"within the forecast's {conf.forecast_horizon_h:g} h"
    ready = QueueForecast(now, out, placeable, [], window_jobs, horizon)
    if not placeable:
        return ready, None
    jobs = [j for j in queue.jobs if j.pk not in queue.held and j.pk not in queue.never]
    scale = cluster_time_scale(queue.servers)
    views = [
        _in_wall_time(v, inputs.jobs[v.job_id], inputs.leases_by_job.get(v.job_id, ()), scale, inputs.now_s)
        for v in inputs.views
    ]
    if window_jobs is not None:
        ready.placeable, ready.behind, views = _window(
            placeable, views, inputs, now, window_jobs, queue.waits
        )
    restarts = live_restarts(queue.servers)
    if restarts is not None and restarts.one_server:
        # What the move guard does to every round's views (core/engine.py), done once here: a view
        # already on one server is left as it is, so the simulated rounds no longer copy every job's
        # view each round (most of a deep queue's forecast time). Same views, same plans.
        views = one_server_views(views, inputs.snapshot)
    if not ready.placeable:  # every target behind the window: nothing to play forward
        return ready, None
    # The start a running job keeps. A job sent back to the queue (preempted, requeued) keeps its first
    # `started_at` for its history, but its estimate is when it starts again: not in here.
    started_s = {
        j.pk: j.started_at.timestamp()
        for j in jobs
        if j.state == JobState.RUNNING and j.started_at is not None and j.pk in inputs.jobs
    }
    ready.started = {job_id for job_id in ready.placeable if job_id in started_s}
    limited = {job_id: limit_s for job_id in ready.placeable if (limit_s := inputs.jobs[job_id].time_limit_s)}
    used_s = jobs_run_time_s(job_ids=limited, now=now) if limited else {}
    ready.lengths = {
        job_id: (
            inputs.jobs[job_id].workload_id,
            limited[job_id] - used_s.get(job_id, 0.0) if job_id in limited else None,
        )
        for job_id in ready.placeable
    }
    first_round_s = _first_round_at(now, early_round).timestamp()
    # The run time each limit leaves at the forecast's first round: a running job runs on until then.
    time_left_s = {
        job_id: left_s - (first_round_s - now.timestamp() if job_id in ready.started else 0.0)
        for job_id, (_, left_s) in ready.lengths.items()
        if left_s is not None
    }
    kwargs = {
        "policy": conf.policy_obj(),
        "allocator": conf.allocator,
        "first_round_s": first_round_s,
        "round_s": conf.round_s,
        "started_s": started_s,
        "until_finished": ready.placeable,
        "max_rounds": max(1, math.ceil(conf.forecast_horizon_h * 3600 / conf.round_s)),
        "team_quota_gpus": team_quotas_left(jobs=jobs, frozen_job_ids=inputs.frozen_job_ids),
        "borrowing_teams": borrowing_teams(),
        "after": {job_id: deps.keys() for job_id, deps in queue.waits.items() if job_id not in queue.never},
        "array_limits": _array_limits(jobs),
        "time_left_s": time_left_s,
        "restarts": restarts,
    }
    return ready, _Play(inputs.snapshot, views, kwargs)


def _array_limits(jobs: list[Job]) -> dict[int, tuple[int, list[int]]]:
    """The arrays with a limit on tasks running at once among `jobs`, as the live round reads them."""
    tasks = sorted(
        (j for j in jobs if j.array_task_limit is not None), key=lambda j: (j.array_job_id, j.array_task_id)
    )
    return array_limits_of((j.pk, j.array_job_id, j.array_task_limit) for j in tasks)


def _window(
    placeable: list[int],
    views: list[JobView],
    inputs: RoundInputs,
    now: datetime,
    window_jobs: int,
    waits: dict,
) -> tuple[list[int], list[int], list[JobView]]:
    """The placeable jobs split into those to forecast (every running one, those among the first
    `window_jobs` pending ones in the policy's order) and the pending ones behind; and the views to
    play forward, without the pending jobs ordered after the last of those to forecast (before
    anything copies them), but for those that wait for another job or are waited for.

    Under a static order (FIFO) the forecast would leave those out itself. Under an order that may
    change (SWAF, SJF...) they are left out too: within a round they only take what the jobs before
    them leave (GPU admission is in the policy's order), as under FIFO; what is lost is an order that
    changes while the forecast plays (a job aged after an hour's wait or more, a deadline's allowance
    spent). A core round's cost follows its jobs: at 10,000 pending jobs on 4,000 GPUs one round of
    `swaf` + `genie` over the whole queue took seconds, more than an admission forecast's budget;
    over the window's, the forecast plays more rounds in its budget (docs/performance.md)."""
    policy = scheduler_conf().policy_obj()
    ordered = policy.order(views, inputs.snapshot, now.timestamp())
    pending = [v.job_id for v in ordered if v.current is None]
    beyond = set(pending[window_jobs:])
    if beyond:
        inside = [job_id for job_id in placeable if job_id not in beyond]
        behind = [job_id for job_id in placeable if job_id in beyond]
    else:
        inside, behind = placeable, []
    if not inside:
        return inside, behind, views
    forecast = set(inside)
    last = max(i for i, v in enumerate(ordered) if v.job_id in forecast)
    # A job that waits for another, and the one it waits for, stay: a dependency dropped would keep
    # the job after it from ever starting in the forecast.
    linked = set(waits).union(*(deps.keys() for deps in waits.values()))
    later = {v.job_id for v in ordered[last + 1 :] if v.current is None and v.job_id not in linked}
    if later:
        views = [v for v in views if v.job_id not in later]
    return inside, behind, views


def _behind(job_ids: list[int], window_jobs: int | None, last_start: datetime | None) -> dict[int, Estimate]:
    after = f"at {timezone.localtime(last_start):%Y-%m-%d %H:%M}" if last_start else "beyond the forecast"
    detail = BEYOND_WINDOW.format(window=window_jobs, after=after)
    return {job_id: Estimate(None, None, detail) for job_id in job_ids}


def _latest_stored_start() -> datetime | None:
    """The latest start the stored forecast gives a pending job: the last of the window's, when the
    forecast at hand played nothing forward."""
    rows = JobForecast.objects.filter(job__state=JobState.PENDING, start_at__isnull=False)
    return rows.aggregate(latest=Max("start_at"))["latest"]


def queue_positions(queue: LiveQueue, *, now: datetime) -> dict[int, int]:
    """Each pending job's 1-based place in the current policy's order (the core's own ordering, as the
    round sorts them); jobs the round cannot consider (held, never starting, no schedulable server
    fits them) come last, in submission order."""
    pending = {j.pk: j for j in queue.jobs if j.state == JobState.PENDING}
    policy = scheduler_conf().policy_obj()
    with gc_paused():  # the order's keys and lists, one per live job, freed by reference counting
        ordered = [
            view.job_id
            for view in policy.order(queue.inputs.views, queue.inputs.snapshot, now.timestamp())
            if view.job_id in pending
        ]
    placed = set(ordered)
    ordered += [
        j.pk for j in sorted(pending.values(), key=lambda j: (j.submitted_at, j.pk)) if j.pk not in placed
    ]
    return {job_id: position for position, job_id in enumerate(ordered, start=1)}


def _first_round_at(now: datetime, early_round: bool) -> datetime:
    conf = scheduler_conf()
    periodic = next_round_at(now, conf.round_s)
    if not early_round:
        return periodic
    delay_s = 0.0 if conf.inline_rounds else max(0.0, conf.early_round_delay_s)
    return min(periodic, now + timedelta(seconds=delay_s))


def _estimate(
    workload_id: int | None,
    limit_end: datetime | None,
    start: datetime | None,
    finish: datetime | None,
    cut_short: bool,
    budget_s: float,
    horizon: str,
    reached: datetime | None = None,
) -> Estimate:
    """A placeable job's estimate from its forecast start and finish; `limit_end`: where its time limit
    ends it, for an own command or a job the forecast ended at its limit (else None)."""
    if workload_id is None and start is not None:
        # An own command has no profile, so its length is unknown; a time limit bounds it (what
        # Slurm's backfill assumes too). The forecast only placed it with a guessed speed.
        if limit_end is not None:
            return Estimate(start, limit_end, "own command: finish = start + its time limit")
        return Estimate(start, None, OWN_COMMAND_UNKNOWN)
    if limit_end is not None:
        # The forecast ended it at its limit, as the service does (TIMEOUT); its finish there is at the
        # rounds' float resolution, the limit's own time exact.
        return Estimate(start, limit_end, TIME_LIMIT_ENDS)
    if finish is not None:
        return Estimate(start, finish)
    what = "started" if start is None else "finished"
    if cut_short and reached is not None:
        # A lower bound, as the answer behind the window gives (BEYOND_WINDOW): in the rounds the budget
        # allowed the job did not start (finish), so in this forecast it cannot before the next one.
        when = f"{timezone.localtime(reached):%Y-%m-%d %H:%M}"
        verb = "starts" if start is None else "finishes"
        detail = f"{verb} after {when} at the earliest (as far as {budget_s:g} s of forecasting played)"
        return Estimate(start, None, detail, cut_short=True)
    within = f"within {budget_s:g} s of forecasting" if cut_short else horizon
    return Estimate(start, None, f"not {what} {within}", cut_short=cut_short)


def job_forecasts_refresh(*, now: datetime | None = None) -> int:
    """Re-forecast the live queue and store it (job_forecasts_refresh_estimates); returns how many
    estimates were stored."""
    return len(job_forecasts_refresh_estimates(now=now))


def job_forecasts_refresh_estimates(*, now: datetime | None = None) -> dict[int, Estimate]:
    """Re-forecast every pending and running job (the pending ones up to `forecast_window_jobs` in the
    policy's order: see live_forecast) and store the estimates and the pending jobs' queue positions
    (JobForecast); rows of jobs that ended are removed; every estimate then holds as of `now`
    (forecast_as_of.forecast_confirm). Returns the estimates. The refresh after
    scheduling rounds without a worker (inline: the embedded demo), within `forecast_refresh_budget_s`
    of wall time; the forecasts worker plays the same forecast in parts of bounded CPU instead
    (services/forecast_cycle.py). So the queue pages read what the round decided instead of ordering
    tens of thousands of jobs on every request."""
    conf = scheduler_conf()
    now = now or timezone.now()
    queue = live_queue()
    estimates = live_forecast(
        now=now, budget_s=conf.forecast_refresh_budget_s, queue=queue, window_jobs=conf.forecast_window_jobs
    )
    positions = queue_positions(queue, now=now)
    with transaction.atomic():
        job_forecasts_store(estimates, now=now, positions=positions)
        forecast_confirm(now)  # every estimate holds as of this forecast (the demo: its round's)
    qos_at_risk_notify(queue.jobs, estimates)
    return estimates


def qos_at_risk_notify(jobs: Sequence[Job], estimates: dict[int, Estimate]) -> None:
    """Owners who opted in hear once when the forecast puts their job's finish after its QoS target."""
    for job in jobs:
        if job.pk in estimates and (job.qos_deadline_at is not None or job.qos_max_latency_s is not None):
            notification_qos_at_risk(job=job, predicted_finish_at=estimates[job.pk].finish_at)
