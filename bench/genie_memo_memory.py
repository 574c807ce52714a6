"""The memory of genie's per-profile memo (allocators/genie_points.py) at its bound, and at a simulation's.

Run: `python -m bench.genie_memo_memory [--gpus-per-server 8] [--servers 16]`.

`shape_points` keeps a job's points per profile identity, up to `MEMO_SIZE` entries, cleared whole
when full. Its worst case is a process in which every job's profile is its own object (a round that
reads the profiles afresh from the database): this bench fills the memo to its bound with that many
distinct profiles (the catalog's, each unpickled anew, so no two share a matrix) at 1, 2, 4 and 8 GPUs,
asks each entry for every answer it can hold (Pareto points, speeds, QoS and best-effort options), and
prints what the entries hold and what the profiles they keep alive hold (tracemalloc), beside the same
for the catalog's own profiles (a simulation: one profile object per workload).
"""

from __future__ import annotations

import argparse
import gc
import pickle
import tracemalloc
from collections.abc import Callable, Sequence
from typing import TypeVar

from scheduler_app.core.allocators import genie_points
from scheduler_app.core.throughput import ServerShape, cluster_shape
from scheduler_app.core.types import SensitivityProfile
from scheduler_app.simulator import ClusterSpec
from scheduler_app.simulator.workloads import load_catalog

GPU_COUNTS = (1, 2, 4, 8)
T = TypeVar("T")


def traced_mib(build: Callable[[], T]) -> tuple[float, T]:
    """MiB that `build()`'s result holds once built (tracemalloc, after a collection), and the result."""
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    kept = build()
    gc.collect()
    held = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    return held / 2**20, kept


def fill(profiles: Sequence[SensitivityProfile], shape: ServerShape) -> int:
    """Ask the memo for every answer of each profile, cycling the GPU counts; the entries it holds."""
    genie_points.memo_clear()
    for i, profile in enumerate(profiles):
        entry = genie_points.shape_points(profile, GPU_COUNTS[i % len(GPU_COUNTS)], 1, shape)
        entry.qos_options(1.0)
        entry.best_effort_options()
        _ = entry.points, entry.speeds, entry.fastest_speed
    return genie_points.memo_entries()


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--servers", type=int, default=16)
    parser.add_argument("--gpus-per-server", type=int, default=8)
    args = parser.parse_args(argv)
    cluster = ClusterSpec(servers=args.servers, gpus_per_server=args.gpus_per_server)
    shape = cluster_shape(cluster.snapshot())
    catalog = list(load_catalog().values())
    blobs = [pickle.dumps(p) for p in catalog]
    bound = genie_points.MEMO_SIZE

    profiles_mib, fresh = traced_mib(lambda: [pickle.loads(blobs[i % len(blobs)]) for i in range(bound)])
    memo_mib, entries = traced_mib(lambda: fill(fresh, shape))
    total_mib = memo_mib + profiles_mib
    print(f"memo at its bound ({entries} entries, each profile its own object): entries {memo_mib:.1f} MiB,")
    print(f"  the {bound} profiles they keep alive {profiles_mib:.1f} MiB, {total_mib:.1f} MiB in all")
    sim_mib, sim_entries = traced_mib(lambda: fill([p for p in catalog for _ in GPU_COUNTS], shape))
    print(f"a simulation's memo (the catalog's {len(catalog)} profiles x {len(GPU_COUNTS)} GPU counts):")
    print(f"  {sim_entries} entries, {sim_mib:.2f} MiB")
    genie_points.memo_clear()


if __name__ == "__main__":
    main()
