"""Scores: the order in which a placement rule takes servers (Kubernetes' score plugins).

A `Score` ranks the candidate servers of one stage's `View` (`order`) and may split its rule into
`phases` that each walk every stage before the next phase starts (packed never splits a job a
server could hold whole). `fill` is the shared hot loop: it takes as many GPUs as the resource
filter allows from each candidate, in the score's order. Built in, as Synergy's reference names them:
- `PACKED` (resources/cluster.py `allocate_synergy_placement`): a multi-GPU job whole on the
  fitting server with the fewest usable GPUs (ties: lowest position; with `view.prefer`, the one
  where the fewest claimed GPUs must be taken), else spread from the servers with the fewest
  usable GPUs, as the reference's min-heap drains them.
- `FIRST_FIT` (`_top_synergy_gpus`, the reference's default): servers in cluster order.
A new rule (say, a restart cost that ranks a job's old servers first) is a new Score, usually an
`OrderedScore` with its own `order`, registered in `SCORES` to be chosen by an allocator's
`placement` argument by name.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from itertools import chain
from typing import Protocol

from scheduler_app.core.placement.plan import EPS, Plan
from scheduler_app.core.placement.stages import View

Phase = Callable[[View, int, Sequence[float], Sequence[float]], "Plan | None"]


def fill(
    order: Iterable[int],
    num_gpus: int,
    counts: Sequence[int],
    dc: Sequence[float],
    dm: Sequence[float],
    cpus: Sequence[float],
    mem_gb: Sequence[float],
) -> Plan | None:
    """Take as many GPUs as fit (filters.gpus_fitting) from each server of `order` until `num_gpus`
    are found; None if the candidates cannot hold them all. `dc[i]` / `dm[i]`: per-GPU demand."""
    plan: Plan = []
    need = num_gpus
    for i in order:
        k = counts[i]
        if k <= 0:
            continue
        # filters.gpus_fitting, inlined: this loop is the allocators' hot path.
        c = dc[i]
        if c > 0:
            kc = int((cpus[i] + EPS) / c)
            if kc < k:
                k = kc
        m = dm[i]
        if m > 0:
            km = int((mem_gb[i] + EPS) / m)
            if km < k:
                k = km
        if k <= 0:
            continue
        if k >= need:
            plan.append((i, need))
            return plan
        plan.append((i, k))
        need -= k
    return None


class Score(Protocol):
    """A placement rule: candidate order, and the phases that each walk all stages in turn."""

    name: str

    def order(self, view: View, min_gpus: int) -> Iterable[int]:
        """Server positions with at least `min_gpus` usable GPUs (or a superset), best first."""
        ...

    def phases(self, num_gpus: int) -> tuple[Phase, ...]: ...

    def place(self, view: View, num_gpus: int, dc: Sequence[float], dm: Sequence[float]) -> Plan | None:
        """The whole rule over one view (every phase in turn)."""
        ...


class Packed:
    """Fewest usable GPUs first: whole on one server if any holds the job, else spread."""

    name = "packed"

    def __init__(self) -> None:
        # Built once: every search with claims asks for them.
        self._phases_multi: tuple[Phase, ...] = (self.whole, self.spread)
        self._phases_single: tuple[Phase, ...] = (self.spread,)

    def order(self, view: View, min_gpus: int) -> Iterable[int]:
        return chain.from_iterable(view.buckets[max(min_gpus, 1) :])

    def phases(self, num_gpus: int) -> tuple[Phase, ...]:
        return self._phases_multi if num_gpus > 1 else self._phases_single

    def place(self, view: View, num_gpus: int, dc: Sequence[float], dm: Sequence[float]) -> Plan | None:
        if num_gpus > 1:
            plan = self.whole(view, num_gpus, dc, dm)
            if plan is not None:
                return plan
        # spread(), inlined with its order: every first-round search ends here.
        order = chain.from_iterable(view.buckets[1:])
        return fill(order, num_gpus, view.counts, dc, dm, view.cpus, view.mem_gb)

    def whole(self, view: View, num_gpus: int, dc: Sequence[float], dm: Sequence[float]) -> Plan | None:
        """The job on the fitting server with the fewest usable GPUs; with `view.prefer`, among those
        of the fewest the one where the fewest claimed GPUs must be taken (ties: lowest position)."""
        buckets, cpus, mem_gb, prefer = view.buckets, view.cpus, view.mem_gb, view.prefer
        for b in range(num_gpus, len(buckets)):
            pick = -1
            for i in buckets[b]:
                if cpus[i] + EPS >= num_gpus * dc[i] and mem_gb[i] + EPS >= num_gpus * dm[i]:
                    if prefer is None or prefer[i] >= num_gpus:
                        return [(i, num_gpus)]
                    if pick < 0 or prefer[i] > prefer[pick]:
                        pick = i
            if pick >= 0:
                return [(pick, num_gpus)]
        return None

    def spread(self, view: View, num_gpus: int, dc: Sequence[float], dm: Sequence[float]) -> Plan | None:
        """As many GPUs as fit from each server, fewest usable GPUs first (`order` from 1 GPU)."""
        order = chain.from_iterable(view.buckets[1:])
        return fill(order, num_gpus, view.counts, dc, dm, view.cpus, view.mem_gb)


class OrderedScore:
    """A one-phase score that takes servers in `order`: the base of a new score (say, a restart cost
    that ranks a job's old servers first), which then only gives `name` and `order`."""

    name = "ordered"

    def __init__(self) -> None:
        self._phases: tuple[Phase, ...] = (self.place,)  # built once: every search asks for them

    def order(self, view: View, min_gpus: int) -> Iterable[int]:
        raise NotImplementedError

    def phases(self, num_gpus: int) -> tuple[Phase, ...]:
        return self._phases

    def place(self, view: View, num_gpus: int, dc: Sequence[float], dm: Sequence[float]) -> Plan | None:
        return fill(self.order(view, 1), num_gpus, view.counts, dc, dm, view.cpus, view.mem_gb)


class FirstFit(OrderedScore):
    """Servers in cluster order, taking every GPU that still has its per-GPU share."""

    name = "first_fit"

    def order(self, view: View, min_gpus: int) -> Iterable[int]:
        return range(len(view.counts))

    def place(self, view: View, num_gpus: int, dc: Sequence[float], dm: Sequence[float]) -> Plan | None:
        # OrderedScore.place with the order inlined: proportional's and greedy's every search.
        return fill(range(len(view.counts)), num_gpus, view.counts, dc, dm, view.cpus, view.mem_gb)


PACKED = Packed()
FIRST_FIT = FirstFit()
SCORES: dict[str, Score] = {FIRST_FIT.name: FIRST_FIT, PACKED.name: PACKED}


def score_named(placement: str | Score) -> Score:
    """The score an allocator's `placement` argument names (a Score is returned as is)."""
    if not isinstance(placement, str):
        return placement
    score = SCORES.get(placement)
    if score is None:
        raise ValueError(f"placement must be one of {tuple(SCORES)}, got {placement!r}")
    return score
