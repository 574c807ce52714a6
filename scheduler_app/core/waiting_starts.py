"""When the jobs a plan leaves waiting would start within the move guard's horizon, as GPUs free up.

A plan is valued over a horizon (core/restarts.py `plan_value`) as if it held throughout; but the
jobs it runs finish, and what they free lets waiting jobs start well within the horizon. Without that
credit a plan that keeps every running job looks as if its waiting jobs never start, and a repacking
that starts one of them at once (several restarts) looks worth it even when the same job would start
a minute later anyway, when a running job ends. This estimates those later starts: each placed job
releases its GPUs at its predicted finish; waiting jobs, in the policy's order, take the earliest time
from which enough GPUs of one server stay free and hold them until they finish. An estimate for
weighing plans, not a forecast: GPUs only (cores and memory follow them in proportion), a waiting job
runs at its proportional speed, and one that needs several servers gets no start (the plans compared
are valued alike).
"""

from __future__ import annotations

import bisect
import heapq
from collections.abc import Mapping, Sequence

from scheduler_app.core.types import ClusterSnapshot, JobView


class _Timeline:
    """A server's free GPUs over time: changes (offset s, delta) from now on."""

    def __init__(self, free_now: int) -> None:
        self.times: list[float] = [0.0]
        self.deltas: list[int] = [free_now]
        # The least free count from each change on (non-decreasing), worked out again after an `add`.
        self._least_from: list[int] | None = None

    def add(self, at_s: float, delta: int) -> None:
        k = bisect.bisect_right(self.times, at_s)
        self.times.insert(k, at_s)
        self.deltas.insert(k, delta)
        self._least_from = None

    def earliest(self, need: int, until_s: float) -> float | None:
        """The earliest offset <= `until_s` from which at least `need` GPUs stay free for good: the
        first change from which the free count never drops below `need` (a search in the least
        counts from each change on, which never decrease; a server is asked for every waiting job)."""
        least = self._least_from
        if least is None:
            free, levels = 0, []
            for d in self.deltas:
                free += d
                levels.append(free)
            low = levels[-1]
            least = levels
            for k in range(len(levels) - 1, -1, -1):
                low = least[k] = min(low, levels[k])
            self._least_from = least
        k = bisect.bisect_left(least, need)
        if k == len(least) or self.times[k] > until_s:
            return None
        return self.times[k]


def waiting_start_offsets(
    finishes: Mapping[int, tuple[float, tuple[tuple[int, int], ...]]],
    waiting: Sequence[JobView],
    snapshot: ClusterSnapshot,
    horizon_s: float,
) -> dict[int, float]:
    """Waiting job id -> seconds from now at which it could start, for those that could within the
    horizon (module docstring).

    `finishes`: each placed job's predicted finish (seconds from now) and its GPUs per server
    ((server id, GPUs), ...); `waiting`: the jobs without a placement that do not run now, in policy
    order. The snapshot's free GPUs less the plan's are free now.
    """
    used: dict[int, int] = {}
    for _, shares in finishes.values():
        for server_id, gpus in shares:
            used[server_id] = used.get(server_id, 0) + gpus
    lines = {s.server_id: _Timeline(len(s.free_gpus) - used.get(s.server_id, 0)) for s in snapshot.servers}
    largest = max((s.num_gpus for s in snapshot.servers), default=0)
    # What frees within the horizon bounds what can start: stop once it is spoken for.
    freeable = sum(max(0, len(s.free_gpus) - used.get(s.server_id, 0)) for s in snapshot.servers)
    for finish_s, shares in finishes.values():
        if finish_s > horizon_s:
            # What frees after the horizon starts nothing within it: on a timeline only GPUs freed
            # follow the horizon (finishes, and the ends of the waiting jobs' runs), so no free count
            # within it, nor the least from any change within it on, depends on them (`earliest`).
            continue
        for server_id, gpus in shares:
            if server_id in lines:
                lines[server_id].add(finish_s, gpus)
                freeable += gpus
    starts: dict[int, float] = {}
    soonest = _Soonest(list(lines.values()), horizon_s)
    for job in waiting:
        if freeable <= 0:
            break
        need = job.num_gpus
        if need <= 0 or need > largest or (job.num_nodes or 1) > 1:
            continue  # a job over several servers: left out (an estimate; the plans are compared alike)
        best = soonest.server(need)
        if best is None:
            continue
        at, pos = best
        run_s = job.remaining_iters * job.profile.iter_time_s + job.startup_s
        soonest.take(pos, at, at + run_s, need)
        freeable -= need
        starts[job.job_id] = at
    return starts


class _Soonest:
    """The server where `need` GPUs are free for good soonest (the first in snapshot order among
    equals), kept per GPU count in a heap of (earliest start, position) instead of asking every
    server for every waiting job: taking GPUs on a server only lowers its free counts, so its
    earliest start for any count can only move later (or past the horizon), and a heap entry older
    than its server's last change is worked out again when it comes to the top."""

    def __init__(self, lines: list[_Timeline], horizon_s: float) -> None:
        self.lines = lines
        self.horizon_s = horizon_s
        self.changes = [0] * len(lines)  # per server position: how often a job took GPUs there
        self.heaps: dict[int, list[tuple[float, int, int]]] = {}  # need -> (earliest, position, changes)

    def server(self, need: int) -> tuple[float, int] | None:
        """(earliest start, server position) for `need` GPUs, or None within the horizon."""
        heap = self.heaps.get(need)
        if heap is None:
            heap = []
            for pos, line in enumerate(self.lines):
                at = line.earliest(need, self.horizon_s)
                if at is not None:
                    heap.append((at, pos, 0))
            heapq.heapify(heap)
            self.heaps[need] = heap
        changes = self.changes
        while heap:
            at, pos, seen = heap[0]
            if seen == changes[pos]:
                return at, pos
            at = self.lines[pos].earliest(need, self.horizon_s)
            if at is None:
                heapq.heappop(heap)
            else:
                heapq.heapreplace(heap, (at, pos, changes[pos]))
        return None

    def take(self, pos: int, start_s: float, end_s: float, need: int) -> None:
        """A waiting job holds `need` GPUs of the server at `pos` from `start_s` to `end_s`."""
        line = self.lines[pos]
        line.add(start_s, -need)
        line.add(end_s, need)
        self.changes[pos] += 1
