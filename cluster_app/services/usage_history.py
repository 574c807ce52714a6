"""Usage history upkeep: raw samples rolled up into per-minute averages, the cluster's minute sums rebuilt."""

import logging
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta

from django.db import transaction
from django.db.models import Avg, F, Max, Min, Model
from django.db.models.functions import Trunc
from django.utils import timezone

from cluster_app.conf import node_conf
from cluster_app.models import ClusterUsageMinute, GpuUsageSample, UsageRollupMark, UsageSample
from cluster_app.usage_minutes import later, minute_of, minutes_rebuild_chunk, next_usage_minute

logger = logging.getLogger(__name__)

# The per-minute sums are rebuilt this much history per transaction: the minutes of now, when a rebuild
# reaches them, stay locked (their heartbeats waiting) for one hour's aggregate, not a week's.
REBUILD_CHUNK = timedelta(hours=1)
# The roll-up folds this much history per transaction, and at most this many windows per run (two days
# of backlog; the hourly run normally has one window to do). Each window locks only its own rows,
# all older than the raw retention, which no heartbeat touches (sample dates are kept near now).
ROLLUP_WINDOW = timedelta(hours=1)
ROLLUP_MAX_WINDOWS = 48
# How far before the mark a run looks for raw samples: samples come in dated within a minute of the
# service's clock (AGENT_CLOCK_SKEW), so with a retention of 0 days one may land just behind the mark.
MARK_LOOKBACK = timedelta(minutes=10)


def _first_raw(model: type[Model], *, since: datetime | None, before: datetime) -> datetime | None:
    """When the first raw sample of `model` in [since, before) was taken (rows already rolled up sit
    exactly on a minute); None if there is none. Walks the sampled_at index from `since` and stops at
    the first one, so years without samples cost nothing."""
    rows = model.objects.filter(sampled_at__lt=before)
    if since is not None:
        rows = rows.filter(sampled_at__gte=since)
    rows = rows.annotate(minute=Trunc("sampled_at", "minute", tzinfo=UTC)).exclude(sampled_at=F("minute"))
    return rows.order_by("sampled_at").values_list("sampled_at", flat=True).first()


def _first_raw_minute(*, since: datetime | None, before: datetime) -> datetime | None:
    firsts = [_first_raw(m, since=since, before=before) for m in (UsageSample, GpuUsageSample)]
    found = [at for at in firsts if at is not None]
    return minute_of(min(found)) if found else None


def _rollup(model: type[Model], key: str, fields: Sequence[str], start: datetime, end: datetime) -> int:
    """Replace the samples of `model` in [start, end) (whole minutes) by one averaged row per (key,
    minute); returns how many rows were removed net."""
    window = model.objects.filter(sampled_at__gte=start, sampled_at__lt=end)
    averages = list(
        window.annotate(minute=Trunc("sampled_at", "minute", tzinfo=UTC))
        .values(key, "minute")
        .annotate(**{f: Avg(f) for f in fields})
        .order_by(key, "minute")
    )
    deleted, _ = window.delete()
    model.objects.bulk_create(
        [
            model(**{key: row[key], "sampled_at": row["minute"], **{f: row[f] for f in fields}})
            for row in averages
        ],
        batch_size=2000,
    )
    return deleted - len(averages)


def usage_samples_rollup(*, now: datetime | None = None) -> int:
    """Roll raw usage samples older than the retention period up into per-minute averages.

    The agents send a sample every few seconds; dashboards need that detail for recent hours only.
    Older samples are averaged per server (and per GPU) and minute, which keeps long histories at one
    row per minute. Returns the number of rows removed.

    Bounded whatever is stored: from the first raw sample on, one ROLLUP_WINDOW per transaction (its
    samples folded and its minutes' sums rebuilt, with row locks only), at most ROLLUP_MAX_WINDOWS per
    run; the next window starts at the next raw sample, so a sample dated year 1000 costs one window.
    """
    now = now or timezone.now()
    before = minute_of(now - timedelta(days=node_conf().usage_raw_retention_days))
    removed = 0
    # From the mark (the first run: from the first sample, wherever it is), not through every row
    # rolled up since the installation.
    mark = UsageRollupMark.objects.filter(pk=1).values_list("rolled_until", flat=True).first()
    start = _first_raw_minute(since=None if mark is None else mark - MARK_LOOKBACK, before=before)
    windows = 0
    while start is not None and windows < ROLLUP_MAX_WINDOWS:
        end = min(before, start + ROLLUP_WINDOW)
        with transaction.atomic():
            removed += _rollup(UsageSample, "server_id", ("cpu_util_pct", "mem_used_gb"), start, end)
            removed += _rollup(GpuUsageSample, "gpu_id", ("util_pct", "mem_used_mb"), start, end)
            # A folded minute now holds one averaged sample per server / GPU instead of many: its
            # cluster-wide sums change, so they are recomputed from the rows that replaced the raw ones.
            cluster_usage_minutes_rebuild(start=start, end=end)
            _mark(end)
        windows += 1
        start = _first_raw_minute(since=end, before=before)
    if start is None and (mark is None or mark < before):
        _mark(before)  # caught up: the next run looks from here
    if start is not None:
        logger.warning("usage roll-up: %d windows done, more history left for the next run", windows)
    if removed:
        logger.info("usage roll-up: %d raw samples folded into per-minute averages", removed)
    return removed


def _mark(rolled_until: datetime) -> None:
    UsageRollupMark.objects.update_or_create(pk=1, defaults={"rolled_until": rolled_until})


def cluster_usage_minutes_rebuild(*, start: datetime | None = None, end: datetime | None = None) -> int:
    """Recompute the ClusterUsageMinute rows of [start, end) from the usage samples; idempotent.

    For an installation that had samples before the aggregate existed, after a manual change to the
    sample tables, and for the minutes the roll-up folds. Bounds are widened to whole minutes;
    missing ones mean from the first sample or stored minute / to after the last. Returns the number
    of minute rows written.

    Safe beside live heartbeats, and bounded by what is stored rather than by the dates: it goes from
    one stored minute to the next (gaps of any length cost three index probes), REBUILD_CHUNK at a
    time, each chunk in its own transaction (a savepoint inside a caller's) with its rows locked
    (usage_minutes.minutes_rebuild_chunk), never the table.
    """
    if start is None or end is None:
        # Stored minutes count too: one left by samples deleted since (a removed server) is rebuilt away.
        bounds = [
            UsageSample.objects.aggregate(first=Min("sampled_at"), last=Max("sampled_at")),
            GpuUsageSample.objects.aggregate(first=Min("sampled_at"), last=Max("sampled_at")),
            ClusterUsageMinute.objects.aggregate(first=Min("minute"), last=Max("minute")),
        ]
        firsts = [b["first"] for b in bounds if b["first"] is not None]
        lasts = [b["last"] for b in bounds if b["last"] is not None]
        if start is None:
            start = min(firsts) if firsts else timezone.now()
        if end is None:
            end = later(max(lasts), timedelta(minutes=1)) if lasts else start
    start = minute_of(start)
    end_minute = minute_of(end)
    end = end_minute if end_minute == end else later(end_minute, timedelta(minutes=1))
    written = 0
    lo = next_usage_minute(start=start, end=end) if start < end else None
    while lo is not None:
        hi = min(later(lo, REBUILD_CHUNK), end)
        with transaction.atomic():
            written += minutes_rebuild_chunk(start=lo, end=hi)
        lo = next_usage_minute(start=hi, end=end) if hi < end else None
    return written
