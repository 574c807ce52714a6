"""The per-minute cluster usage aggregate: the minute UPSERT, rebuilds from samples."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from django.db import connection
from django.db.models import Count, F, Sum
from django.db.models.functions import Trunc
from django.utils import timezone

from cluster_app.models import ClusterUsageMinute, GpuUsageSample, UsageSample

# Columns of ClusterUsageMinute that the UPSERT adds to (everything but `minute`).
SUM_FIELDS = (
    "servers_sampled",
    "cpu_util_pct_cores_sum",
    "cpu_cores_sum",
    "mem_used_gb_sum",
    "mem_capacity_gb_sum",
    "gpu_samples",
    "gpu_util_pct_sum",
)


@dataclass
class MinuteSums:
    """One minute's contribution (or total): the ClusterUsageMinute columns but `minute`."""

    servers_sampled: int = 0
    cpu_util_pct_cores_sum: float = 0.0
    cpu_cores_sum: int = 0
    mem_used_gb_sum: float = 0.0
    mem_capacity_gb_sum: float = 0.0
    gpu_samples: int = 0
    gpu_util_pct_sum: float = 0.0

    def is_empty(self) -> bool:
        return self.servers_sampled == 0 and self.gpu_samples == 0


def minute_of(at: datetime) -> datetime:
    """The UTC minute that `at` falls in (naive datetimes are taken as UTC)."""
    if timezone.is_naive(at):
        at = at.replace(tzinfo=UTC)
    return at.astimezone(UTC).replace(second=0, microsecond=0)


def minute_add(*, minute: datetime, sums: MinuteSums) -> None:
    """Add `sums` to the minute's row, creating it if missing: one atomic statement, no lost update.

    INSERT ... ON CONFLICT (minute) DO UPDATE SET x = x + EXCLUDED.x: concurrent heartbeats of the same
    minute queue on the row lock and each adds to the committed total (PostgreSQL re-reads the row
    after the wait; SQLite has one writer at a time). The row stays locked until the caller's
    transaction commits, so callers add last, after their other writes.
    """
    if sums.is_empty():
        return
    meta, qn = ClusterUsageMinute._meta, connection.ops.quote_name
    table = qn(meta.db_table)
    columns = [qn(meta.get_field(name).column) for name in SUM_FIELDS]
    minute_field = meta.get_field("minute")
    params = [minute_field.get_db_prep_save(minute, connection)] + [getattr(sums, n) for n in SUM_FIELDS]
    updates = ", ".join(f"{c} = {table}.{c} + EXCLUDED.{c}" for c in columns)
    sql = (
        f"INSERT INTO {table} ({qn(minute_field.column)}, {', '.join(columns)}) "
        f"VALUES ({', '.join(['%s'] * len(params))}) "
        f"ON CONFLICT ({qn(minute_field.column)}) DO UPDATE SET {updates}"
    )
    with connection.cursor() as cursor:
        cursor.execute(sql, params)


def minutes_rebuild_chunk(*, start: datetime, end: datetime) -> int:
    """Recompute the ClusterUsageMinute rows of [start, end) (whole minutes) from the samples, inside the
    caller's transaction, locking only those rows; returns how many rows it wrote.

    A heartbeat adds to a minute with one UPSERT (`minute_add`): were that addition to land on a row the
    rebuild then overwrote, or a sample it added be read by the rebuild too, the minute would lose or
    double it. So, with row locks only (a table lock stalled every agent's sync for as long as the
    rebuild ran: 126 s once, over a sample dated year 1000):
    1. every minute of the range that holds a committed sample gets a row if it has none (zeros; an
       insert that meets a heartbeat's uncommitted one waits for it);
    2. every row of the range is locked, in minute order: a heartbeat still adding to one commits first,
       a later one waits for this transaction;
    3. the sums are read from the samples, then written to the locked rows; a locked row without samples
       any more is deleted. A minute that got its first sample after step 1 is not written: its
       heartbeats' own additions are its whole sum (a waiting UPSERT re-inserts a deleted row).
    """
    found = minute_sums_from_samples(start=start, end=end)
    if found:
        ClusterUsageMinute.objects.bulk_create(
            [ClusterUsageMinute(minute=minute) for minute in sorted(found)], ignore_conflicts=True
        )
    locked = list(
        ClusterUsageMinute.objects.select_for_update()
        .filter(minute__gte=start, minute__lt=end)
        .order_by("minute")
        .values_list("pk", "minute")
    )
    if not locked:
        return 0
    sums = minute_sums_from_samples(start=start, end=end)
    rows = [ClusterUsageMinute(pk=pk, minute=m, **vars(sums[m])) for pk, m in locked if m in sums]
    ClusterUsageMinute.objects.bulk_update(rows, SUM_FIELDS, batch_size=1000)
    empty = [pk for pk, m in locked if m not in sums]
    if empty:
        ClusterUsageMinute.objects.filter(pk__in=empty).delete()
    return len(rows)


