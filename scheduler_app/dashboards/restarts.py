"""The restarts dashboard's series: the cluster's GPU-hours lost to restarts per day of the window."""

from __future__ import annotations

from typing import Any

from scheduler_app.dashboards.buckets import Window
from scheduler_app.selectors import restart_loss_by_day


def restart_loss_series(*, window: Window) -> dict[str, Any]:
    """Each day of the window that lost GPU time to restarts (start-ups after a job's first start, work
    done again after a move, preemption or requeue), its GPU-hours, and the window's total."""
    days = restart_loss_by_day(start=window.start, end=window.end)
    return {
        **window.as_json(),
        "days": [d.day.isoformat() for d in days],
        "gpu_hours": [round(d.gpu_hours, 6) for d in days],
        "total_gpu_hours": round(sum(d.gpu_hours for d in days), 6),
    }
