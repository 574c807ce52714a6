"""What node agents tell the service: registration and usage samples; the stored reports' retention
(lease reports themselves: services/report_ingest.py)."""

from __future__ import annotations

import logging
import math
import re
from dataclasses import replace
from datetime import datetime, timedelta
from typing import Any
from uuid import UUID

from django.db import connection, transaction
from django.utils import timezone

from cluster_app.models import Server
from cluster_app.services import (
    UNRESPONSIVE_STATES,
    GpuConflictError,
    NodeInventory,
    UsageReport,
    node_heartbeat,
    node_register,
    node_registration_refused,
)
from scheduler_app.conf import scheduler_conf
from scheduler_app.models import AgentReport, Allocation
from scheduler_app.selectors import server_busy_gpu_count
from scheduler_app.selectors.agent_reports import lease_params, quoted_table
from scheduler_app.services.round_requests import scheduling_round_request_on_commit

logger = logging.getLogger(__name__)

# How far an agent's clock may be off the service's: a report dated later than the service's clock plus
# this is dated back to it (docs/agent-protocol.md section 4), a usage sample dated further off either
# way is dated to the nearer bound (section 2).
AGENT_CLOCK_SKEW = timedelta(seconds=60)
AGENT_REPORT_MAX_SEQ = 2**63 - 1


# NUL (PostgreSQL text and jsonb cannot hold it) and lone surrogates (JSON's \ud800 escapes: not UTF-8).
_NOT_STORABLE = re.compile("[\x00\ud800-\udfff]")


def clean_text(value: Any) -> Any:
    """`value` with every string in it (dict keys too, at any depth) storable by PostgreSQL: NUL and
    lone surrogates (what JSON can carry that is not UTF-8) become U+FFFD."""
    if isinstance(value, str):
        if value.isascii() and "\x00" not in value:
            return value
        return _NOT_STORABLE.sub("\ufffd", value)
    if isinstance(value, dict):
        return {clean_text(str(k)): clean_text(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [clean_text(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None  # jsonb holds no NaN or infinity
    return value


def allocations_start_sent(*, lease_ids: list[str], now: datetime | None = None) -> None:
    """Record that a sync answer carries these leases' `start` (the first time only): one hand-written
    statement (the ORM's update cost 0.4 ms of CPU, every start delivered), and none for the syncs that
    start nothing, which are most of them."""
    marks, params = lease_params(UUID(str(lease)) for lease in lease_ids)
    if not params:
        return
    field = Allocation._meta.get_field("start_sent_at")
    sent_at = field.get_db_prep_value(now or timezone.now(), connection)
    sql = (
        f"UPDATE {quoted_table(Allocation)} SET start_sent_at = %s"
        f" WHERE lease_id IN ({marks}) AND start_sent_at IS NULL"
    )
    with connection.cursor() as cursor:
        cursor.execute(sql, [sent_at, *params])


def agent_register(*, server: Server, inventory: NodeInventory) -> Server:
    """Replace the server's inventory (cluster_app) with what its agent found; marks it alive, and
    from then on the server may take work.

    Capacity may have appeared (a new or returning server), so an early round is requested. A refused
    registration (GpuConflictError, re-raised) changes nothing but the reason a never-registered
    server shows: it stays out of service.
    """
    try:
        with transaction.atomic():
            busy_gpus = server_busy_gpu_count(server_id=server.pk)
            server = node_register(server=server, inventory=inventory, busy_gpus=busy_gpus)
            scheduling_round_request_on_commit(trigger="register")
    except GpuConflictError as exc:
        node_registration_refused(server=server, reason=str(exc))
        raise
    return server


def usage_within_skew(*, server: Server, usage: UsageReport, now: datetime) -> UsageReport:
    """`usage` dated within the service's clock +- AGENT_CLOCK_SKEW, as a report's `at` is bounded.

    An agent takes its sample just before each sync, so a date further off is a wrong clock, not an
    old reading. Clamped rather than refused: a node with a wrong clock must stay alive and keep its
    jobs. Stored as it came, a sample dated year 1000 or 9999 would sit outside every dashboard's range
    and have the roll-up work through centuries of minutes."""
    at = min(max(usage.sampled_at, now - AGENT_CLOCK_SKEW), now + AGENT_CLOCK_SKEW)
    if at == usage.sampled_at:
        return usage
    logger.warning(
        "server %s: sample dated %s by its agent's clock, stored at %s", server.name, usage.sampled_at, at
    )
    return replace(usage, sampled_at=at)


def agent_heartbeat(*, server: Server, usage: UsageReport) -> Server:
    """Mark the server alive and store its usage sample (stored once per `sampled_at`, which is kept
    within the service's clock +- AGENT_CLOCK_SKEW).

    A live server's heartbeat runs in no transaction of ours: on PostgreSQL it is one statement
    (`node_heartbeat`), committed by itself. A server coming back asks for an early round.
    """
    usage = usage_within_skew(server=server, usage=usage, now=timezone.now())
    if server.state not in UNRESPONSIVE_STATES:
        return node_heartbeat(server=server, usage=usage)
    with transaction.atomic():
        busy_gpus = server_busy_gpu_count(server_id=server.pk)
        server = node_heartbeat(server=server, usage=usage, busy_gpus=busy_gpus)
        if server.state not in UNRESPONSIVE_STATES:
            scheduling_round_request_on_commit(trigger="node_back")
    return server


@transaction.atomic
def agent_reports_prune(*, now: datetime | None = None) -> int:
    """Delete stored reports of leases that ended longer ago than the retention period.

    They only serve idempotency, and an agent stops retrying a lease's reports long before.
    """
    now = now or timezone.now()
    before = now - timedelta(days=scheduler_conf().agent_report_retention_days)
    deleted, _ = AgentReport.objects.filter(allocation__ended_at__lt=before).delete()
    return deleted
