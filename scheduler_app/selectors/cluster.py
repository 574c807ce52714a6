"""The cluster page: every server, its capacity, what is in use and by which job."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from django.db.models import Sum

from cluster_app.models import Server
from cluster_app.selectors import gpus_active, server_takes_work
from scheduler_app.models import (
    Allocation,
    AllocationGpu,
)


def cluster_overview() -> dict[str, Any]:
    """Every server with its state, capacity and what active leases use of it, plus cluster totals."""
    servers = list(Server.objects.select_related("heartbeat").order_by("name"))
    holders = dict(
        AllocationGpu.objects.filter(released_at__isnull=True).values_list("gpu_id", "allocation__job_id")
    )
    used = {
        row["server_id"]: row
        for row in Allocation.objects.filter(ended_at__isnull=True)
        .values("server_id")
        .annotate(cpus=Sum("num_cpus"), mem_gb=Sum("mem_gb"))
    }
    gpus_by_server: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for gpu_id, server_id, index, uuid in gpus_active(server_ids=[s.id for s in servers]):
        gpus_by_server[server_id].append(
            {"index": index, "uuid": uuid, "busy": gpu_id in holders, "job_id": holders.get(gpu_id)}
        )
    totals = dict.fromkeys(
        (
            "servers",
            "gpus",
            "cpus",
            "mem_gb",
            "gpus_in_use",
            "cpus_in_use",
            "mem_gb_in_use",
            "schedulable_gpus",
        ),
        0,
    )
    rows = []
    for s in servers:
        gpus = gpus_by_server.get(s.id, [])
        row = {
            "name": s.name,
            "hostname": s.hostname,
            "state": s.state,
            "state_reason": s.state_reason,
            "gpu_model": s.gpu_model,
            "last_heartbeat_at": s.last_heartbeat_at,
            "agent_version": s.agent_version,
            "time_scale": s.time_scale,
            "capacity": {"gpus": len(gpus), "cpus": s.num_cpus, "mem_gb": s.mem_gb},
            "in_use": {
                "gpus": sum(1 for g in gpus if g["busy"]),
                "cpus": used.get(s.id, {}).get("cpus") or 0,
                "mem_gb": used.get(s.id, {}).get("mem_gb") or 0.0,
            },
            "gpus": gpus,
        }
        rows.append(row)
        totals["servers"] += 1
        totals["gpus"] += row["capacity"]["gpus"]
        totals["cpus"] += s.num_cpus
        totals["mem_gb"] += s.mem_gb
        totals["gpus_in_use"] += row["in_use"]["gpus"]
        totals["cpus_in_use"] += row["in_use"]["cpus"]
        totals["mem_gb_in_use"] += row["in_use"]["mem_gb"]
        if server_takes_work(s):
            totals["schedulable_gpus"] += row["capacity"]["gpus"]
    return {"totals": totals, "servers": rows}
