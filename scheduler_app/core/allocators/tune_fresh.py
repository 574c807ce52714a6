"""Tune's fresh plan's throughput for a round of single-GPU jobs, without the general walk's objects.

Tune's repack test reads only the throughput of the round planned without claims (tune_repack.py).
Where every admitted job asks one GPU, has no fixed demand and no node count, and the round is tune's
own (`TuneRound` itself, packed placement, tune's GPU order), that plan is a short walk: each job
takes its best case on the first server in packed order that fits it (fewest free GPUs first, then
position), else its fallback demand (proportional, or a best case asking no more) the same way, else
step 5 takes surplus back from the peers on the server with the fewest free GPUs and tries again,
else it waits. `single_gpu_fresh_throughput` does that walk on plain lists: the same tests, the same
float operations in the same order as `TuneRound.place_job` through `RoundState.find_uniform`,
`Packed.place`, `fill`, `take`, `take_back`, `revert_to_proportional` and `adjust` (GPU indices
aside: no count, core, memory or speed depends on which GPU of a server a job gets), and sums the
held jobs' speeds in policy order as `planned_throughput` does. On the image-heavy and equal splits,
where cores are short, the fresh plan was half of a tune run's CPU (docs/simulator.md, "Tune's repack
test"). `tests/scheduler_app/core/test_tune_fresh.py` compares it with the general walk.
"""

from __future__ import annotations

from bisect import insort
from collections.abc import Sequence
from typing import Protocol

from scheduler_app.core.placement import EPS, PACKED, Score, has_fixed_demand
from scheduler_app.core.placement.plan import DemandCache
from scheduler_app.core.placement.state import RoundState
from scheduler_app.core.throughput import ServerShape, needs_downgrade
from scheduler_app.core.types import JobView


class FreshRound(Protocol):
    """What the lean walk reads of tune's round (TuneRound, a RoundSetup)."""

    jobs: Sequence[JobView]
    infeasible: list[str | None]
    admitted: list[bool]
    state: RoundState
    demands: DemandCache
    shape: ServerShape | None
    placement: Score
    sticky: bool


