"""Node and agent settings: the only place that reads the ATTUNE_* node settings."""

from dataclasses import dataclass

from django.conf import settings


@dataclass(frozen=True)
class NodeConf:
    """How often agents call in, and when a silent server is NOT_RESPONDING, then DOWN (seconds)."""

    heartbeat_interval_s: int
    poll_interval_s: int
    not_responding_after_s: int
    down_after_s: int
    usage_raw_retention_days: int


def node_conf() -> NodeConf:
    # Read on every call (cheap) so that tests can override settings.
    return NodeConf(
        heartbeat_interval_s=settings.ATTUNE_HEARTBEAT_INTERVAL_S,
        poll_interval_s=settings.ATTUNE_POLL_INTERVAL_S,
        not_responding_after_s=settings.ATTUNE_NODE_NOT_RESPONDING_AFTER_S,
        down_after_s=settings.ATTUNE_NODE_DOWN_AFTER_S,
        usage_raw_retention_days=settings.ATTUNE_USAGE_RAW_RETENTION_DAYS,
    )
