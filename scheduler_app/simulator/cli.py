"""The simulator's command line without Django: `python -m scheduler_app.simulator` (and its options, which
`manage.py simulate` shares): replay a trace under policies x allocators and print one row per run."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TextIO

from scheduler_app.core.allocators import ALLOCATORS
from scheduler_app.core.policies import POLICIES
from scheduler_app.simulator.compare import (
    WORKLOADS,
    SimulationRequest,
    SimulationRequestError,
    simulation_compare,
    simulation_request_validate,
    simulation_trace_build,
)
from scheduler_app.simulator.trace import TraceError, write_trace

GENERATOR_OPTIONS = ("workload", "jobs", "load", "split", "multi_gpu", "static", "seed", "min_rate_share")


def _comma_list(value: str) -> tuple[str, ...]:
    return tuple(v.strip() for v in value.split(",") if v.strip())


def _split(value: str) -> tuple[int, int, int]:
    parts = _comma_list(value)
    try:
        numbers = tuple(int(p) for p in parts)
    except ValueError:
        msg = f"--split takes three whole percentages like 20,70,10, got {value!r}"
        raise SimulationRequestError(msg) from None
    if len(numbers) != 3:
        msg = f"--split takes three percentages (image,language,speech), got {value!r}"
        raise SimulationRequestError(msg)
    return numbers  # type: ignore[return-value]


def _id_window(value: str) -> tuple[int, int]:
    try:
        lo, hi = (int(v) for v in value.split(":"))
    except ValueError:
        msg = f"--measure takes FIRST:LAST job ids like 4000:5000, got {value!r}"
        raise SimulationRequestError(msg) from None
    if hi <= lo:
        raise SimulationRequestError(f"--measure: LAST must exceed FIRST, got {value!r}")
    return lo, hi


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The cluster, trace and grid options (manage.py simulate adds its own output ones)."""
    cluster = parser.add_argument_group("cluster (per server)")
    cluster.add_argument("--servers", type=int, default=16, help="number of servers (default 16)")
    cluster.add_argument("--gpus", type=int, default=8, help="GPUs per server (default 8)")
    cluster.add_argument("--cpus", type=int, default=24, help="CPU cores per server (default 24)")
    cluster.add_argument("--mem-gb", type=float, default=500.0, help="memory GB per server (default 500)")

    trace = parser.add_argument_group("trace: a file, or a generated Philly-derived trace")
    trace.add_argument(
        "--trace",
        metavar="FILE",
        help="trace file, one job a line: job_id,model,arrival_s,total_iters,gpus",
    )
    trace.add_argument(
        "--workload",
        choices=WORKLOADS,
        help="generated: philly (Synergy's Philly-derived mix, the default) or genie (GENIE's CNN-heavy "
        "mix where every job has a QoS deadline, with bursts of urgent jobs)",
    )
    trace.add_argument("--jobs", type=int, help="generated: number of jobs (default 1000)")
    trace.add_argument("--load", type=float, help="generated: arrivals in jobs per hour, Poisson (default 9)")
    trace.add_argument(
        "--split",
        help="generated: image,language,speech percentages of the job mix (default 20,70,10 for philly, "
        "80,10,10 for genie)",
    )
    trace.add_argument(
        "--multi-gpu",
        action="store_true",
        help="generated: Philly's multi-GPU demand mix (default: 1 GPU)",
    )
    trace.add_argument("--static", action="store_true", help="generated: every job arrives at time 0")
    trace.add_argument("--seed", type=int, help="generated: random seed (default 1)")
    trace.add_argument(
        "--min-rate-share",
        type=float,
        help="generated genie: share (0-1) of jobs with a minimum rate instead of a deadline (default 0)",
    )
    trace.add_argument("--save-trace", metavar="FILE", help="write the trace used, to replay it later")

    grid = parser.add_argument_group("what to compare")
    grid.add_argument(
        "--policy",
        default="fifo",
        help=f"comma list of policies (default fifo); valid: {', '.join(POLICIES.names())}",
    )
    grid.add_argument(
        "--allocator",
        default="proportional,tune",
        help=f"comma list of allocators (default proportional,tune); valid: {', '.join(ALLOCATORS.names())}",
    )
    grid.add_argument(
        "--round-s", type=float, default=300.0, help="round (lease) length in seconds (default 300)"
    )
    grid.add_argument(
        "--finish-at-round-end",
        action="store_true",
        help="jobs finish at the end of the round they complete in, as the reference simulator counts",
    )
    grid.add_argument(
        "--mode",
        default="rounds",
        choices=["rounds", "events"],
        help="rounds: decide every --round-s (Synergy); events: also at every arrival and "
        "completion (GENIE). Default rounds",
    )
    grid.add_argument(
        "--restart-overhead-s",
        type=float,
        default=0.0,
        help="seconds lost by a job each time it is moved",
    )
    grid.add_argument(
        "--measure",
        metavar="FIRST:LAST",
        help="JCT statistics over job ids FIRST <= id < LAST (steady state)",
    )


