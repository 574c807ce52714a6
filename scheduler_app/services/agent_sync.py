"""One agent call per interval (docs/agent-protocol.md section 2): usage, lease reports and the leases
it runs come in; the commands that bring the node to the scheduler's decision and the acks go out."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any
from uuid import UUID

from cluster_app.agent_wake import syncing_server, wake_generation
from cluster_app.models import Server
from cluster_app.services import UsageReport
from scheduler_app.models import AgentReportKind
from scheduler_app.selectors import agent_commands
from scheduler_app.services.agents import agent_heartbeat, allocations_start_sent
from scheduler_app.services.report_apply import LeaseReport
from scheduler_app.services.report_ingest import URGENT_KINDS, ReportsOutcome, agent_reports_ingest

logger = logging.getLogger(__name__)

# How long a sync waits for job rows that a scheduling round holds before it leaves its reports to the
# applier (stored and acknowledged either way): a round on a large cluster holds them for a second or
# more, and every web thread that waits is one fewer for the other agents. Progress and logs barely wait
# (when it is applied within the sync at all: ATTUNE_PROGRESS_APPLY_S=0); starts and exits wait a
# little, so that this sync's commands see them, and the applier runs as soon as the round ends.
REPORTS_LOCK_WAIT_MS = 100
PROGRESS_LOCK_WAIT_MS = 5
WAITING_KINDS = URGENT_KINDS | {AgentReportKind.STARTED}  # the kinds that wait REPORTS_LOCK_WAIT_MS


@dataclass(frozen=True)
class SyncRequest:
    """What an agent sends each interval (reports already validated one by one)."""

    usage: UsageReport
    running: list[UUID] = field(default_factory=list)
    # lease id -> (cores, memory GB) the agent applies now (agents with the `resize` feature)
    sizes: dict[UUID, tuple[int, float]] = field(default_factory=dict)
    reports: list[LeaseReport] = field(default_factory=list)


@dataclass
class SyncOutcome:
    """The server as stored, its commands, the reports' fate and the wake generation read before the
    commands."""

    server: Server
    commands: list[dict[str, Any]]
    reports: ReportsOutcome
    generation: int


def agent_sync(*, server: Server, request: SyncRequest) -> SyncOutcome:
    """Mark the server alive with its usage, store its reports (each once) and apply what must be, and
    compute its commands.

    In this order: the heartbeat first, so that a server whose reports cannot be applied still counts
    as alive; then the reports, whose exits the commands must see; the commands last, read after both.
    Reports are acknowledged once stored: applying them cannot lose them (services/report_ingest.py),
    and a report that fails to apply (a bug) is logged and retried by the applier while this node's
    commands still go out: a poisoned report must not cut a node off the scheduler.
    The wake generation is read after the reports' transaction and before the commands: a change
    committed after that read wakes the agent again, so none is missed; and what this sync's own
    reports changed (an exit ends its job's leases, which wakes their agents) does not wake this agent
    a second time for commands it gets in this answer: neither its next wait (the generation is read
    after that commit; read before, as until 2026-11-27, every job end cost its agent one more sync)
    nor the wait it holds during this sync (its server is left out of the wake: `syncing_server`;
    until 2026-11-29 that wait answered at once, one more sync per job end again).
    """
    server = agent_heartbeat(server=server, usage=request.usage)
    outcome = ReportsOutcome()
    if request.reports:
        urgent = any(r.kind in WAITING_KINDS for r in request.reports)
        try:
            # What the reports change on this server (an exit ends its lease) does not wake this agent:
            # the commands below answer it (cluster_app/agent_wake.py, `syncing_server`).
            with syncing_server(server.pk):
                outcome = agent_reports_ingest(
                    server=server,
                    reports=request.reports,
                    lock_wait_ms=REPORTS_LOCK_WAIT_MS if urgent else PROGRESS_LOCK_WAIT_MS,
                )
        except Exception:  # not even stored: unacknowledged, the agent sends them again
            logger.exception(
                "server %s: %d reports could not be stored; left for the agent to resend",
                server.name,
                len(request.reports),
            )
    generation = wake_generation(server.pk)
    commands = agent_commands(server=server, running=request.running, sizes=request.sizes)
    # Before the answer leaves: from now on the agent may run these leases, and a later lease of their
    # jobs must wait for their exit or their fence (selectors/lease_starts.py).
    allocations_start_sent(lease_ids=[c["lease_id"] for c in commands if c.get("kind") == "start"])
    return SyncOutcome(server=server, commands=commands, reports=outcome, generation=generation)
