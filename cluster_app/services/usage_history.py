"""Usage history upkeep: raw samples rolled up into per-minute averages, the cluster's minute sums rebuilt."""

import logging
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta

from django.db import transaction
from django.db.models import Avg, F, Max, Min, Model
from django.db.models.functions import Trunc
from django.utils import timezone

from cluster_app.conf import node_conf
from cluster_app.models import ClusterUsageMinute, GpuUsageSample, UsageSample
from cluster_app.usage_minutes import minute_of, minute_sums_from_samples, minutes_lock_for_rebuild

logger = logging.getLogger(__name__)

# The per-minute usage sums are rebuilt this much history at a time.
REBUILD_CHUNK = timedelta(days=7)


def _rollup(
    model: type[Model], key: str, fields: Sequence[str], before: datetime
) -> tuple[int, datetime | None]:
    """Replace the raw samples of `model` older than `before` by one averaged row per (key, minute).

    Rows already rolled up sit exactly on a minute, so each run starts at the first minute that still
    holds a raw sample and never rewrites older history. Returns how many rows were removed net, and
    that first minute (None when there was nothing to do).
    """
    before = before.replace(second=0, microsecond=0)
    old = model.objects.filter(sampled_at__lt=before).annotate(
        minute=Trunc("sampled_at", "minute", tzinfo=UTC)
    )
    since = old.exclude(sampled_at=F("minute")).aggregate(first=Min("minute"))["first"]
    if since is None:
        return 0, None
    if timezone.is_naive(since):  # an aggregate over the annotation comes back without its zone (UTC)
        since = since.replace(tzinfo=UTC)
    window = old.filter(sampled_at__gte=since)
    averages = list(
        window.values(key, "minute").annotate(**{f: Avg(f) for f in fields}).order_by(key, "minute")
    )
    deleted, _ = model.objects.filter(sampled_at__gte=since, sampled_at__lt=before).delete()
    model.objects.bulk_create(
        [
            model(**{key: row[key], "sampled_at": row["minute"], **{f: row[f] for f in fields}})
            for row in averages
        ],
        batch_size=2000,
    )
    return deleted - len(averages), since


@transaction.atomic
def usage_samples_rollup(*, now: datetime | None = None) -> int:
    """Roll raw usage samples older than the retention period up into per-minute averages.

    The agents send a sample every few seconds; dashboards need that detail for recent hours only.
    Older samples are averaged per server (and per GPU) and minute, which keeps long histories at one
    row per minute. Returns the number of rows removed.
    """
    now = now or timezone.now()
    before = now - timedelta(days=node_conf().usage_raw_retention_days)
    removed, since_servers = _rollup(UsageSample, "server_id", ("cpu_util_pct", "mem_used_gb"), before)
    removed_gpus, since_gpus = _rollup(GpuUsageSample, "gpu_id", ("util_pct", "mem_used_mb"), before)
    removed += removed_gpus
    starts = [t for t in (since_servers, since_gpus) if t is not None]
    if starts:
        # A folded minute now holds one averaged sample per server / GPU instead of many: its
        # cluster-wide sums change, so they are recomputed from the rows that replaced the raw ones.
        cluster_usage_minutes_rebuild(start=min(starts), end=before.replace(second=0, microsecond=0))
    if removed:
        logger.info("usage roll-up: %d raw samples folded into per-minute averages", removed)
    return removed


@transaction.atomic
def cluster_usage_minutes_rebuild(*, start: datetime | None = None, end: datetime | None = None) -> int:
    """Recompute the ClusterUsageMinute rows of [start, end) from the usage samples; idempotent.

    For an installation that had samples before the aggregate existed, after a manual change to the
    sample tables, and for the minutes the roll-up folds. Bounds are widened to whole minutes;
    missing ones mean from the first sample or stored minute / to after the last. Returns the number
    of minute rows written.

    Safe beside live heartbeats: additions to the table wait while it runs (minutes_lock_for_rebuild).
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
            end = max(lasts) + timedelta(minutes=1) if lasts else start
    start = minute_of(start)
    end_minute = minute_of(end)
    end = end_minute if end_minute == end else end_minute + timedelta(minutes=1)
    minutes_lock_for_rebuild()
    ClusterUsageMinute.objects.filter(minute__gte=start, minute__lt=end).delete()
    written = 0
    # A week at a time: memory stays at about 10,000 minutes whatever the range (a year is 527,040).
    lo = start
    while lo < end:
        hi = min(lo + REBUILD_CHUNK, end)
        sums = minute_sums_from_samples(start=lo, end=hi)
        ClusterUsageMinute.objects.bulk_create(
            [ClusterUsageMinute(minute=minute, **vars(row)) for minute, row in sorted(sums.items())],
            batch_size=2000,
        )
        written += len(sums)
        lo = hi
    return written