def request_from_options(opts: dict[str, Any]) -> SimulationRequest:
    """The validated request of parsed options; SimulationRequestError names what to change."""
    generator_given = [name for name in GENERATOR_OPTIONS if opts.get(name) not in (None, False)]
    if opts["trace"] and generator_given:
        flags = ", ".join("--" + n.replace("_", "-") for n in generator_given)
        raise SimulationRequestError(f"--trace replays a file; {flags} only apply to a generated trace")
    request = SimulationRequest(
        servers=opts["servers"],
        gpus_per_server=opts["gpus"],
        cpus_per_server=opts["cpus"],
        mem_gb_per_server=opts["mem_gb"],
        policies=_comma_list(opts["policy"]),
        allocators=_comma_list(opts["allocator"]),
        round_s=opts["round_s"],
        finish_at_round_end=opts["finish_at_round_end"],
        mode=opts["mode"],
        restart_overhead_s=opts["restart_overhead_s"],
        trace_path=opts["trace"],
        num_jobs=opts["jobs"] if opts["jobs"] is not None else 1000,
        jobs_per_hour=opts["load"] if opts["load"] is not None else 9.0,
        workload=opts["workload"] or "philly",
        class_split=_split(opts["split"]) if opts["split"] else None,
        multi_gpu=opts["multi_gpu"],
        static=opts["static"],
        seed=opts["seed"] if opts["seed"] is not None else 1,
        min_rate_share=opts["min_rate_share"] or 0.0,
        measured_job_ids=_id_window(opts["measure"]) if opts["measure"] else None,
    )
    simulation_request_validate(request)
    return request


def progress_printer(stream: TextIO | None = None) -> Callable[[str, str, float], None]:
    """Progress on `stream` (stderr), at each tenth of each run's jobs. On a terminal one status line
    names every run still going (runs go in parallel: one line each would overwrite the others) and a
    finished run gets a line of its own; elsewhere (a log file) one plain line per report."""
    out = sys.stderr if stream is None else stream
    tty = out.isatty()
    last: dict[tuple[str, str], int] = {}

    def report(policy: str, allocator: str, fraction: float) -> None:
        tenth = min(int(fraction * 10), 10)
        if last.get((policy, allocator), -1) >= tenth:
            return
        last[(policy, allocator)] = tenth
        if not tty:
            out.write(f"{policy}/{allocator}: {fraction:4.0%} of jobs finished\n")
        else:
            if tenth == 10:
                out.write(f"\r\x1b[K{policy}/{allocator}: 100% of jobs finished\n")
            going = [f"{p}/{a} {10 * t}%" for (p, a), t in last.items() if t < 10]
            if going:
                out.write("\r\x1b[K" + ", ".join(going) + " of jobs finished")
        out.flush()

    return report


def table_lines(runs: list[dict[str, Any]]) -> list[str]:
    """The comparison table: a header and one row per run."""

    def fmt(value: float | None, spec: str) -> str:
        """`value` in `spec` (width.precision f), or a dash in that width where it has none."""
        return f"{'-':>{spec.split('.')[0]}}" if value is None else format(value, spec)

    def speedup(value: float | None) -> str:
        """Against proportional's run of the same policy; none without one in the grid."""
        return f"{'-':>9}" if value is None else f"{value:8.2f}x"

    qos = any(r.get("qos_jobs") for r in runs)
    rate = any(r.get("min_rate_jobs") for r in runs)
    header = (
        f"{'policy':<8} {'allocator':<13} {'jobs':>5} {'avg JCT h':>10} {'p99 JCT h':>10} "
        f"{'makespan h':>11} {'GPU alloc %':>11} {'speed-up':>9} {'wall s':>7}"
        + (f" {'QoS met %':>9} {'tardiness h':>11}" if qos else "")
        + (f" {'rate met %':>10}" if rate else "")
    )
    lines = [header]
    for r in runs:
        lines.append(
            f"{r['policy']:<8} {r['allocator']:<13} {r['jobs']:>5} {fmt(r['avg_jct_h'], '10.2f')} "
            f"{fmt(r['p99_jct_h'], '10.2f')} {fmt(r['makespan_h'], '11.2f')} "
            f"{fmt(r['gpu_alloc_pct'], '11.1f')} "
            f"{speedup(r['speedup_vs_proportional'])} {fmt(r['wall_s'], '7.2f')}"
            + (f" {fmt(r.get('qos_pct'), '9.1f')} {fmt(r.get('tardiness_h'), '11.2f')}" if qos else "")
            + (f" {fmt(r.get('min_rate_pct'), '10.1f')}" if rate else "")
        )
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m scheduler_app.simulator`: `manage.py simulate` without Django (no --store)."""
    parser = argparse.ArgumentParser(
        prog="python -m scheduler_app.simulator",
        description="Simulate a job trace under policies and allocators, without Django or a database "
        "(manage.py simulate --store records a run).",
    )
    add_arguments(parser)
    out = parser.add_argument_group("output")
    out.add_argument("--json", metavar="OUT", help="write {'runs': [...]} with every figure to OUT")
    out.add_argument("--quiet", action="store_true", help="no progress lines")
    opts = vars(parser.parse_args(argv))
    try:
        request = request_from_options(opts)
        trace = simulation_trace_build(request)
        if opts["save_trace"]:
            write_trace(opts["save_trace"], trace)
        progress = None if opts["quiet"] else progress_printer()
        runs = simulation_compare(request, trace=trace, progress=progress)
    except (SimulationRequestError, TraceError) as exc:
        parser.exit(2, f"error: {exc}\n")
    print("\n".join(table_lines(runs)))
    if opts["json"]:
        Path(opts["json"]).write_text(json.dumps({"request": request.to_json(), "runs": runs}, indent=1))
        print(f"wrote {opts['json']}")
    return 0