def single_gpu_fresh_throughput(round_: FreshRound) -> float | None:
    """The fresh plan's throughput of `round_`, or None where the round is not of the shape above (the
    caller walks it in full). `round_`: a TuneRound itself (no subclass: their steps may differ) in
    tune's GPU order, not yet run; this spends it (its state is left as the walk leaves it)."""
    state = round_.state
    if (
        round_.sticky
        or round_.placement is not PACKED
        or round_.shape is None
        or state.has_node_counts
        or state.has_claims
    ):
        return None
    jobs, infeasible, admitted = round_.jobs, round_.infeasible, round_.admitted
    walk = []
    for pos, job in enumerate(jobs):
        if infeasible[pos] is None and admitted[pos]:
            if job.num_gpus != 1 or has_fixed_demand(job):
                return None
            walk.append(job)
    best_of, shape = round_.demands.best, round_.shape
    num_free, free_cpus, free_mem = state.num_free, state.free_cpus, state.free_mem_gb
    prop_cpus, prop_mem = state.prop_cpus, state.prop_mem_gb
    buckets = state._buckets  # (RoundState's own: servers by free GPU count, positions sorted)
    total_cpus, total_mem, free_gpus = state.total_free_cpus, state.total_free_mem_gb, state.free_gpu_count
    failed: dict[tuple[float, float], int] = {}  # RoundState._failed for one GPU: (c, m) found no server
    num_servers = len(num_free)
    # Held jobs, by their order of placement (`seq`): speed, cores, GB, revertible; and per server.
    speeds: list[float] = []
    held_cpus: list[float] = []
    held_mem: list[float] = []
    revertible: list[bool] = []
    on_server: list[list[int]] = [[] for _ in range(num_servers)]

    def first_fitting(c_of: list[float] | None, c: float, m_of: list[float] | None, m: float) -> int:
        """Packed.place for one GPU (`fill` over the buckets from one free GPU): the first server whose
        free cores and GB hold the demand, -1 if none. Per-server demands where `c_of` / `m_of`."""
        for b in range(1, len(buckets)):
            for i in buckets[b]:
                ci = c if c_of is None else c_of[i]
                if ci > 0 and (free_cpus[i] + EPS) / ci < 1:
                    continue
                mi = m if m_of is None else m_of[i]
                if mi > 0 and (free_mem[i] + EPS) / mi < 1:
                    continue
                return i
        return -1

    def find_uniform(c: float, m: float) -> int:
        """RoundState.find_uniform for one GPU: the failure memo, the free totals, then the rule."""
        if (c, m) in failed:
            return -1
        i = -1
        if free_gpus >= 1 and 1 * c <= total_cpus + EPS and 1 * m <= total_mem + EPS:
            i = first_fitting(None, c, None, m)
        if i < 0:
            failed[(c, m)] = 1
        return i

    def take_back(i: int, c: float, m: float) -> None:
        """TuneRound.take_back on server i for one GPU at (c, m): peers reverted whole to proportional
        (revert_to_proportional, RoundState.adjust), most cores then most GB first, until it fits."""
        nonlocal total_cpus, total_mem
        need_cpus, need_mem = 1 * c - free_cpus[i], 1 * m - free_mem[i]
        if need_cpus <= EPS and need_mem <= EPS:
            return
        cpus, mem_gb = 1 * prop_cpus[i], 1 * prop_mem[i]
        for s in sorted(on_server[i], key=lambda s: (-held_cpus[s], -held_mem[s], s)):
            if not revertible[s]:
                continue
            surplus_cpus, surplus_mem = held_cpus[s] - cpus, held_mem[s] - mem_gb
            if surplus_cpus <= EPS and surplus_mem <= EPS:
                continue
            if cpus - held_cpus[s] > free_cpus[i] + EPS or mem_gb - held_mem[s] > free_mem[i] + EPS:
                continue
            free_cpus[i] += held_cpus[s] - cpus
            free_mem[i] += held_mem[s] - mem_gb
            total_cpus += held_cpus[s] - cpus
            total_mem += held_mem[s] - mem_gb
            if cpus < held_cpus[s] or mem_gb < held_mem[s]:
                failed.clear()  # something was freed: remembered failures may fit now
            held_cpus[s], held_mem[s] = cpus, mem_gb
            speeds[s], revertible[s] = 1.0, False
            need_cpus -= surplus_cpus
            need_mem -= surplus_mem
            if need_cpus <= EPS and need_mem <= EPS:
                return

    for job in walk:
        best = best_of(job)
        bc, bm = best.cpus_per_gpu, best.mem_gb_per_gpu
        downgrade = False  # held at the per-server proportional share instead of its best case
        speed = best.speed
        i = find_uniform(bc, bm)
        if i < 0:
            downgrade = needs_downgrade(best, shape)
            if downgrade:
                speed = 1.0
                i = first_fitting(prop_cpus, 0.0, prop_mem, 0.0)
            if i < 0:
                # Step 5 on the server with the fewest free GPUs (lowest position among them).
                room = next((srv[0] for srv in buckets[1:] if srv), -1)
                if room >= 0:
                    if downgrade:
                        take_back(room, prop_cpus[room], prop_mem[room])
                        i = first_fitting(prop_cpus, 0.0, prop_mem, 0.0)
                    else:
                        take_back(room, bc, bm)
                        i = find_uniform(bc, bm)
            if i < 0:
                continue  # pending (fragmented): no speed in the plan
        # RoundState.take of one GPU on server i, then the held job.
        cpus = 1 * (prop_cpus[i] if downgrade else bc)
        mem_gb = 1 * (prop_mem[i] if downgrade else bm)
        free_cpus[i] -= cpus
        free_mem[i] -= mem_gb
        total_cpus -= cpus
        total_mem -= mem_gb
        old = num_free[i]
        buckets[old].remove(i)
        insort(buckets[old - 1], i)
        num_free[i] = old - 1
        free_gpus -= 1
        on_server[i].append(len(speeds))
        speeds.append(speed)
        held_cpus.append(cpus)
        held_mem.append(mem_gb)
        revertible.append(not downgrade)
    # Held in policy order (one GPU each: tune's order is the policy's), as planned_throughput sums.
    return sum(speeds)
