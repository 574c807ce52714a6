"""Whole-trace simulation speed against the reference simulator (msr-fiddle/synergy), in one sitting.

Run: `python -m bench.simulate_trace [--against-reference DIR] [--repeats N] [--allocators a,b,...]`.

The trace is the Synergy reference trace (1,000 Philly-derived single-GPU jobs, 9 jobs an hour) on
16 servers x 8 GPUs, FIFO + tune, 300 s rounds, the reference's round-end convention. Attune's figures:
the whole command (`python -m scheduler_app.simulator`, a fresh process: wall, CPU and peak memory)
and the simulation alone (simulate() in this process: wall and CPU, best of the repeats).

`--against-reference DIR`: DIR is a checkout of msr-fiddle/synergy; its `simulator/runner.py` is run
with `--reference-python` (Python 3.8 with its requirements) and Attune's command alternately, each
`--repeats` times, and the ratios of the two printed. The reference's runner.py names the schedulers it
runs in a list inside `main` (`schedulers = ['FIFO+fair']` at 1bb2bed): make it `['FIFO+tune']` in the
checkout to measure the same settings. Its simulation alone is not separated from its process here.
Without the option, the last measured reference figures (REFERENCE below, with their date) stand in.

`--allocators proportional,greedy,...` adds the older per-allocator table: simulate() wall time, peak
Python memory, rounds and average JCT per allocator, and the ratio to proportional.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shlex
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from bench.common import peak_memory_mb, print_table
from scheduler_app.simulator import ClusterSpec, read_trace, simulate

REPO_ROOT = Path(__file__).resolve().parent.parent
REFERENCE_TRACE = REPO_ROOT / "tests/data/synergy/philly1gpu_l9_n1000_s42.csv"
CLUSTER = ClusterSpec(servers=16, gpus_per_server=8, cpus_per_server=24, mem_gb_per_server=500.0)
POLICY, ALLOCATOR, ROUND_S = "fifo", "tune", 300.0
DEFAULT_REFERENCE_CMD = "{python} runner.py --cluster_job_log trace/cluster_job_log --replay_trace {trace}"


@dataclass(frozen=True)
class Measured:
    """Ranges over the repeats: (low, high)."""

    process_s: tuple[float, float]
    simulation_s: tuple[float, float] | None
    peak_mib: float | None


# The reference as last measured on the 2-core dev VM, one run after the other, twice (issue 40, filed
# 2026-11-28): msr-fiddle/synergy at 1bb2bed under Python 3.8, FIFO+tune on this trace.
REFERENCE = Measured(process_s=(41.0, 56.0), simulation_s=(38.0, 52.0), peak_mib=207.0)
REFERENCE_NOTE = "msr-fiddle/synergy 1bb2bed, Python 3.8, measured 2026-11-28 on the 2-core dev VM (issue 40)"


def _children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def attune_command(trace: Path, out_json: Path) -> list[str]:
    return [
        sys.executable,
        "-m",
        "scheduler_app.simulator",
        "--trace",
        str(trace),
        "--policy",
        POLICY,
        "--allocator",
        ALLOCATOR,
        "--round-s",
        str(ROUND_S),
        "--finish-at-round-end",
        "--quiet",
        "--json",
        str(out_json),
    ]


def run_process(cmd: list[str], cwd: Path) -> tuple[float, float, float]:
    """Wall and CPU seconds of one fresh process, and its peak resident memory (MiB, from /usr/bin/time
    where present, else the largest child so far)."""
    timer = ["/usr/bin/time", "-f", "%M"] if Path("/usr/bin/time").exists() else []
    cpu0, t0 = _children_cpu_s(), time.perf_counter()
    out = subprocess.run(timer + cmd, cwd=cwd, capture_output=True, text=True, check=False)
    wall_s, cpu_s = time.perf_counter() - t0, _children_cpu_s() - cpu0
    if out.returncode != 0:
        raise SystemExit(f"{shlex.join(cmd)} failed ({out.returncode}):\n{out.stderr[-2000:]}")
    if timer:
        peak_mib = int(out.stderr.strip().splitlines()[-1]) / 1024
    else:
        peak_mib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    return wall_s, cpu_s, peak_mib


def simulation_alone(trace: Path) -> tuple[float, float, float]:
    """simulate() in this process: wall s, CPU s and the average JCT (h)."""
    jobs = read_trace(trace)
    t0, c0 = time.perf_counter(), time.process_time()
    result = simulate(
        jobs, CLUSTER, policy=POLICY, allocator=ALLOCATOR, round_s=ROUND_S, finish_at_round_end=True
    )
    return time.perf_counter() - t0, time.process_time() - c0, result.avg_jct_h


def span(values: list[float]) -> tuple[float, float]:
    return min(values), max(values)


def fmt_span(lo_hi: tuple[float, float], digits: int = 2) -> str:
    lo, hi = lo_hi
    return (
        f"{lo:.{digits}f}" if round(lo, digits) == round(hi, digits) else f"{lo:.{digits}f}-{hi:.{digits}f}"
    )


def ratio(ref: tuple[float, float], ours: tuple[float, float]) -> str:
    """The reference's range over ours, as the slowest and fastest pairing: low-high x."""
    return f"{ref[0] / ours[1]:.0f}-{ref[1] / ours[0]:.0f}x"


