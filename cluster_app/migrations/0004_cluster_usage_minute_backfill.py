"""Fill ClusterUsageMinute from the usage samples an installation already holds (what the rebuild does)."""

from datetime import UTC, timedelta

from django.db import migrations
from django.db.models import Count, F, Max, Min, Sum
from django.db.models.functions import Trunc


def backfill(apps, schema_editor):  # type: ignore[no-untyped-def]
    # Historical models, not cluster_app.services: a migration must not depend on today's code.
    UsageSample = apps.get_model("cluster_app", "UsageSample")
    GpuUsageSample = apps.get_model("cluster_app", "GpuUsageSample")
    ClusterUsageMinute = apps.get_model("cluster_app", "ClusterUsageMinute")
    bounds = [
        model.objects.aggregate(first=Min("sampled_at"), last=Max("sampled_at"))
        for model in (UsageSample, GpuUsageSample)
    ]
    firsts = [b["first"] for b in bounds if b["first"] is not None]
    if not firsts:
        return
    lo = min(firsts).replace(second=0, microsecond=0)
    end = max(b["last"] for b in bounds if b["last"] is not None) + timedelta(minutes=1)
    while lo < end:  # a week at a time, so that memory stays small on a long history
        hi = lo + timedelta(days=7)
        rows: dict = {}

        def row(minute):  # type: ignore[no-untyped-def]
            if minute.tzinfo is None:  # SQLite gives the truncated value back without its zone
                minute = minute.replace(tzinfo=UTC)
            return rows.setdefault(minute, ClusterUsageMinute(minute=minute))

        servers = (
            UsageSample.objects.filter(sampled_at__gte=lo, sampled_at__lt=hi)
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
        for s in servers:
            r = row(s["m"])
            r.servers_sampled, r.cpu_util_pct_cores_sum, r.cpu_cores_sum = s["n"], s["cpu"], s["cores"]
            r.mem_used_gb_sum, r.mem_capacity_gb_sum = s["mem_used"], s["mem_cap"]
        gpus = (
            GpuUsageSample.objects.filter(sampled_at__gte=lo, sampled_at__lt=hi)
            .annotate(m=Trunc("sampled_at", "minute", tzinfo=UTC))
            .values("m")
            .annotate(n=Count("id"), util=Sum("util_pct"))
            .order_by()
        )
        for g in gpus:
            r = row(g["m"])
            r.gpu_samples, r.gpu_util_pct_sum = g["n"], g["util"]
        ClusterUsageMinute.objects.bulk_create(rows.values(), batch_size=2000)
        lo = hi


class Migration(migrations.Migration):
    dependencies = [
        ("cluster_app", "0003_cluster_usage_minute"),
    ]

    operations = [
        migrations.RunPython(backfill, migrations.RunPython.noop),
    ]
