"""Every read of the hardware tables."""

from django.db.models import Count, QuerySet, Sum

from cluster_app.models import Server


def server_list() -> QuerySet[Server]:
    return Server.objects.order_by("name")


def cluster_capacity() -> dict[str, float]:
    """Totals over all servers: servers, GPUs, CPU cores, memory GB."""
    totals = Server.objects.aggregate(
        servers=Count("id"), gpus=Sum("num_gpus"), cpus=Sum("num_cpus"), mem_gb=Sum("mem_gb")
    )
    return {k: (v or 0) for k, v in totals.items()}