def compare(args: argparse.Namespace) -> None:
    trace = args.trace.resolve()
    wall, cpu, peak, sim_wall, sim_cpu = [], [], [], [], []
    ref_wall: list[float] = []
    ref_cpu: list[float] = []
    ref_peak: list[float] = []
    avg_jct = None
    with tempfile.TemporaryDirectory() as tmp:
        out_json = Path(tmp) / "runs.json"
        for i in range(args.repeats):
            if args.against_reference is not None:
                cmd = shlex.split(args.reference_cmd.format(python=args.reference_python, trace=trace))
                w, c, p = run_process(cmd, args.against_reference / "simulator")
                ref_wall.append(w), ref_cpu.append(c), ref_peak.append(p)
                print(f"reference run {i + 1}: {w:.2f} s wall, {c:.2f} s CPU, {p:.0f} MiB", file=sys.stderr)
            w, c, p = run_process(attune_command(trace, out_json), REPO_ROOT)
            wall.append(w), cpu.append(c), peak.append(p)
            run = json.loads(out_json.read_text())["runs"][0]
            sw, sc, avg_jct = simulation_alone(trace)
            sim_wall.append(sw), sim_cpu.append(sc)
            print(
                f"Attune run {i + 1}: command {w:.2f} s wall, {c:.2f} s CPU, {p:.0f} MiB; "
                f"simulation {sw:.2f} s wall, {sc:.2f} s CPU (in the command: {run['wall_s']:.2f} s)",
                file=sys.stderr,
            )
    if args.against_reference is not None:
        ref = Measured(span(ref_wall), None, max(ref_peak))
        note = f"measured now, alternately with Attune ({args.repeats} runs each)"
    else:
        ref, note = REFERENCE, REFERENCE_NOTE
    print(
        f"\n{trace.name}: {len(read_trace(trace))} jobs, {CLUSTER.servers} x {CLUSTER.gpus_per_server} GPUs, "
        f"{POLICY}+{ALLOCATOR}, {ROUND_S:g} s rounds, round-end convention; {args.repeats} runs; "
        f"{os.cpu_count()} cores (wall times depend on what else runs)\n"
    )
    rows = [
        [
            "whole command, wall s",
            fmt_span(ref.process_s),
            fmt_span(span(wall)),
            ratio(ref.process_s, span(wall)),
        ],
        [
            "whole command, CPU s",
            fmt_span(span(ref_cpu)) if ref_cpu else "-",
            fmt_span(span(cpu)),
            ratio(span(ref_cpu) if ref_cpu else ref.process_s, span(cpu)),
        ],
        [
            "simulation alone, wall s",
            fmt_span(ref.simulation_s) if ref.simulation_s else "(not separated)",
            fmt_span(span(sim_wall)),
            ratio(ref.simulation_s, span(sim_wall)) if ref.simulation_s else "-",
        ],
        [
            "simulation alone, CPU s",
            "-",
            fmt_span(span(sim_cpu)),
            ratio(ref.simulation_s, span(sim_cpu)) if ref.simulation_s else "-",
        ],
        ["peak memory MiB", f"{ref.peak_mib:.0f}" if ref.peak_mib else "-", f"{max(peak):.0f}", "-"],
    ]
    print_table(["", "reference", "Attune", "reference / Attune"], rows)
    print(
        f"\nreference: {note}; Attune's average JCT {avg_jct:.4f} h. Without a measured reference CPU "
        "time, the CPU rows compare Attune's CPU seconds with the reference's wall seconds measured with "
        "the machine to itself (a single-threaded process then runs at one core: wall = CPU); on a "
        "shared machine Attune's wall seconds are stretched by the other work, and its CPU rows are the "
        "fair ones."
    )


def per_allocator(trace_path: Path, allocators: list[str], round_end: bool) -> None:
    trace = read_trace(trace_path)
    print(f"\nper allocator, {trace_path.name}: {len(trace)} jobs on {CLUSTER.total_gpus} GPUs, FIFO")
    rows, baseline = [], None
    for name in allocators:
        result, peak_mb = peak_memory_mb(
            lambda n=name: simulate(trace, CLUSTER, policy="fifo", allocator=n, finish_at_round_end=round_end)
        )
        # tracemalloc slows Python down; time a second, untraced run for the wall figure.
        wall_s = simulate(trace, CLUSTER, policy="fifo", allocator=name, finish_at_round_end=round_end).wall_s
        baseline = baseline or wall_s
        rows.append([name, wall_s, wall_s / baseline, peak_mb, result.rounds, result.avg_jct_h])
    print_table(["allocator", "wall s", "x proportional", "peak MB", "rounds", "avg JCT h"], rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trace", type=Path, default=REFERENCE_TRACE, help="reference trace file")
    parser.add_argument("--repeats", type=int, default=2, help="runs of each side (default 2)")
    parser.add_argument(
        "--against-reference", type=Path, metavar="DIR", help="a checkout of msr-fiddle/synergy to run too"
    )
    parser.add_argument(
        "--reference-python", default="python3.8", help="the reference's Python (default python3.8)"
    )
    parser.add_argument(
        "--reference-cmd",
        default=DEFAULT_REFERENCE_CMD,
        help=f"the reference's command, run in DIR/simulator (default {DEFAULT_REFERENCE_CMD!r})",
    )
    parser.add_argument("--allocators", help="also the per-allocator table, e.g. proportional,greedy,tune")
    parser.add_argument("--round-end", action="store_true", help="per-allocator table: round-end convention")
    args = parser.parse_args()
    if args.against_reference is not None and not (args.against_reference / "simulator/runner.py").is_file():
        parser.error(
            f"{args.against_reference} is not a checkout of msr-fiddle/synergy (no simulator/runner.py)"
        )
    compare(args)
    if args.allocators:
        per_allocator(args.trace, args.allocators.split(","), args.round_end)


if __name__ == "__main__":
    main()
