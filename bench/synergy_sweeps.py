"""Synergy's load sweeps on 128 GPUs: the sweeps' grid, their runs and their tables."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from bench.synergy_runs import ALLOCATOR_LABELS, SPLITS, RunKey, Workload, run_alias, run_windows
from bench.synergy_tables import md_table, section, spread


# -- b. load sweeps on 128 GPUs -----------------------------------------------------------------------------
@dataclass(frozen=True)
class Sweep:
    policy: str
    split: str
    multi_gpu: bool
    loads: tuple[float, ...]
    seeds: tuple[int, ...]
    allocators: tuple[str, ...]

    @property
    def key(self) -> str:
        """How --sweeps names it: policy:split with dashes, ':multi' for multi-GPU jobs."""
        return f"{self.policy}:{self.split.replace(',', '-')}" + (":multi" if self.multi_gpu else "")


# The whole run's grid (bench/reproduce_synergy.py's FULL and QUICK): here, beside Sweep, since the
# sections read it and the entry point imports them.
@dataclass(frozen=True)
class Config:
    jobs: int
    window: tuple[int, int]
    position_windows: tuple[tuple[int, int], ...]
    sweeps: tuple[Sweep, ...]
    position_sweep: Sweep | None
    multi_sweeps: tuple[Sweep, ...]
    opt_jobs: int
    opt_every: int
    opt_workloads: tuple[tuple[str, bool, float], ...]


def sweep_table(s: Sweep, jobs: int, window: tuple[int, int]) -> None:
    others = [a for a in s.allocators if a != "proportional"]
    rows = []
    for load in s.loads:
        jct: dict[str, list[float]] = {a: [] for a in s.allocators}
        for seed in s.seeds:
            w = Workload(jobs, load, SPLITS[s.split], s.multi_gpu, seed)
            for a in s.allocators:
                jct[a].append(run_windows(w, s.policy, a, [window])[window])
        row: list[Any] = [f"{load:g}"] + [spread(jct[a]) for a in s.allocators]
        for a in others:
            gains = [p / x for p, x in zip(jct["proportional"], jct[a], strict=True)]
            row.append(spread(gains))
            if len(s.seeds) > 1:
                row.append(", ".join(f"{g:.2f}" for g in gains))
        rows.append(row)
    headers = ["jobs/h"] + [f"{ALLOCATOR_LABELS[a]} JCT h" for a in s.allocators]
    for a in others:
        headers.append(f"gain {ALLOCATOR_LABELS[a]}")
        if len(s.seeds) > 1:
            headers.append("per seed")
    kind = "multi-GPU" if s.multi_gpu else "single-GPU"
    seeds = ",".join(str(x) for x in s.seeds)
    print(
        f"\n**{s.policy.upper()}, {kind}, split ({s.split}), seeds {seeds}, {jobs:,} jobs** "
        f"(mean JCT of ids [{window[0]}, {window[1]}); mean (min-max) over seeds)\n"
    )
    print(md_table(headers, rows))


def window_position_table(s: Sweep, jobs: int, windows: Sequence[tuple[int, int]]) -> None:
    """FIFO, single-GPU: gain of tune over proportional measured on successive id windows of the same runs."""
    rows = []
    for load in s.loads:
        gains: dict[tuple[int, int], list[float]] = {win: [] for win in windows}
        prop_jct: dict[tuple[int, int], list[float]] = {win: [] for win in windows}
        for seed in s.seeds:
            w = Workload(jobs, load, SPLITS[s.split], s.multi_gpu, seed)
            prop = run_windows(w, s.policy, "proportional", windows)
            tune = run_windows(w, s.policy, "tune", windows)
            for win in windows:
                gains[win].append(prop[win] / tune[win])
                prop_jct[win].append(prop[win])
        rows.append(
            [f"{load:g}"]
            + [spread(prop_jct[win]) for win in (windows[0], windows[-1])]
            + [spread(gains[win]) for win in windows]
        )
    headers = [
        "jobs/h",
        f"proportional JCT h, ids {windows[0][0]}-{windows[0][1] - 1}",
        f"proportional JCT h, ids {windows[-1][0]}-{windows[-1][1] - 1}",
    ] + [f"gain, ids {lo}-{hi - 1}" for lo, hi in windows]
    print(
        f"\n**Window position: FIFO, single-GPU, split ({s.split}), seeds "
        f"{','.join(str(x) for x in s.seeds)}: tune's gain on successive job-id windows of the same runs**\n"
    )
    print(md_table(headers, rows))


def sweep_keys(cfg: Config, sections: set[str]) -> list[RunKey]:
    """Every run the load and multi sections will ask run_windows for, in the order they ask."""
    keys: list[RunKey] = []

    def windows_of(sweep: Sweep) -> tuple[tuple[int, int], ...]:
        # As load_section: FIFO with single-GPU jobs measures every window in one run.
        fifo_single = sweep.policy == "fifo" and not sweep.multi_gpu
        return tuple(cfg.position_windows) if fifo_single else (cfg.window,)

    sweeps = [*cfg.sweeps] if "load" in sections else []
    sweeps += [*cfg.multi_sweeps] if "multi" in sections else []
    for s in sweeps:
        for load in s.loads:
            for seed in s.seeds:
                w = Workload(cfg.jobs, load, SPLITS[s.split], s.multi_gpu, seed)
                keys += [(w, s.policy, a, windows_of(s), 0.0) for a in s.allocators]
    if "load" in sections and cfg.position_sweep is not None:
        s = cfg.position_sweep
        for load in s.loads:
            for seed in s.seeds:
                w = Workload(cfg.jobs, load, SPLITS[s.split], s.multi_gpu, seed)
                keys += [(w, s.policy, a, tuple(cfg.position_windows), 0.0) for a in ("proportional", "tune")]
    return keys


def load_section(cfg: Config, command: str) -> None:
    section(
        f"b. Load sweep, 128 GPUs, {cfg.jobs} generated single-GPU jobs (arrivals go on after the window), "
        f"JCT of ids [{cfg.window[0]}, {cfg.window[1]}), reference round-end convention, stop when measured",
        command,
    )
    for s in cfg.sweeps:
        if s.policy == "fifo" and not s.multi_gpu:
            # FIFO, single-GPU jobs: later arrivals never affect earlier jobs; one run measures every window.
            for seed in s.seeds:
                for load in s.loads:
                    w = Workload(cfg.jobs, load, SPLITS[s.split], False, seed)
                    for a in s.allocators:
                        jct = run_windows(w, s.policy, a, cfg.position_windows)[cfg.window]
                        run_alias((w, s.policy, a, (cfg.window,), 0.0), {cfg.window: jct})
        sweep_table(s, cfg.jobs, cfg.window)
    if cfg.position_sweep is not None:
        window_position_table(cfg.position_sweep, cfg.jobs, cfg.position_windows)


def multi_section(cfg: Config, command: str) -> None:
    if not cfg.multi_sweeps:
        return
    section(
        f"b'. Load sweep with multi-GPU jobs (1/2/4/8 GPUs, 70/10/15/5 %), 128 GPUs, {cfg.jobs} jobs, "
        f"JCT of ids [{cfg.window[0]}, {cfg.window[1]})",
        command,
    )
    for s in cfg.multi_sweeps:
        sweep_table(s, cfg.jobs, cfg.window)
