"""Accounting, as Slurm's sacct/sreport: usage, jobs by end state and waits per user or team over a window."""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Literal

from django.contrib.auth import get_user_model
from django.contrib.auth.models import AbstractBaseUser
from django.db.models import Aggregate, Avg, Count, Expression, F, FloatField, Func, Q, Sum, Value
from django.db.models.functions import Coalesce, Greatest, Least
from django.utils import timezone

from infra.vendor import is_postgresql
from scheduler_app.models import TERMINAL_JOB_STATES, Allocation, Job, JobState, Team
from scheduler_app.selectors.restarts import RestartLossDay, restart_loss_by_day

AccountingBy = Literal["user", "team"]
ACCOUNTING_BY: tuple[AccountingBy, ...] = ("user", "team")
NO_TEAM = "(no team)"
# The states a job ends in, in JobState's order: every row carries all of them (zero when none).
END_STATES: tuple[str, ...] = tuple(state.value for state in JobState if state in TERMINAL_JOB_STATES)
WAIT_QUANTILE = 0.95
# The windows offered by name (the API's ?window=, the page's selector), each ending now.
ACCOUNTING_WINDOWS: dict[str, timedelta] = {
    "1h": timedelta(hours=1),
    "6h": timedelta(hours=6),
    "24h": timedelta(hours=24),
    "7d": timedelta(days=7),
    "30d": timedelta(days=30),
    "365d": timedelta(days=365),
}
DEFAULT_ACCOUNTING_WINDOW = "30d"
# The longest window a report covers (a year and a bit, for a leap year plus slack): a bound on work.
MAX_ACCOUNTING_SPAN = timedelta(days=400)


@dataclass(frozen=True)
class AccountingRow:
    """One user's or team's usage in the window (hours of GPU, core, GB) and its jobs; waits in s."""

    name: str
    gpu_hours: float
    cpu_core_hours: float
    mem_gb_hours: float
    jobs: dict[str, int]
    jobs_total: int
    mean_wait_s: float | None
    p95_wait_s: float | None


@dataclass(frozen=True)
class AccountingReport:
    """The rows of [start, end), by user or team, largest GPU-hours first, and the GPU-hours lost to
    restarts on each day of the window that lost any (of the jobs the rows count)."""

    start: datetime
    end: datetime
    by: AccountingBy
    rows: list[AccountingRow]
    restart_loss_by_day: list[RestartLossDay] = field(default_factory=list)


class EpochSeconds(Func):
    """The seconds in a duration (a difference of two datetimes), as a float.

    PostgreSQL subtracts timestamps into an interval; Django's SQLite backend into whole microseconds.
    """

    output_field = FloatField()
    template = "date_part('epoch', %(expressions)s)"

    def as_sqlite(self, compiler: Any, connection: Any, **extra: Any) -> tuple[str, list[Any]]:
        return self.as_sql(compiler, connection, template="(%(expressions)s / 1000000.0)", **extra)


class PercentileCont(Aggregate):
    """PostgreSQL's percentile_cont(q) WITHIN GROUP (ORDER BY x): interpolates linearly between ranks,
    as numpy's default and `_quantile` below do."""

    function = "percentile_cont"
    output_field = FloatField()
    template = "%(function)s(%(quantile)r) WITHIN GROUP (ORDER BY %(expressions)s)"

    def __init__(self, expression: Any, quantile: float, **extra: Any) -> None:
        # A float written into the SQL text (never user input): percentile_cont takes no parameter here.
        super().__init__(expression, quantile=float(quantile), **extra)


def _quantile(values: list[float], q: float) -> float | None:
    """Linear-interpolated quantile of `values` (percentile_cont's definition); None when empty."""
    if not values:
        return None
    ordered = sorted(values)
    pos = q * (len(ordered) - 1)
    lo, hi = math.floor(pos), math.ceil(pos)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def _overlap_s(prefix: str, start: datetime, stop: datetime) -> Expression:
    """Seconds of an allocation inside [start, stop); one still running runs until `stop` (<= now).

    Only allocations that overlap the window are aggregated (`_overlaps`), so this is never negative.
    """
    until = Least(Coalesce(F(f"{prefix}ended_at"), Value(stop)), Value(stop))
    since = Greatest(F(f"{prefix}started_at"), Value(start))
    return EpochSeconds(until - since)


def _overlaps(prefix: str, start: datetime, stop: datetime) -> Q:
    # Written as an OR of two indexable conditions (not COALESCE(ended_at, ...)), so that PostgreSQL
    # reads a short window through the ended_at index: recently ended allocations plus running ones.
    return Q(**{f"{prefix}started_at__lt": stop}) & (
        Q(**{f"{prefix}ended_at__gt": start}) | Q(**{f"{prefix}ended_at__isnull": True})
    )


def _scope(user: AbstractBaseUser | None, by: AccountingBy, prefix: str) -> Q:
    """The jobs whose rows `user` may see: everything for staff (or no user); else, like sacct without
    PrivateData exceptions, their own jobs (by user) or their teams' jobs and their own teamless ones."""
    if user is None or user.is_staff:
        return Q()
    if by == "user":
        return Q(**{f"{prefix}owner": user})
    teams = Team.objects.filter(members=user).values("pk")
    return Q(**{f"{prefix}team__in": teams}) | Q(**{f"{prefix}team__isnull": True, f"{prefix}owner": user})


def _names(by: AccountingBy, keys: Iterable[int | None]) -> dict[int | None, str]:
    """Key (user or team id; None: no team) -> the name shown, in one query."""
    ids = [k for k in keys if k is not None]
    if by == "user":
        model = get_user_model()
        names = dict(model.objects.filter(pk__in=ids).values_list("pk", model.USERNAME_FIELD))
    else:
        names = dict(Team.objects.filter(pk__in=ids).values_list("pk", "name"))
    return {**names, None: NO_TEAM}


