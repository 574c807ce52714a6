"""GENIE's interference term: communication-heavy jobs that share a server slow each other down.

PAPERS.md §2.3 "Prediction model": t is multiplied by (1 + kappa x), x being the number of other
communication-heavy tasks on the same node(s), kappa learnt per workload (profile.interference_kappa,
0 until measured: core/predictor.fit_interference_kappa). Our reading of "communication-heavy" [I]: a
job with more than one GPU, which all-reduces its gradients every iteration. The factor applies to such
jobs only: a 1-GPU job does not contend for PCIe/NVLink or the NIC in this model. The engine applies
it to every plan (`with_interference`), so the simulator and the live service time co-located jobs
alike whatever the allocator; the genie allocator also decides with it (allocators/genie.py).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from operator import attrgetter

from scheduler_app.core.types import Decision, JobView, Placement, RoundPlan, SensitivityProfile


def communicates(num_gpus: int) -> bool:
    """Whether a job is communication-heavy: it has more than one GPU to all-reduce across."""
    return num_gpus > 1


def interference_factor(profile: SensitivityProfile, num_gpus: int, colocated_comm_jobs: int) -> float:
    """(1 + kappa x): how many times slower a job runs next to `colocated_comm_jobs` other
    communication-heavy jobs on its servers; 1.0 for a job that does not communicate, or kappa 0."""
    if colocated_comm_jobs <= 0 or profile.interference_kappa <= 0 or not communicates(num_gpus):
        return 1.0
    return 1.0 + profile.interference_kappa * colocated_comm_jobs


def colocated_comm_jobs(placements: Iterable[Placement]) -> dict[int, int]:
    """Job id -> how many other communication-heavy placed jobs share at least one of its servers."""
    placements = list(placements)
    on_server: dict[int, set[int]] = defaultdict(set)
    for p in placements:
        if communicates(p.num_gpus):
            for share in p.shares:
                on_server[share.server_id].add(p.job_id)
    counts = {}
    for p in placements:
        others: set[int] = set()
        for share in p.shares:
            others |= on_server.get(share.server_id, set())
        others.discard(p.job_id)
        counts[p.job_id] = len(others)
    return counts


_kappa_of = attrgetter("profile.interference_kappa")


def with_interference(plan: RoundPlan, jobs: Sequence[JobView] | Mapping[int, JobView]) -> RoundPlan:
    """The plan with each placed job's speed-up divided by its interference factor (the same plan
    when no job's workload has a measured kappa, which is the common case and costs one scan)."""
    views = jobs.values() if isinstance(jobs, Mapping) else jobs
    # The distinct kappas (a handful of profiles), gathered without a Python call per job.
    if not any(kappa > 0 for kappa in set(map(_kappa_of, views))):
        return plan
    by_id = jobs if isinstance(jobs, Mapping) else {j.job_id: j for j in jobs}
    placements = plan.placements()
    counts = colocated_comm_jobs(placements.values())
    decisions = []
    for d in plan.decisions:
        p = d.placement
        if p is not None:
            factor = interference_factor(by_id[d.job_id].profile, p.num_gpus, counts[d.job_id])
            if factor != 1.0:
                d = Decision(d.job_id, d.outcome, d.reason, Placement(p.job_id, p.shares, p.speedup / factor))
        decisions.append(d)
    return RoundPlan(tuple(decisions))