def next_usage_minute(*, start: datetime, end: datetime) -> datetime | None:
    """The first minute in [start, end) that holds a usage sample or a minute row; None if none does.

    Three index probes: a rebuild or roll-up steps over the empty years between a sample dated year
    1000 and today at this cost, instead of minute by minute or week by week.
    """
    firsts = [
        model.objects.filter(sampled_at__gte=start, sampled_at__lt=end)
        .order_by("sampled_at")
        .values_list("sampled_at", flat=True)
        .first()
        for model in (UsageSample, GpuUsageSample)
    ]
    firsts.append(
        ClusterUsageMinute.objects.filter(minute__gte=start, minute__lt=end)
        .order_by("minute")
        .values_list("minute", flat=True)
        .first()
    )
    found = [at for at in firsts if at is not None]
    return minute_of(min(found)) if found else None


def later(at: datetime, delta: timedelta) -> datetime:
    """`at + delta`, or the last representable instant past it (a sample dated year 9999 is stored)."""
    try:
        return at + delta
    except OverflowError:
        return datetime.max.replace(tzinfo=UTC)


def minute_sums_from_samples(*, start: datetime, end: datetime) -> dict[datetime, MinuteSums]:
    """Minute -> sums of the UsageSample and GpuUsageSample rows in [start, end), grouped in the database.

    Cores and GB are the servers' current ones (what the samples' servers hold now).
    """
    out: dict[datetime, MinuteSums] = {}

    def entry(minute: datetime) -> MinuteSums:
        if timezone.is_naive(minute):  # SQLite gives the truncated value back without its zone
            minute = minute.replace(tzinfo=UTC)
        return out.setdefault(minute, MinuteSums())

    servers = (
        UsageSample.objects.filter(sampled_at__gte=start, sampled_at__lt=end)
        .annotate(m=Trunc("sampled_at", "minute", tzinfo=UTC))
        .values("m")
        .annotate(
            n=Count("id"),
            cpu=Sum(F("cpu_util_pct") * F("server__num_cpus")),
            cores=Sum("server__num_cpus"),
            mem_used=Sum("mem_used_gb"),
            mem_cap=Sum("server__mem_gb"),
        )
        .order_by()
    )
    for row in servers:
        e = entry(row["m"])
        e.servers_sampled, e.cpu_util_pct_cores_sum, e.cpu_cores_sum = row["n"], row["cpu"], row["cores"]
        e.mem_used_gb_sum, e.mem_capacity_gb_sum = row["mem_used"], row["mem_cap"]
    gpus = (
        GpuUsageSample.objects.filter(sampled_at__gte=start, sampled_at__lt=end)
        .annotate(m=Trunc("sampled_at", "minute", tzinfo=UTC))
        .values("m")
        .annotate(n=Count("id"), util=Sum("util_pct"))
        .order_by()
    )
    for row in gpus:
        e = entry(row["m"])
        e.gpu_samples, e.gpu_util_pct_sum = row["n"], row["util"]
    return out