def _usage(
    by: AccountingBy, user: AbstractBaseUser | None, start: datetime, stop: datetime
) -> dict[Any, tuple[float, float, float]]:
    """Key -> (GPU-seconds, core-seconds, GB-seconds) of the allocations in the window, in one query.

    Each lease's overlap with the window times its GPU count (`Allocation.num_gpus`, stored with the
    lease), cores and GB: no join of the GPU rows, which over a year are one and a half per lease.
    """
    if start >= stop:
        return {}
    key = "owner_id" if by == "user" else "team_id"
    overlap_s = _overlap_s("", start, stop)
    # order_by(): Allocation's default ordering would otherwise join the GROUP BY.
    rows = (
        Allocation.objects.filter(_overlaps("", start, stop), _scope(user, by, "job__"))
        .values(k=F(f"job__{key}"))
        .annotate(
            gpu_s=Sum(overlap_s * F("num_gpus")),
            cpu_s=Sum(overlap_s * F("num_cpus")),
            mem_s=Sum(overlap_s * F("mem_gb")),
        )
        .order_by()
    )
    return {row["k"]: (row["gpu_s"] or 0.0, row["cpu_s"] or 0.0, row["mem_s"] or 0.0) for row in rows}


def _end_states(by: AccountingBy, scope: Q, start: datetime, end: datetime) -> dict[Any, dict[str, int]]:
    """Key -> end state -> jobs that ended in [start, end) in that state."""
    key = "owner_id" if by == "user" else "team_id"
    counts: dict[Any, dict[str, int]] = defaultdict(lambda: dict.fromkeys(END_STATES, 0))
    rows = (
        Job.objects.filter(scope, state__in=END_STATES, finished_at__gte=start, finished_at__lt=end)
        .values_list(key, "state")
        .annotate(n=Count("id"))
        .order_by()
    )
    for k, state, n in rows:
        counts[k][state] = n
    return counts


def _waits(
    by: AccountingBy, scope: Q, start: datetime, end: datetime
) -> dict[Any, tuple[float | None, float | None]]:
    """Key -> (mean, p95) seconds from submission to start of the jobs that started in [start, end).

    A query of its own, not FILTERed aggregates beside the end states': percentile_cont sorts its
    group's rows, and over a year one pass computing both was slower than the two (measured).
    """
    key = "owner_id" if by == "user" else "team_id"
    started = Job.objects.filter(scope, started_at__gte=start, started_at__lt=end).order_by()
    wait_s = EpochSeconds(F("started_at") - F("submitted_at"))
    if is_postgresql():
        rows = started.values_list(key).annotate(mean=Avg(wait_s), p95=PercentileCont(wait_s, WAIT_QUANTILE))
        return {k: (mean, p95) for k, mean, p95 in rows}
    # SQLite (the embedded demo) has no percentile aggregate: its waits come back, one float each.
    values: dict[Any, list[float]] = defaultdict(list)
    for k, wait in started.annotate(wait_s=wait_s).values_list(key, "wait_s"):
        values[k].append(wait)
    return {k: (sum(v) / len(v), _quantile(v, WAIT_QUANTILE)) for k, v in values.items()}


def accounting_window(name: str, *, now: datetime) -> tuple[datetime, datetime]:
    """[now - the named window, now); KeyError for a name not in ACCOUNTING_WINDOWS."""
    return now - ACCOUNTING_WINDOWS[name], now


def accounting_report(
    *,
    start: datetime,
    end: datetime,
    by: AccountingBy = "user",
    user: AbstractBaseUser | None = None,
    now: datetime | None = None,
) -> AccountingReport:
    """Per user or team over [start, end): GPU-hours, CPU-core-hours and memory GB-hours of the
    allocations (each one's overlap with the window times its GPUs, cores, GB; a running one counts up
    to `now`), the jobs that ended in the window by end state, and the mean and p95 wait (start minus
    submission) of the jobs that started in it; and the GPU-hours lost to restarts per day
    (selectors/restarts.py). `user` scopes the rows and the days to what they may see (see `_scope`;
    None: all, the cluster's). Four grouped queries and one for the names, whatever the history's length.
    """
    if by not in ACCOUNTING_BY:
        raise ValueError(f"by must be one of {ACCOUNTING_BY}, not {by!r}")
    stop = min(end, now or timezone.now())
    usage = _usage(by, user, start, stop)
    job_scope = _scope(user, by, "")
    ended = _end_states(by, job_scope, start, end)
    waits = _waits(by, job_scope, start, end)
    keys = set(usage) | set(ended) | set(waits)
    names = _names(by, keys)
    rows = []
    for k in keys:
        gpu_s, cpu_s, mem_s = usage.get(k, (0.0, 0.0, 0.0))
        jobs = ended.get(k, dict.fromkeys(END_STATES, 0))
        mean, p95 = waits.get(k, (None, None))
        rows.append(
            AccountingRow(
                name=names.get(k, f"#{k}"),
                gpu_hours=gpu_s / 3600,
                cpu_core_hours=cpu_s / 3600,
                mem_gb_hours=mem_s / 3600,
                jobs=dict(jobs),
                jobs_total=sum(jobs.values()),
                mean_wait_s=mean,
                p95_wait_s=p95,
            )
        )
    rows.sort(key=lambda row: (-row.gpu_hours, row.name))
    lost = restart_loss_by_day(start=start, end=stop, jobs=_scope(user, by, "job__"))
    return AccountingReport(start=start, end=end, by=by, rows=rows, restart_loss_by_day=lost)
