"""What the cluster offers and what it was used for: nodes (sinfo), workloads, acct (sacct/sreport)."""

from __future__ import annotations

import json
from typing import Any, TextIO

from cli.api import Api, CliError
from cli.durations import parse_moment
from cli.output import table, when

NODE_STATES = ("IDLE", "MIXED", "ALLOCATED", "DRAINING", "DRAINED", "DOWN", "NOT_RESPONDING")
NODES_HEADER = ["NODE", "STATE", "GPUS(F/T)", "CPUS(F/T)", "MEM_GB(F/T)", "GPU_MODEL", "REASON"]


def _amount(value: float) -> str:
    """A count or a size as a person reads it: 250, 62.5 (not 62.500000001)."""
    return f"{value:.0f}" if abs(value - round(value)) < 0.05 else f"{value:.1f}"


def _free_of(capacity: dict[str, Any], in_use: dict[str, Any], key: str) -> str:
    """ "free/total" of one resource; never below zero, even while a lease outlives a shrunk server."""
    total = capacity[key]
    return f"{_amount(max(0.0, total - in_use[key]))}/{_amount(total)}"


def parse_node_states(text: str) -> list[str]:
    """Node states as sinfo -t takes them: comma-separated, any case. ValueError listing them otherwise."""
    states = [t.strip().upper() for t in text.split(",") if t.strip()]
    for state in states:
        if state not in NODE_STATES:
            raise ValueError(f"unknown state {state!r}: choose one of {', '.join(NODE_STATES)}")
    if not states:
        raise ValueError(f"give a state: one of {', '.join(NODE_STATES)}")
    return states


def nodes(api: Api, args: Any, out: TextIO) -> int:
    """Each server: state, free/total GPUs, cores and memory, and why it is out of service (sinfo -N)."""
    cluster = api.cluster()
    wanted = {state for group in args.state or [] for state in group}
    servers = [s for s in cluster["servers"] if not wanted or s["state"] in wanted]
    if args.json:
        out.write(json.dumps({**cluster, "servers": servers}, indent=2) + "\n")
        return 0
    rows = [NODES_HEADER]
    for server in servers:
        capacity, in_use = server["capacity"], server["in_use"]
        rows.append(
            [
                server["name"],
                server["state"],
                _free_of(capacity, in_use, "gpus"),
                _free_of(capacity, in_use, "cpus"),
                _free_of(capacity, in_use, "mem_gb"),
                server.get("gpu_model") or "-",
                server.get("state_reason") or "",
            ]
        )
    if not wanted and len(servers) > 1:
        totals = cluster["totals"]
        capacity = {k: totals[k] for k in ("gpus", "cpus", "mem_gb")}
        in_use = {k: totals[f"{k}_in_use"] for k in ("gpus", "cpus", "mem_gb")}
        rows.append(
            [
                f"({totals['servers']} nodes)",
                "",
                _free_of(capacity, in_use, "gpus"),
                _free_of(capacity, in_use, "cpus"),
                _free_of(capacity, in_use, "mem_gb"),
                "",
                f"{totals['schedulable_gpus']} GPUs schedulable",
            ]
        )
    table(rows, out)
    return 0


WORKLOADS_HEADER = ["NAME", "CLASS", "S/ITER", "BEST_CPUS/GPU", "BEST_MEM_GB/GPU", "SPEEDUP", "DESCRIPTION"]
DESCRIPTION_CHARS = 60


def workloads(api: Api, args: Any, out: TextIO) -> int:
    """The catalog: what --workload may name, and what each profile says it runs best with."""
    catalog = api.workloads()
    if args.json:
        out.write(json.dumps(catalog, indent=2) + "\n")
        return 0
    rows = [WORKLOADS_HEADER]
    for workload in catalog:
        description = " ".join((workload.get("description") or "").split())
        if len(description) > DESCRIPTION_CHARS:
            description = description[: DESCRIPTION_CHARS - 3] + "..."
        profile = workload.get("profile")
        if profile is None:
            measured = ["-", "-", "-", "not profiled yet"]
        else:
            measured = [
                f"{profile['iter_time_s']:.3g}",
                _amount(profile["best_cpus_per_gpu"]),
                _amount(profile["best_mem_gb_per_gpu"]),
                f"{profile['speedup']:.2f}x",
            ]
        rows.append([workload["name"], workload.get("workload_class") or "", *measured, description])
    table(rows, out)
    return 0


