"""Slurm's limit on an array's tasks running at once (--array 0-99%4): which waiting tasks it holds back."""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence

# array id -> (its limit, the ids of its live tasks in index order)
ArrayLimits = Mapping[int, tuple[int, Sequence[int]]]


def tasks_past_limit(limits: ArrayLimits, candidates: Iterable[int], taken: Collection[int]) -> set[int]:
    """Those of `candidates` (tasks that could be queued) for which their array has no room: its tasks
    in `taken` (running, or already queued) fill the limit first, then the candidates in index order,
    as Slurm starts an array's lower indices first."""
    wanted = set(candidates)
    past: set[int] = set()
    for limit, task_ids in limits.values():
        room = limit - sum(1 for t in task_ids if t in taken)
        for t in task_ids:
            if t in wanted:
                if room > 0:
                    room -= 1
                else:
                    past.add(t)
    return past
