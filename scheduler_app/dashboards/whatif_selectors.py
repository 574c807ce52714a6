"""What-if reads: the latest runs for the form's page, one run as its page and its JSON show it."""

from __future__ import annotations

from typing import Any

from django.db.models import DurationField, ExpressionWrapper, F

from scheduler_app.models import SimulationRun


def simulation_runs_recent(*, limit: int = 10) -> list[dict[str, Any]]:
    """The latest what-if runs, without their (possibly large) stored trace and results; `took` is
    the time the run ran (a timedelta; None until it finished)."""
    return list(
        SimulationRun.objects.order_by("-created_at", "-id").values(
            "id",
            "created_at",
            "status",
            "progress",
            policies=F("parameters__policies"),
            allocators=F("parameters__allocators"),
            trace_source=F("parameters__extra__trace_source"),
            took=ExpressionWrapper(F("finished_at") - F("started_at"), output_field=DurationField()),
        )[:limit]
    )


def simulation_run_view(run: SimulationRun) -> dict[str, Any]:
    """A what-if run as the page and its JSON show it: status, progress, the grid's results and, for
    a run over the recorded history, what really happened to those jobs.

    `qos_jobs`: how many jobs of the trace had a QoS target (None until the run has results). With
    none, no QoS rate exists, edf orders the jobs as fifo and swaf as sjf (with aging): the page says
    so rather than show a QoS column of dashes unexplained.
    """
    params = run.parameters or {}
    extra = params.get("extra") or {}
    history = extra.get("trace_source") == "history"
    runs = (run.results or {}).get("runs", [])
    return {
        "id": run.pk,
        "status": run.status,
        "progress": run.progress,
        "error": run.error,
        "created_at": run.created_at.isoformat(),
        "finished_at": run.finished_at.isoformat() if run.finished_at else None,
        "trace_source": extra.get("trace_source", "generated"),
        "jobs": len(extra.get("history_trace", [])) if history else params.get("num_jobs"),
        "history_skipped": extra.get("history_skipped") if history else None,
        "workload": None if history else params.get("workload"),
        "policies": params.get("policies", []),
        "allocators": params.get("allocators", []),
        "round_s": params.get("round_s"),
        "cluster": {
            key: params.get(key)
            for key in ("servers", "gpus_per_server", "cpus_per_server", "mem_gb_per_server")
        },
        "runs": runs,
        "qos_jobs": max((r.get("qos_jobs") or 0 for r in runs), default=0) if runs else None,
        "actual": extra.get("actual") if history else None,
        "history_speedup": _history_speedup(extra) if history else None,
    }


def _history_speedup(extra: dict[str, Any]) -> float | None:
    """How many times faster than their profiles the recorded jobs ran (fake nodes: 20 in the demo),
    whose recorded times the run shows in the jobs' own time (dashboards/history.py); None at 1."""
    scale = (extra.get("actual") or {}).get("time_scale") or 1.0
    return None if scale == 1.0 else round(1.0 / scale, 3)
