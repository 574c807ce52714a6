"""Node and agent settings: the only place that reads the ATTUNE_* node settings."""

from dataclasses import dataclass

from django.conf import settings

from cluster_app.agent_wake import AGENT_WAIT_MAX_S


@dataclass(frozen=True)
class NodeConf:
    """How often agents sync, how long they long-poll in between, and when a silent server is
    NOT_RESPONDING, then DOWN (seconds)."""

    sync_interval_s: float
    wake: bool
    wait_timeout_s: float
    not_responding_after_s: int
    down_after_s: int
    usage_raw_retention_days: int
    lease_fence_s: float
    lease_fence_grace_s: float
    lease_fence_margin_s: float

    @property
    def fence_expiry_s(self) -> float:
        """How long after a node's last sync (or a lease's end) the lease's process is surely gone: its
        agent renewed it at most then, its fence stops it `lease_fence_s` later and kills it
        `lease_fence_grace_s` after that; the margin covers a sync's time in flight and commit lag."""
        return self.lease_fence_s + self.lease_fence_grace_s + self.lease_fence_margin_s


def node_conf() -> NodeConf:
    # Read on every call (cheap) so that tests can override settings.
    return NodeConf(
        sync_interval_s=settings.ATTUNE_AGENT_SYNC_INTERVAL_S,
        wake=settings.ATTUNE_AGENT_WAKE,
        # What the wait endpoint holds at most: a longer setting would have every wait refused.
        wait_timeout_s=min(float(settings.ATTUNE_AGENT_WAIT_TIMEOUT_S), AGENT_WAIT_MAX_S),
        not_responding_after_s=settings.ATTUNE_NODE_NOT_RESPONDING_AFTER_S,
        down_after_s=settings.ATTUNE_NODE_DOWN_AFTER_S,
        usage_raw_retention_days=settings.ATTUNE_USAGE_RAW_RETENTION_DAYS,
        lease_fence_s=float(settings.ATTUNE_LEASE_FENCE_S),
        lease_fence_grace_s=float(settings.ATTUNE_LEASE_FENCE_GRACE_S),
        lease_fence_margin_s=float(settings.ATTUNE_LEASE_FENCE_MARGIN_S),
    )
