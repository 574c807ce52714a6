"""Candidate filters: which servers may take a job's GPUs, and how many (Kubernetes' filter plugins).

Two kinds. The resource fit (`gpus_fitting`: free GPUs, then cores and memory at the per-GPU
demand) applies to every placement; the scores' fill loop (`scores.fill`) runs it inline, since it
is the allocators' hot path, and its tests hold the two equal. A `ServerFilter` is a constraint of
one job on whole servers (a GPU type, a reservation, a failure domain): it answers `allows(server)`
and is passed to `RoundState.find(..., filters=...)`, which hides the servers it refuses from every
stage (`restrict`). A new constraint of that kind is a new class here, not a flag on the state.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol

from scheduler_app.core.placement.plan import EPS
from scheduler_app.core.placement.stages import View
from scheduler_app.core.types import ServerView


def gpus_fitting(free_gpus: int, free_cpus: float, free_mem_gb: float, c: float, m: float) -> int:
    """How many GPUs a server with this much free can take at per-GPU demand (c cores, m GB)."""
    k = free_gpus
    if c > 0:
        k = min(k, int((free_cpus + EPS) / c))
    if m > 0:
        k = min(k, int((free_mem_gb + EPS) / m))
    return max(k, 0)


class ServerFilter(Protocol):
    """A job's constraint on servers: `allows(server)` False hides the server from its placement."""

    name: str

    def allows(self, server: ServerView) -> bool: ...


@dataclass(frozen=True, slots=True)
class OnServers:
    """Only the given servers (by id): a reservation's servers, or a user's pinned nodes."""

    server_ids: frozenset[int]
    name: str = "on_servers"

    def allows(self, server: ServerView) -> bool:
        return server.server_id in self.server_ids


@dataclass(frozen=True, slots=True)
class MinServerGpus:
    """Only servers with at least `gpus` GPUs in all (a job that wants a big node's interconnect)."""

    gpus: int
    name: str = "min_server_gpus"

    def allows(self, server: ServerView) -> bool:
        return server.num_gpus >= self.gpus


def allowed_servers(servers: Sequence[ServerView], filters: Iterable[ServerFilter]) -> list[bool]:
    """Per server position: does every filter allow it."""
    filters = tuple(filters)
    return [all(f.allows(s) for f in filters) for s in servers]


def restrict(view: View, allowed: Sequence[bool]) -> View:
    """The view with the refused servers holding no usable GPU (so no score can choose them)."""
    counts = [n if ok else 0 for n, ok in zip(view.counts, allowed, strict=True)]
    buckets: list[list[int]] = [[] for _ in view.buckets]
    for i, n in enumerate(counts):
        buckets[n].append(i)
    return View(buckets, counts, view.cpus, view.mem_gb, view.prefer)
