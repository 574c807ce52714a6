"""The Policy contract: order runnable jobs for a round; registered by name."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Hashable, Sequence
from typing import ClassVar

from scheduler_app.core.registry import Registry
from scheduler_app.core.types import ClusterSnapshot, JobView


class Policy(ABC):
    """Orders the runnable jobs of a round, most deserving first.

    Input: every runnable job (pending or running), the cluster snapshot and the current time in
    seconds on the caller's clock. Output: the same jobs, reordered. Invariants: pure (no I/O, no
    clock, no state kept between calls), deterministic, ties broken by (arrival_s, job_id).
    """

    name: ClassVar[str]
    # True when the order depends only on each job's own fixed attributes (priority, arrival, id),
    # never on progress, service, the clock or the other jobs: a forecast may then drop the jobs
    # ordered after the one it predicts, and skip rounds in which nothing changes.
    static_order: ClassVar[bool] = False
    # True when the order reads JobView.owner_usage_gpu_s, which the live service computes only then.
    reads_owner_usage: ClassVar[bool] = False
    # True when the constructor takes `aging` (policies/aging.py), the bound on a shortest-first wait
    # that the live service configures (scheduler_app/conf.py, ATTUNE_AGING_*).
    ages: ClassVar[bool] = False

    def must_not_wait(
        self, jobs: Sequence[JobView], snapshot: ClusterSnapshot, now_s: float
    ) -> frozenset[int]:
        """Ids of the jobs of `jobs` that have waited long enough (an aging rule, policies/aging.py):
        the engine starts them as soon as the unguarded plan does, stopping the running jobs that
        hold their GPUs even where restart costs would keep those in place (core/move_guard.py)."""
        return frozenset()

    def linear_regime(
        self, jobs: Sequence[JobView], snapshot: ClusterSnapshot, now_s: float
    ) -> Hashable | None:
        """A token for the groups this order puts the jobs in now, where, while no job arrives,
        finishes, starts, stops or is in its start-up (progress and attained service grow at a fixed
        rate, the clock at one second a second), every key it orders by within a group is linear in
        time and each job switches group at most once: where the tokens at two such times are equal,
        no job switched, and the order at both times is the order at every time between them (two
        linear keys cross at most once). The forecast checks a repeated plan at the end of a stretch
        of rounds instead of at each (simulator/forecast.py). None (the default): not known."""
        return None

    @abstractmethod
    def order(self, jobs: Sequence[JobView], snapshot: ClusterSnapshot, now_s: float) -> list[JobView]:
        """Return `jobs` reordered, first = served first."""


POLICIES: Registry[Policy] = Registry("policy")
register_policy = POLICIES.register
