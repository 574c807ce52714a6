"""Agent endpoints (docs/agent-protocol.md): register and sync; Bearer-token auth. The image serves
well-formed calls through config/agent_calls.py, which answers with this module's `register_answer`
and `sync_answer` without Django's middleware and DRF; these views answer everything else (and every
call under a plain WSGI server), and document the routes in the OpenAPI schema."""

from typing import Any

from drf_spectacular.utils import extend_schema
from rest_framework import status
from rest_framework.exceptions import ValidationError
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.serializers import as_serializer_error
from rest_framework.views import APIView

from cluster_app.agent_call_counter import count_agent_call
from cluster_app.agent_wake import AGENT_WAIT_PATH, wait_ticket
from cluster_app.authentication import AgentTokenAuthentication, IsAgent
from cluster_app.conf import NodeConf, node_conf
from cluster_app.models import Server
from cluster_app.services import GpuConflictError, ServerNotRegisteredError
from infra.prepared_sql import prepared_statements
from scheduler_app.api.agent_checks import reports_check_fast, sync_body_check
from scheduler_app.api.parsers import AGENT_MAX_BODY_BYTES, BoundedJSONParser
from scheduler_app.api.serializers.agents import (
    AgentHeartbeatSerializer,
    AgentNotRegisteredSerializer,
    AgentRegisterResponseSerializer,
    AgentRegisterSerializer,
    AgentReportSerializer,
    AgentSyncResponseSerializer,
    AgentSyncSerializer,
    GpuConflictSerializer,
)
from scheduler_app.services.agent_sync import SyncRequest, agent_sync
from scheduler_app.services.agents import agent_register
from scheduler_app.services.report_apply import LeaseReport

# One instance of each checks every sync and report, in every thread: run_validation keeps no state
# on the serializer (DRF's ListSerializer checks all its items with one child the same way), while a
# new serializer per call deep-copies its fields, the nested sample's and its GPUs' each time: a third
# of a sync's CPU in the view before these.
SYNC_CHECKER = AgentSyncSerializer()
REPORT_CHECKER = AgentReportSerializer()


class AgentView(APIView):
    """Base: only a node agent's Bearer token gets in; request.auth is its Server."""

    authentication_classes = [AgentTokenAuthentication]
    permission_classes = [IsAgent]
    parser_classes = [BoundedJSONParser]  # the protocol is JSON; forms have no nulls, lists or objects
    max_body_bytes = AGENT_MAX_BODY_BYTES  # a batch of reports is larger than any user's request

    def dispatch(self, request, *args, **kwargs):
        # From authentication to the answer: an agent's statements repeat every sync (prepared_sql.py).
        with prepared_statements():
            return super().dispatch(request, *args, **kwargs)


class AgentRegisterView(AgentView):
    @extend_schema(
        tags=["agent"],
        request=AgentRegisterSerializer,
        responses={200: AgentRegisterResponseSerializer, 409: GpuConflictSerializer},
        summary="Register the agent's server and replace its inventory",
    )
    def post(self, request: Request) -> Response:
        count_agent_call("register")
        serializer = AgentRegisterSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        status_code, answer = register_answer(server=request.auth, serializer=serializer)
        return Response(answer, status=status_code)


class AgentSyncView(AgentView):
    @extend_schema(
        tags=["agent"],
        request=AgentSyncSerializer,
        responses={200: AgentSyncResponseSerializer, 409: AgentNotRegisteredSerializer},
        summary="One sync: usage, reports and running leases in; commands and acks out",
    )
    def post(self, request: Request) -> Response:
        count_agent_call("sync")
        # A malformed sync is refused whole (400, as is_valid(raise_exception=True) answers). A
        # well-formed one is checked by hand (agent_checks.py), with the serializer's result.
        body = sync_body_check(request.data, SYNC_CHECKER)
        if body is None:
            try:
                body = SYNC_CHECKER.run_validation(request.data)
            except ValidationError as exc:  # as field errors, even for a body that is not an object
                raise ValidationError(as_serializer_error(exc)) from None
        status_code, answer = sync_answer(server=request.auth, body=body)
        return Response(answer, status=status_code)


def register_answer(*, server: Server, serializer: AgentRegisterSerializer) -> tuple[int, dict[str, Any]]:
    """The status and body answering a registration whose `serializer` is valid (this view's answer,
    and config/agent_calls.py's)."""
    try:
        server = agent_register(server=server, inventory=serializer.to_inventory())
    except GpuConflictError as exc:
        return status.HTTP_409_CONFLICT, {"detail": str(exc), "conflicting_uuids": exc.uuids}
    conf = node_conf()
    return status.HTTP_200_OK, {
        "server": server.name,
        "sync_interval_s": conf.sync_interval_s,
        "fence": _fence(conf),
    }


def sync_answer(*, server: Server, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    """The status and body answering a sync whose `body` is checked (`sync_body_check`'s or the
    serializer's result): its reports checked one by one, the service called (this view's answer, and
    config/agent_calls.py's)."""
    # A malformed report is rejected alone, not the batch.
    checked, rejected = reports_check_fast(body["reports"], checker=REPORT_CHECKER)
    valid = [LeaseReport(**report) for report in checked]
    usage = AgentHeartbeatSerializer.usage_of(body["sample"])
    sync = SyncRequest(usage=usage, running=body["running"], sizes=body["sizes"], reports=valid)
    try:
        outcome = agent_sync(server=server, request=sync)
    except ServerNotRegisteredError as exc:  # nothing stored: the agent registers, then syncs
        return status.HTTP_409_CONFLICT, {"detail": str(exc), "code": "not_registered"}
    conf = node_conf()
    wait = None
    if conf.wake:
        wait = {
            "url": AGENT_WAIT_PATH,
            "ticket": wait_ticket(outcome.server.pk),
            "generation": outcome.generation,
            "timeout_s": conf.wait_timeout_s,
        }
    return status.HTTP_200_OK, {
        "state": outcome.server.state,
        "commands": outcome.commands,
        "acked": [list(pair) for pair in outcome.reports.acked],
        "rejected": rejected + outcome.reports.rejected,
        "sync_interval_s": conf.sync_interval_s,
        "wait": wait,
        "fence": _fence(conf),
    }


def _fence(conf: NodeConf) -> dict[str, float]:
    """What the agent enforces on its leases; the service counts on it (docs/faults.md, "Fencing")."""
    return {"lease_fence_s": conf.lease_fence_s, "grace_s": conf.lease_fence_grace_s}
