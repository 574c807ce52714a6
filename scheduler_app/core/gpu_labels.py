"""GPUs of one server are interchangeable: a plan keeps each running job on the GPU indices it holds."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import replace

from scheduler_app.core.types import Decision, JobView, RoundPlan, ServerShare


def keep_gpu_indices(plan: RoundPlan, jobs: Sequence[JobView]) -> RoundPlan:
    """`plan` with each server's GPU indices relabelled so that a running job placed again on a server
    with as many GPUs there as it holds keeps the very GPUs it holds (a kept lease, not a restart).

    The allocators pick a server's free indices in their own order, so a job re-decided onto its own
    server may come back on other indices of the same server: a move for nothing. Relabelling only
    permutes the indices the plan already uses on each server, so no GPU is used twice and none that
    the plan left free is taken. Jobs claim their own GPUs in the plan's (policy) order; the others
    keep their planned indices where nobody claimed them, and take the lowest left where somebody did.
    """
    current = {j.job_id: j.current for j in jobs if j.current is not None}
    if not current:
        return plan
    placements = plan.placements()
    # server -> [(job id, share position)], in the plan's (policy) order
    on_server: dict[int, list[tuple[int, int]]] = defaultdict(list)
    # The servers where a running job is planned on other indices than its own there: elsewhere every
    # running job gets its own indices as planned and the others keep theirs (no GPU is planned twice),
    # so nothing is relabelled (most servers of a round that keeps its running jobs).
    dirty: set[int] = set()
    for job_id, placement in placements.items():
        held = current.get(job_id)
        for k, share in enumerate(placement.shares):
            server_id = share.server_id
            on_server[server_id].append((job_id, k))
            if held is not None and server_id not in dirty:
                if held is placement:
                    continue
                mine = _indices_on(held.shares, server_id)
                if mine and mine != share.gpu_indices:
                    dirty.add(server_id)
    new_indices: dict[tuple[int, int], tuple[int, ...]] = {}
    for server_id, entries in on_server.items():
        if server_id not in dirty:
            continue
        owned = {
            job_id: _indices_on(current[job_id].shares, server_id) if job_id in current else ()
            for job_id, _ in entries
        }
        if not any(owned.values()):
            continue
        used = {g for job_id, k in entries for g in placements[job_id].shares[k].gpu_indices}
        free = set(used)
        waiting = []
        for job_id, k in entries:
            mine = owned[job_id]
            if mine and len(mine) == len(placements[job_id].shares[k].gpu_indices) and free.issuperset(mine):
                new_indices[(job_id, k)] = mine
                free.difference_update(mine)
            else:
                waiting.append((job_id, k))
        clashing = []
        for job_id, k in waiting:  # the others keep what the plan gave them where nobody took it back
            planned = placements[job_id].shares[k].gpu_indices
            if free.issuperset(planned):
                free.difference_update(planned)
            else:
                clashing.append((job_id, k))
        for job_id, k in clashing:  # and a job whose planned GPUs were taken back gets the lowest left
            need = len(placements[job_id].shares[k].gpu_indices)
            new_indices[(job_id, k)] = tuple(sorted(free)[:need])
            free.difference_update(new_indices[(job_id, k)])
    if all(placements[j].shares[k].gpu_indices == idx for (j, k), idx in new_indices.items()):
        return plan
    decisions = []
    for d in plan.decisions:
        if d.placement is None:
            decisions.append(d)
            continue
        shares = tuple(
            _relabelled(share, new_indices.get((d.job_id, k))) for k, share in enumerate(d.placement.shares)
        )
        decisions.append(d if shares == d.placement.shares else _with_shares(d, shares))
    return RoundPlan(tuple(decisions))


def _indices_on(shares: Sequence[ServerShare], server_id: int) -> tuple[int, ...]:
    return next((s.gpu_indices for s in shares if s.server_id == server_id), ())


def _relabelled(share: ServerShare, indices: tuple[int, ...] | None) -> ServerShare:
    return share if indices is None or indices == share.gpu_indices else replace(share, gpu_indices=indices)


def _with_shares(decision: Decision, shares: tuple[ServerShare, ...]) -> Decision:
    assert decision.placement is not None
    return replace(decision, placement=replace(decision.placement, shares=shares))
