"""`manage.py usage_minutes_rebuild [--since T] [--until T] [--days N]`: recompute the minute usage sums."""

from datetime import UTC, datetime, timedelta

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.utils import timezone
from django.utils.dateparse import parse_datetime

from cluster_app.services import cluster_usage_minutes_rebuild


def _when(value: str | None) -> datetime | None:
    if value is None:
        return None
    parsed = parse_datetime(value)
    if parsed is None:
        raise CommandError(f"not a date and time: {value!r} (ISO 8601, e.g. 2026-11-20T00:00Z)")
    return parsed if timezone.is_aware(parsed) else parsed.replace(tzinfo=UTC)


class Command(BaseCommand):
    help = (
        "Recompute the cluster-wide per-minute usage sums (ClusterUsageMinute) that the dashboards read "
        "from the usage samples, for [--since, --until) or the last --days; all of history by default. "
        "Idempotent (migration 0004 filled the table on upgrade); run it after editing samples by hand."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--since", help="start (ISO 8601, UTC if no zone); default: the first sample")
        parser.add_argument("--until", help="end, exclusive (ISO 8601); default: after the last sample")
        parser.add_argument("--days", type=float, help="the last N days up to now (instead of --since)")

    def handle(self, *args, **opts) -> None:
        start, end = _when(opts["since"]), _when(opts["until"])
        if opts["days"] is not None:
            if start is not None:
                raise CommandError("--days and --since exclude each other")
            end = end or timezone.now() + timedelta(minutes=1)
            start = end - timedelta(days=opts["days"])
        rows = cluster_usage_minutes_rebuild(start=start, end=end)
        self.stdout.write(f"{rows} minute rows rebuilt")
