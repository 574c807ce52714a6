"""Synergy's testbed experiments: the static and the dynamic 100-job traces on 4 x 8 GPUs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bench.synergy_runs import (
    ALLOCATOR_LABELS,
    DYNAMIC_TRACE,
    STATIC_TRACE,
    TESTBED,
    TUNE_DEMAND,
    TUNE_REF,
    make_allocator,
)
from bench.synergy_tables import md_table, section
from scheduler_app.core.policies.base import Policy
from scheduler_app.core.policies.srtf import SrtfPolicy
from scheduler_app.simulator import TraceJob, read_trace, simulate


# -- a. static 100-job trace on the 32-GPU testbed ------------------------------------------------------
def testbed_trace(data_dir: Path, file_name: str, title: str, command: str) -> list[TraceJob] | None:
    """Print the section's heading and read one of the reference's testbed traces (None: not there)."""
    path = data_dir / file_name
    section(f"{title}, 4 x 8 GPUs (24 cores, 500 GB each), 300 s rounds", command)
    if not path.is_file():
        print(f"(trace {path} not found: pass --data-dir)")
        return None
    return read_trace(path)


def static_section(data_dir: Path, command: str) -> None:
    trace = testbed_trace(data_dir, STATIC_TRACE, "a. Static 100-job trace, FIFO", command)
    if trace is None:
        return
    rows, base = [], {}
    for label in ("proportional", "greedy", "tune", "tune_matrix", "opt", TUNE_REF, TUNE_DEMAND):
        row: list[Any] = [ALLOCATOR_LABELS[label]]
        figures = []
        for round_end in (False, True):
            r = simulate(
                trace, TESTBED, policy="fifo", allocator=make_allocator(label), finish_at_round_end=round_end
            )
            figures.append((r.makespan_h, r.avg_jct_h))
            if label == "proportional":
                base[round_end] = r.makespan_h
        (mk_x, jct_x), (mk_r, jct_r) = figures
        row += [mk_x, mk_r, jct_x, jct_r, f"{base[False] / mk_x:.3f}x", f"{base[True] / mk_r:.3f}x"]
        rows.append(row)
    print(
        md_table(
            [
                "allocator",
                "makespan h (exact)",
                "makespan h (round end)",
                "avg JCT h (exact)",
                "avg JCT h (round end)",
                "makespan speed-up (exact)",
                "(round end)",
            ],
            rows,
        )
    )


def dynamic_section(data_dir: Path, command: str) -> None:
    """The paper's second testbed experiment: the dynamic 100-job trace under SRTF (PAPERS 6, row 3)."""
    trace = testbed_trace(data_dir, DYNAMIC_TRACE, "a'. Dynamic 100-job trace, SRTF", command)
    if trace is None:
        return
    rows, base = [], {}
    variants: list[tuple[str, str, Policy]] = [
        (ALLOCATOR_LABELS[a], a, SrtfPolicy())
        for a in ("proportional", "greedy", "tune", "tune_matrix", "opt", TUNE_REF)
    ]
    # The reference's Synergy mode orders SRTF by the remaining time at the best-case speed-up.
    variants.append(("tune, SRTF by best-case remaining time", "tune", SrtfPolicy(speedup_aware=True)))
    for name, label, policy in variants:
        row: list[Any] = [name]
        figures = []
        for round_end in (False, True):
            r = simulate(
                trace, TESTBED, policy=policy, allocator=make_allocator(label), finish_at_round_end=round_end
            )
            figures.append((r.avg_jct_h, r.p99_jct_h, r.makespan_h))
            if name == "proportional":
                base[round_end] = r.avg_jct_h
        (jct_x, p99_x, mk_x), (jct_r, _, _) = figures
        row += [jct_x, jct_r, p99_x, mk_x, f"{base[False] / jct_x:.3f}x", f"{base[True] / jct_r:.3f}x"]
        rows.append(row)
    print(
        md_table(
            [
                "allocator",
                "avg JCT h (exact)",
                "avg JCT h (round end)",
                "p99 JCT h (exact)",
                "makespan h (exact)",
                "avg JCT gain (exact)",
                "(round end)",
            ],
            rows,
        )
    )
