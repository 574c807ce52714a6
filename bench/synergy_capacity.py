"""Where the 128-GPU cluster saturates: mean job size, proportional and fluid-LP saturation loads."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from scipy.optimize import linprog

from bench.synergy_runs import BIG_CLUSTER, SPLITS
from bench.synergy_tables import md_table, section
from profiles_app.catalog import load_catalog
from scheduler_app.core.throughput import ServerShape, best_case, relative_speed
from scheduler_app.simulator import ClusterSpec, TraceJob, philly_derived_trace

CAPACITY_JOBS = 100_000  # a long trace: its mean job size is close to the distribution's (16.8 GPU-hours)


# -- capacity: where the 128-GPU cluster saturates --------------------------------------------------------
def no_queueing_gain(trace: Sequence[TraceJob], cluster: ClusterSpec) -> float:
    """Tune's mean-JCT gain over proportional if no job ever waited or shared: every job at its best case.

    Mean of the jobs' proportional durations over the mean of their best-case durations. It is the limit
    of the gain as the load goes to 0; any larger gain has to come from queueing (a shorter wait).
    """
    catalog = load_catalog()
    shape = ServerShape(cluster.gpus_per_server, float(cluster.cpus_per_server), cluster.mem_gb_per_server)
    at_proportional = at_best = 0.0
    for t in trace:
        duration_s = t.total_iters * catalog[t.model].iter_time_s
        at_proportional += duration_s
        at_best += duration_s / best_case(catalog[t.model], t.num_gpus, shape).speed
    return at_proportional / at_best


def fluid_capacity(trace: Sequence[TraceJob], cluster: ClusterSpec) -> tuple[float, float, float]:
    """Mean GPU-hours a job (at proportional), saturation jobs/h at proportional and at the best CPU/memory.

    The second is the fluid LP: choose per (model, GPU count) class a mix of operating points (matrix grid
    points at least as fast as proportional, and the capped best case) that serves the arrival rate, within
    the cluster's total GPUs, cores and memory; maximise the arrival rate. No packing or ordering losses, so
    no allocator can sustain a higher load.
    """
    catalog = load_catalog()
    shape = ServerShape(cluster.gpus_per_server, float(cluster.cpus_per_server), cluster.mem_gb_per_server)
    work: dict[tuple[str, int], float] = {}
    for t in trace:
        key = (t.model, t.num_gpus)
        work[key] = work.get(key, 0.0) + t.total_iters * catalog[t.model].iter_time_s * t.num_gpus / 3600.0
    span_jobs = len(trace)
    mean_work = sum(work.values()) / span_jobs
    columns: list[tuple[int, float, float, float]] = []  # (class, speed, cpus/GPU, mem/GPU)
    classes = sorted(work)
    for ci, (model, gpus) in enumerate(classes):
        profile = catalog[model]
        best = best_case(profile, gpus, shape)
        points = {
            (best.cpus_per_gpu, best.mem_gb_per_gpu): best.speed,
            (shape.cpus_per_gpu, shape.mem_gb_per_gpu): 1.0,
        }
        on_one = min(gpus, shape.num_gpus)  # a job never holds more than one server's share per GPU
        for c in profile.cpu_per_gpu_grid:
            for m in profile.mem_gb_per_gpu_grid:
                if c <= shape.num_cpus / on_one and m <= shape.mem_gb / on_one:
                    s = relative_speed(profile, gpus, shape, c, m)
                    if s >= 1.0:
                        points.setdefault((c, m), s)
        columns += [(ci, s, c, m) for (c, m), s in points.items()]
    n = len(columns)
    # Variables: GPUs busy at each column (n), then the arrival rate lam. Maximise lam.
    cost = np.zeros(n + 1)
    cost[-1] = -1.0
    a_ub, b_ub = [], []
    for ci, key in enumerate(classes):
        row = np.zeros(n + 1)  # lam * share * work - sum(gpus * speed) <= 0
        for j, (cj, s, _, _) in enumerate(columns):
            if cj == ci:
                row[j] = -s
        row[-1] = work[key] / span_jobs
        a_ub.append(row)
        b_ub.append(0.0)
    for idx, cap in ((None, cluster.total_gpus), (2, cluster.total_cpus), (3, cluster.total_mem_gb)):
        row = np.zeros(n + 1)
        for j, col in enumerate(columns):
            row[j] = 1.0 if idx is None else col[idx]
        a_ub.append(row)
        b_ub.append(float(cap))
    res = linprog(
        cost, A_ub=np.array(a_ub), b_ub=np.array(b_ub), bounds=[(0, None)] * (n + 1), method="highs"
    )
    return mean_work, cluster.total_gpus / mean_work, float(res.x[-1]) if res.success else float("nan")


CAPACITY_HEADERS = [
    "jobs",
    "split",
    "trace",
    "mean GPU-h per job (proportional)",
    "saturation jobs/h, proportional",
    "saturation jobs/h, best CPU/mem (fluid LP)",
    "ratio",
    "tune's gain with no queueing (load -> 0)",
]


def capacity_rows(jobs: int, seeds: Sequence[int]) -> list[list[object]]:
    """The capacity table's rows (a worker's task: the long traces and their LPs take seconds)."""
    rows: list[list[object]] = []
    for multi in (False, True):
        kind = "multi-GPU" if multi else "1 GPU"
        for name, split in SPLITS.items():
            traces = [(f"{CAPACITY_JOBS:,} jobs, seed 1", CAPACITY_JOBS, 1)]
            if name == "20,70,10":  # durations do not depend on the class: the other split's figures match
                traces += [(f"{jobs:,} jobs, seed {seed}", jobs, seed) for seed in seeds]
            for label, n, seed in traces:
                trace = philly_derived_trace(
                    n, jobs_per_hour=9.0, class_split=split, multi_gpu=multi, seed=seed
                )
                mean_work, sat_prop, sat_fluid = fluid_capacity(trace, BIG_CLUSTER)
                gain = no_queueing_gain(trace, BIG_CLUSTER)
                rows.append([kind, name, label, mean_work, sat_prop, sat_fluid, sat_fluid / sat_prop, gain])
    return rows


def capacity_section(
    command: str, jobs: int, seeds: Sequence[int], computed: list[list[object]] | None = None
) -> None:
    """The capacity table. `computed`: `capacity_rows(jobs, seeds)`, worked out by the caller's
    workers (None: worked out here)."""
    section("Capacity of the 128-GPU cluster (16 x 8 GPUs, 24 cores, 500 GB)", command)
    print(md_table(CAPACITY_HEADERS, capacity_rows(jobs, seeds) if computed is None else computed))
