"""One agent call per interval (docs/agent-protocol.md section 2): usage, lease reports and the leases
it runs come in; the commands that bring the node to the scheduler's decision and the acks go out."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any
from uuid import UUID

from django.db import OperationalError

from cluster_app.agent_wake import agent_wake_after_round, wake_generation
from cluster_app.models import Server
from cluster_app.services import UsageReport
from scheduler_app.models import AgentReportKind
from scheduler_app.selectors import agent_commands
from scheduler_app.services.agents import ReportsOutcome, agent_heartbeat, agent_reports_ingest
from scheduler_app.services.report_apply import LeaseReport

logger = logging.getLogger(__name__)

# How long a sync's reports may wait for job rows that a scheduling round holds before they are left
# for later; a round on a large cluster holds them for a second or more, and every web thread that
# waits is one fewer for the other agents. Progress alone barely waits: it is cumulative, and the
# next sync carries it again. Starts and exits wait a little, and if that is not enough the round's
# commit wakes the agent (agent_wake_after_round), so they go in moments after it.
REPORTS_LOCK_WAIT_MS = 100
PROGRESS_LOCK_WAIT_MS = 5
LOCK_NOT_AVAILABLE = "55P03"  # PostgreSQL's SQLSTATE for lock_timeout / NOWAIT


@dataclass(frozen=True)
class SyncRequest:
    """What an agent sends each interval (reports already validated one by one)."""

    usage: UsageReport
    running: list[UUID] = field(default_factory=list)
    reports: list[LeaseReport] = field(default_factory=list)


@dataclass
class SyncOutcome:
    """The server as stored, its commands, the reports' fate and the wake generation read first."""

    server: Server
    commands: list[dict[str, Any]]
    reports: ReportsOutcome
    generation: int


def agent_sync(*, server: Server, request: SyncRequest) -> SyncOutcome:
    """Mark the server alive with its usage, apply its reports (each once), and compute its commands.

    Three transactions, in this order: the heartbeat first, so that a server whose reports cannot be
    applied still counts as alive; then the reports, whose exits and progress the commands must see;
    the commands last, read after both. A batch of reports that fails to apply (a bug, a deadlock
    after retries) is logged and left unacknowledged, so the agent keeps it in its spool and sends it
    again, while its commands still go out: a poisoned report must not cut a node off the scheduler.
    The wake generation is read before the commands: a change committed after that read wakes the
    agent again, so none is missed.
    """
    generation = wake_generation(server.pk)
    server = agent_heartbeat(server=server, usage=request.usage)
    outcome = ReportsOutcome()
    if request.reports:
        urgent = any(r.kind != AgentReportKind.PROGRESS for r in request.reports)
        try:
            outcome = agent_reports_ingest(
                server=server,
                reports=request.reports,
                lock_wait_ms=REPORTS_LOCK_WAIT_MS if urgent else PROGRESS_LOCK_WAIT_MS,
            )
        except OperationalError as exc:
            if getattr(exc.__cause__, "pgcode", None) != LOCK_NOT_AVAILABLE:
                raise
            # A round holds the jobs' rows: the reports wait for a later sync rather than this one
            # waiting for the round (at a thousand agents, every sync would queue behind every round).
            if urgent:
                agent_wake_after_round(server.pk)
            logger.info(
                "server %s: %d reports deferred (a round holds their jobs)%s",
                server.name,
                len(request.reports),
                "; its agent is woken after the round" if urgent else "",
            )
        except Exception:
            logger.exception(
                "server %s: %d reports could not be applied; left for the agent to resend",
                server.name,
                len(request.reports),
            )
    commands = agent_commands(server=server, running=request.running)
    return SyncOutcome(server=server, commands=commands, reports=outcome, generation=generation)
