"""System checks of the node settings: the fence must expire before a silent node's jobs are requeued."""

from __future__ import annotations

from typing import Any

from django.core.checks import Error, register

from cluster_app.conf import node_conf


@register()
def fence_before_node_down(app_configs: Any = None, **kwargs: Any) -> list[Error]:
    """ATTUNE_NODE_DOWN_AFTER_S below the fence's expiry would requeue (and start elsewhere) jobs whose
    processes may still run on the silent node: the one thing fencing exists to prevent. The sweep
    waits for the expiry anyway (scheduler_app/services/nodes.py), so this is a warning about a
    setting that cannot do what it says, made an error so that no deployment starts with it."""
    conf = node_conf()
    errors = []
    if conf.lease_fence_s <= 0 or conf.lease_fence_grace_s < 0 or conf.lease_fence_margin_s < 0:
        errors.append(
            Error(
                "ATTUNE_LEASE_FENCE_S must be positive, ATTUNE_LEASE_FENCE_GRACE_S and "
                "ATTUNE_LEASE_FENCE_MARGIN_S not negative",
                id="attune.E001",
            )
        )
    if conf.down_after_s < conf.fence_expiry_s:
        errors.append(
            Error(
                f"ATTUNE_NODE_DOWN_AFTER_S ({conf.down_after_s} s) is shorter than the fence's expiry "
                f"({conf.fence_expiry_s:g} s = ATTUNE_LEASE_FENCE_S + ATTUNE_LEASE_FENCE_GRACE_S + "
                "ATTUNE_LEASE_FENCE_MARGIN_S): a silent node's jobs could be started elsewhere while "
                "they still run there",
                hint="raise ATTUNE_NODE_DOWN_AFTER_S or lower the fence settings (docs/faults.md, Fencing)",
                id="attune.E002",
            )
        )
    if conf.lease_fence_s <= conf.not_responding_after_s:
        errors.append(
            Error(
                f"ATTUNE_LEASE_FENCE_S ({conf.lease_fence_s:g} s) must exceed "
                f"ATTUNE_NODE_NOT_RESPONDING_AFTER_S ({conf.not_responding_after_s} s): a node merely slow "
                "to answer would stop its jobs",
                id="attune.E003",
            )
        )
    return errors