ACCOUNTING_WINDOWS = ("1h", "6h", "24h", "7d", "30d", "365d")
ACCT_HEADER = ["NAME", "GPU_H", "CPU_CORE_H", "MEM_GB_H", "JOBS"]
ACCT_WAITS = ["WAIT_MEAN", "WAIT_P95"]


def _wait(seconds: float | None) -> str:
    """A wait as squeue users read it: 45s, 12m, 3h05m, 2d04h; "-" when no job started."""
    if seconds is None:
        return "-"
    s = round(seconds)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m"
    if s < 86400:
        return f"{s // 3600}h{s % 3600 // 60:02}m"
    return f"{s // 86400}d{s % 86400 // 3600:02}h"


def accounting_params(args: Any) -> dict[str, Any]:
    """The report's query from acct's options: a named window, or start (and end, default now) given
    in local time; by user or team. Usage errors (exit 2) before anything is sent."""
    if args.window and (args.start or args.end):
        raise CliError("give either --window or --start/--end, not both", exit_code=2)
    if args.end and not args.start:
        raise CliError("give --start with --end", exit_code=2)
    params: dict[str, Any] = {"by": args.by}
    if args.window:
        params["window"] = args.window
    try:
        # Sent with their offset: the service would read a bare time as UTC, the user typed local time.
        if args.start:
            params["start"] = parse_moment(args.start, ahead=False).isoformat()
        if args.end:
            params["end"] = parse_moment(args.end, ahead=False).isoformat()
    except ValueError as exc:
        raise CliError(str(exc), exit_code=2) from None
    return params


def acct(api: Api, args: Any, out: TextIO) -> int:
    """Usage per user or team over a window (sreport/sacct): GPU-, core- and GB-hours, jobs by end
    state, waits. --csv prints the service's CSV as it comes."""
    params = accounting_params(args)
    if args.csv:
        out.write(api.accounting(params, csv=True))
        return 0
    report = api.accounting(params)
    if args.json:
        out.write(json.dumps(report, indent=2) + "\n")
        return 0
    out.write(f"Usage by {report['by']} from {when(report['start'])} to {when(report['end'])}\n")
    rows_in = report["rows"]
    if not rows_in:
        out.write("no usage in this window\n")
        return 0
    _acct_table(rows_in, out)
    lost = report.get("restart_loss_by_day") or []
    if lost:
        out.write("\nGPU-hours lost to restarts\n")
        table([["DAY", "LOST_GPU_H"], *([d["day"], f"{d['gpu_hours']:.2f}"] for d in lost)], out)
    return 0


def _acct_table(rows_in: list[dict[str, Any]], out: TextIO) -> None:
    """acct's table: one row per user or team."""
    # One column per end state that any row has, in the service's order (COMPLETED first).
    states = [s for s in rows_in[0]["jobs"] if any(row["jobs"].get(s) for row in rows_in)]
    rows = [[*ACCT_HEADER, *states, *ACCT_WAITS]]
    for row in rows_in:
        rows.append(
            [
                row["name"],
                f"{row['gpu_hours']:.1f}",
                f"{row['cpu_core_hours']:.1f}",
                f"{row['mem_gb_hours']:.1f}",
                str(row["jobs_total"]),
                *(str(row["jobs"].get(s, 0)) for s in states),
                _wait(row.get("mean_wait_s")),
                _wait(row.get("p95_wait_s")),
            ]
        )
    table(rows, out)
