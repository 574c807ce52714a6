"""Node counts (`JobView.num_nodes`, Slurm's --nodes): a job on exactly N servers, num_gpus / N GPUs each.

The jobs given to `RoundState(snapshot, jobs)` (or `require_nodes`, before `claim_current`) that ask
for N servers are placed by `find*` with `owner=job_id` only on exactly N distinct servers with
num_gpus / N GPUs each: the score's order over the servers that fit num_gpus / N GPUs at the demand
(packed: fewest usable GPUs first, ties lowest position; first fit: position order), through the
same stages as every placement (stages.py), and nothing when fewer than N servers fit. A current
placement of another shape is not a home (it claims nothing). Allocators that choose servers
themselves (opt's balanced choice, room-making) ask `node_shape` / `node_servers`;
`feasibility.infeasible_reason` answers the shapes no cluster state could ever hold.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import chain, filterfalse, islice

from scheduler_app.core import reasons
from scheduler_app.core.placement.claims import Claims, has_shape
from scheduler_app.core.placement.plan import EPS, Plan
from scheduler_app.core.placement.scores import Score
from scheduler_app.core.placement.stages import ANYWHERE, View
from scheduler_app.core.types import JobView


class NodeCounts(Claims):
    """The node-count half of RoundState: shapes per job, and the search for N servers."""

    _failed_nodes: dict[tuple[float, float, int], int]

    def require_nodes(self, jobs: Sequence[JobView]) -> None:
        """Learn the node counts (`num_nodes`) of `jobs`: from now on `find*` with `owner=job_id`
        places such a job only on exactly that many servers, with num_gpus / num_nodes GPUs each.

        Call before `claim_current`, so that a current placement of another shape claims nothing.
        An uneven split is recorded as it is and never found a place (infeasible_reason says why).
        """
        # One comprehension (every round passes every job here, and almost none has a node count).
        for job in [job for job in jobs if job.num_nodes is not None]:
            nodes = job.num_nodes
            assert nodes is not None
            shape = self._nodes[job.job_id] = (nodes, job.num_gpus // nodes if nodes > 0 else 0)
            home = self._home.get(job.job_id)
            if home is not None and not has_shape(home, shape):
                # Registered too late to be skipped: a home it may not run on is no home.
                self.release(job.job_id)
                del self._home[job.job_id], self._home_plan[job.job_id]

    def share_nodes(self, other: NodeCounts) -> None:
        """Take the node counts another state of the same jobs learnt (`require_nodes`), before any
        claim: a fresh state for a second plan of the same round."""
        assert not self._home, "share_nodes comes before claim_current"
        self._nodes = dict(other._nodes)

    def node_shape(self, owner: int | None) -> tuple[int, int] | None:
        """(servers, GPUs on each) that `owner` must be placed on, or None: any split will do."""
        if not self._nodes or owner is None:
            return None
        return self._nodes.get(owner)

    def node_servers(self, owner: int, counts: Sequence[int]) -> Plan | None:
        """For a job with a node count N: N servers with at least num_gpus / N usable GPUs each
        (`counts`: free or unclaimed GPUs per server), fewest first (ties: lowest position), each
        with num_gpus / N; None if fewer servers have them or the job has no node count. Used where
        an allocator picks servers to make room on, before placing the job there."""
        shape = self.node_shape(owner)
        if shape is None:
            return None
        nodes, per_node = shape
        if per_node < 1:
            return None
        # The state's own counts are bucketed already (bucket n: the servers with n, lowest first),
        # so the fewest-first order is the buckets' from per_node up, read only as far as needed.
        buckets = None
        if counts is self.num_free:
            buckets = self._buckets
        elif self._claimed is not None and counts is self.num_unclaimed:
            buckets = self._ubuckets
        if buckets is not None:
            first = list(islice(chain.from_iterable(buckets[per_node:]), nodes))
            return sorted((i, per_node) for i in first) if len(first) == nodes else None
        fitting = sorted((n, i) for i, n in enumerate(counts) if n >= per_node)
        if len(fitting) < nodes:
            return None
        return sorted((i, per_node) for _, i in fitting[:nodes])

    def node_pending_reason(self, job: JobView) -> str | None:
        """Why a job with a node count N found no place: `insufficient_gpus` when fewer than N servers
        have num_gpus / N free GPUs, else `fragmented` (cores or memory were missing there); None for
        a job without a node count (the caller's own reason stands)."""
        shape = self.node_shape(job.job_id)
        if shape is None:
            return None
        nodes, per_node = shape
        if self._servers_with_free(max(per_node, 1)) < nodes:
            return reasons.INSUFFICIENT_GPUS
        return reasons.FRAGMENTED

    def _servers_with_free(self, k: int) -> int:
        """How many servers have at least k free GPUs now (bucket b: servers with b free)."""
        return sum(map(len, self._buckets[k:]))

    def _find_nodes(
        self,
        score: Score,
        num_gpus: int,
        dc: Sequence[float],
        dm: Sequence[float],
        owner: int,
        allowed: Sequence[bool] | None,
    ) -> Plan | None:
        """`find` for an owner with a node count N: N servers with num_gpus / N GPUs each at the
        demand, through the same stages. ANYWHERE fails exactly when fewer than N servers fit, so
        claims decide only where the job goes here too."""
        nodes, per_node = self._nodes[owner]
        if per_node < 1 or nodes * per_node != num_gpus:
            return None  # an uneven split (infeasible) or a GPU count other than the job's
        if self._servers_with_free(per_node) < nodes:
            return None  # too few servers with k free GPUs: no stage below can succeed

        def phase(view: View, num_gpus: int, dc: Sequence[float], dm: Sequence[float]) -> Plan | None:
            unfit = None if allowed is not None else self._unfit_servers(view, per_node, dc, dm)
            return nodes_stage(score, view, nodes, per_node, dc, dm, unfit)

        if self._claimed is None and allowed is None:
            return phase(self.view(ANYWHERE), num_gpus, dc, dm)
        return self.walk(owner, num_gpus, dc, dm, (phase,), allowed)

    def _unfit_servers(self, view: View, per_node: int, dc: Sequence[float], dm: Sequence[float]) -> set[int]:
        """The servers known not to hold `per_node` GPUs at (dc, dm) in `view` (a stage's lists), for
        `nodes_stage` to skip and add to.

        Exact: within a round a server's usable GPUs, cores and memory only shrink in every view,
        except where `_grown` records that they grew (a share given back, a claim or reservation
        dropped); those servers are taken out of every set before it is read. Kept per view lists
        and demand vectors (held here, so their ids stay theirs), forgotten when claims replace the
        lists. A deep queue asks the same few demands again and again of servers long full.
        """
        key = (id(view.counts), id(view.cpus), id(view.mem_gb), id(dc), id(dm), per_node)
        memo = self._unfit.get(key)
        grown = self._grown
        if memo is None:
            unfit: set[int] = set()
            self._unfit[key] = (view.counts, view.cpus, view.mem_gb, dc, dm, unfit, len(grown))
            return unfit
        unfit, seen = memo[5], memo[6]
        assert isinstance(unfit, set) and isinstance(seen, int)
        if seen < len(grown):
            unfit.difference_update(grown[seen:])
            self._unfit[key] = (*memo[:6], len(grown))
        return unfit

    def _find_uniform_nodes(
        self, score: Score | str, num_gpus: int, c: float, m: float, owner: int
    ) -> Plan | None:
        """`find_uniform` for an owner with a node count (N, k): it fails exactly when fewer than N
        servers hold k GPUs at (c, m) (`_find_nodes`' last stage), which stays true for more servers
        while resources are only taken, so that is remembered per (c, m, k) as the plain failures are."""
        nodes, per_node = self._nodes[owner]
        key = (c, m, per_node)
        failed_at = self._failed_nodes.get(key)
        if failed_at is not None and nodes >= failed_at:
            return None
        plan = None
        if self.totals_allow(num_gpus, c, m):
            plan = self.find(score, num_gpus, self.uniform(c), self.uniform(m), owner)
        if plan is None and nodes * per_node == num_gpus and (failed_at is None or nodes < failed_at):
            self._failed_nodes[key] = nodes
        return plan


def nodes_stage(
    score: Score,
    view: View,
    nodes: int,
    per_node: int,
    dc: Sequence[float],
    dm: Sequence[float],
    unfit: set[int] | None = None,
) -> Plan | None:
    """The first `nodes` servers, in the score's order, each with `per_node` usable GPUs and their
    cores/memory at the demand. With `view.prefer` (ANYWHERE while claims stand), the servers where
    the fewest claimed GPUs must be taken come first (score order within ties): a claimant that
    loses one GPU has to move whole. `unfit`: servers known not to fit (skipped); those found not
    to fit are added (RoundState's `_unfit_servers`)."""
    counts, free_cpus, free_mem, prefer = view.counts, view.cpus, view.mem_gb, view.prefer
    chosen: list[int] = []
    order = score.order(view, per_node)
    if unfit is None:
        for i in order:
            if (
                counts[i] >= per_node
                and free_cpus[i] + EPS >= per_node * dc[i]
                and free_mem[i] + EPS >= per_node * dm[i]
            ):
                chosen.append(i)
                if prefer is None and len(chosen) == nodes:
                    break
    else:
        # The same scan, skipping (at C speed) the servers known not to fit and noting new ones.
        for i in filterfalse(unfit.__contains__, order) if unfit else order:
            if (
                counts[i] >= per_node
                and free_cpus[i] + EPS >= per_node * dc[i]
                and free_mem[i] + EPS >= per_node * dm[i]
            ):
                chosen.append(i)
                if prefer is None and len(chosen) == nodes:
                    break
            else:
                unfit.add(i)
    if len(chosen) < nodes:
        return None
    if prefer is not None:
        chosen.sort(key=lambda i: max(0, per_node - prefer[i]))  # stable
    return [(i, per_node) for i in chosen[:nodes]]
