"""GENIE's steady round without the per-job search: every job kept at its best case, whatever the order.

A round in which every job already runs at its best case (the best-effort option a round gives first,
`best_case`), nothing waits and nothing reads progress or the clock is common between arrivals and
ends; under SWAF the order of such jobs changes every round as they progress, so a simulator cannot
reuse the last plan (simulator/reuse.py `holds` needs the same order), and deciding it walks every
job through `GenieRound.decide`. This module tells, in one pass over the jobs, that the decision would
keep each job where it is, and builds that plan. Exact: `GenieRound.run` on the same inputs gives the
same plan (tests/scheduler_app/core/test_genie_steady.py checks it on random clusters and orders).

Why deciding keeps every job (each condition below is checked, else None and the round is decided):
- every job is admitted (its GPUs fit) and feasible, has no QoS target, no GPU-count choices, no node
  count, no fixed demand, and no interference term that placement would read (kappa on a job that
  communicates);
- each job's current placement is valid on the snapshot (known servers, each once; free GPUs that no
  other job holds), holds the job's GPU count, and is what `GenieRound.place` + `RoundSetup.placed`
  record for its best case there: floor(k x cores) and k x GB per server, the best case's speed with
  the spread's penalty (genie_kept.py, worked out once per Placement object and snapshot);
- on every server the jobs' demands at their best cases fit what is free (within half the placement
  code's tolerance): so each job's home holds its demand in any order, `home_plan`'s strict test
  passes (a job asking what it held always does) and so do the free totals' shortcuts;
- `starves_gpus` passes for each job in this order, by more than rounding (margin `MARGIN`): the free
  cores and GB after it, less the proportional share of the GPUs after it, stay positive;
- no point of a job's matrix is faster than its best case, so the leftover pass moves nobody.
Each job then finds its home first (`RoundState.find`), takes its own GPUs back (`_take_home`) and is
recorded as kept (`RoundSetup.placed`: its own Placement, reason `best_case`); the plan is stable.
"""

from __future__ import annotations

from collections.abc import Sequence

from scheduler_app.core import reasons
from scheduler_app.core.allocators.genie_kept import KEPT_ENTRIES, kept_job
from scheduler_app.core.placement.plan import EPS as PLACEMENT_EPS
from scheduler_app.core.placement.plan import PlanBuilder
from scheduler_app.core.throughput import ServerShape, cluster_shape
from scheduler_app.core.types import ClusterSnapshot, JobView, RoundPlan

# How far from a test's boundary a sum must be for the order of its additions not to matter: a sum
# here and the same sum in the full round differ by rounding only (about 1e-13 for a few hundred jobs).
MARGIN = 1e-6


def steady_plan(ordered_jobs: Sequence[JobView], snapshot: ClusterSnapshot) -> RoundPlan | None:
    """The plan `GenieRound.run` gives when every job stays at its best case (module docstring), or
    None when that is not certain: decide the round then."""
    if not ordered_jobs:
        return None
    for job in ordered_jobs:
        if job.current is None:
            return None  # a newcomer or a waiting job (most rounds that are not steady): at once
    shape = cluster_shape(snapshot)
    if shape is None:
        return None
    servers = snapshot.servers
    num_servers = len(servers)
    need_cpus = [0.0] * num_servers
    need_mem_gb = [0.0] * num_servers
    taken = [0] * num_servers  # per server: the GPUs held so far, as a bit mask
    best_cpus: list[float] = []  # per job, in order: its demand at its best case, cluster-wide
    best_mem_gb: list[float] = []
    above_share: list[bool] = []
    entries = KEPT_ENTRIES
    for job in ordered_jobs:
        if (
            job.deadline_s is not None
            or job.min_rate_iters_per_s is not None
            or job.gpu_choices
            or job.num_nodes is not None
            or job.cpus_per_gpu_override is not None
            or job.mem_gb_per_gpu_override is not None
        ):
            return None
        current = job.current
        hit = entries.get(id(current))  # kept_job's memo, read inline (every job of a steady round)
        if (
            hit is not None
            and hit[0] is current
            and hit[1] is snapshot
            and hit[2] is job.profile
            and hit[3] == job.job_id
            and hit[4] == job.num_gpus
        ):
            kept = hit[5]
        else:
            kept = kept_job(job, snapshot, shape)
        if kept is None:
            return None
        for i, mask, cpus, mem_gb in kept.shares:
            if taken[i] & mask:
                return None  # a GPU two jobs hold
            taken[i] |= mask
            need_cpus[i] += cpus
            need_mem_gb[i] += mem_gb
        best_cpus.append(kept.cpus)
        best_mem_gb.append(kept.mem_gb)
        above_share.append(kept.above_share)
    # RoundState.home_plan lets a job back onto its home while its demand fits what is free there
    # + PLACEMENT_EPS: the whole server's demands within half that, so that the full round's sums,
    # added in another order, pass too.
    slack = PLACEMENT_EPS / 2
    for i, server in enumerate(servers):
        if need_cpus[i] > server.free_cpus + slack or need_mem_gb[i] > server.free_mem_gb + slack:
            return None
    if not _never_starves(ordered_jobs, snapshot, shape, best_cpus, best_mem_gb, above_share):
        return None
    # Every job is feasible (infeasible_reasons): none has a node count or a fixed demand, and each
    # holds its 1 to total_gpus GPUs on the snapshot's servers (genie_kept.py).
    builder = PlanBuilder(ordered_jobs)
    for pos, job in enumerate(ordered_jobs):
        assert job.current is not None
        builder.kept(pos, job.current, reasons.BEST_CASE)
    return builder.build(stable=True)


def _never_starves(
    ordered_jobs: Sequence[JobView],
    snapshot: ClusterSnapshot,
    shape: ServerShape,
    best_cpus: Sequence[float],
    best_mem_gb: Sequence[float],
    above_share: Sequence[bool],
) -> bool:
    """`GenieRound.starves_gpus` is False for every job above its proportional share, in this order,
    by more than MARGIN: free after it (everything free less the demands up to it) against the
    proportional share of the GPUs after it (every job is admitted)."""
    c, m = shape.cpus_per_gpu, shape.mem_gb_per_gpu
    free_cpus = float(sum(float(s.free_cpus) for s in snapshot.servers))
    free_mem_gb = float(sum(float(s.free_mem_gb) for s in snapshot.servers))
    later_gpus = sum(job.num_gpus for job in ordered_jobs)
    for pos, job in enumerate(ordered_jobs):
        later_gpus -= job.num_gpus
        free_cpus -= best_cpus[pos]
        free_mem_gb -= best_mem_gb[pos]
        if not above_share[pos] or later_gpus <= 0:
            continue
        if free_cpus - later_gpus * c < MARGIN or free_mem_gb - later_gpus * m < MARGIN:
            return False
    return True
