"""Agent endpoints (docs/agent-protocol.md): register, heartbeat, poll, reports; Bearer-token auth."""

from drf_spectacular.utils import extend_schema
from rest_framework import status
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from cluster_app.authentication import AgentTokenAuthentication, IsAgent
from cluster_app.conf import node_conf
from cluster_app.services import GpuConflictError
from scheduler_app.api.parsers import AGENT_MAX_BODY_BYTES, BoundedJSONParser
from scheduler_app.api.serializers.agents import (
    AgentHeartbeatResponseSerializer,
    AgentHeartbeatSerializer,
    AgentPollResponseSerializer,
    AgentPollSerializer,
    AgentRegisterResponseSerializer,
    AgentRegisterSerializer,
    AgentReportSerializer,
    AgentReportsResponseSerializer,
    AgentReportsSerializer,
    GpuConflictSerializer,
)
from scheduler_app.selectors import agent_commands
from scheduler_app.services.agents import agent_heartbeat, agent_register, agent_reports_ingest


class AgentView(APIView):
    """Base: only a node agent's Bearer token gets in; request.auth is its Server."""

    authentication_classes = [AgentTokenAuthentication]
    permission_classes = [IsAgent]
    parser_classes = [BoundedJSONParser]  # the protocol is JSON; forms have no nulls, lists or objects
    max_body_bytes = AGENT_MAX_BODY_BYTES  # a batch of reports is larger than any user's request


class AgentRegisterView(AgentView):
    @extend_schema(
        tags=["agent"],
        request=AgentRegisterSerializer,
        responses={200: AgentRegisterResponseSerializer, 409: GpuConflictSerializer},
        summary="Register the agent's server and replace its inventory",
    )
    def post(self, request: Request) -> Response:
        serializer = AgentRegisterSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        try:
            server = agent_register(server=request.auth, inventory=serializer.to_inventory())
        except GpuConflictError as exc:
            return Response(
                {"detail": str(exc), "conflicting_uuids": exc.uuids}, status=status.HTTP_409_CONFLICT
            )
        conf = node_conf()
        return Response(
            {
                "server": server.name,
                "heartbeat_interval_s": conf.heartbeat_interval_s,
                "poll_interval_s": conf.poll_interval_s,
            }
        )


class AgentHeartbeatView(AgentView):
    @extend_schema(
        tags=["agent"],
        request=AgentHeartbeatSerializer,
        responses=AgentHeartbeatResponseSerializer,
        summary="Liveness and usage sample",
    )
    def post(self, request: Request) -> Response:
        serializer = AgentHeartbeatSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        server = agent_heartbeat(server=request.auth, usage=serializer.to_usage())
        return Response({"state": server.state})


class AgentPollView(AgentView):
    @extend_schema(
        tags=["agent"],
        request=AgentPollSerializer,
        responses=AgentPollResponseSerializer,
        summary="Commands that bring the node to the scheduler's decision",
    )
    def post(self, request: Request) -> Response:
        serializer = AgentPollSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        return Response(
            {"commands": agent_commands(server=request.auth, running=serializer.validated_data["running"])}
        )


class AgentReportsView(AgentView):
    @extend_schema(
        tags=["agent"],
        request=AgentReportsSerializer,
        responses=AgentReportsResponseSerializer,
        summary="Lease reports (idempotent by lease_id + seq)",
    )
    def post(self, request: Request) -> Response:
        batch = AgentReportsSerializer(data=request.data)
        batch.is_valid(raise_exception=True)
        valid, rejected = [], []
        for item in batch.validated_data["reports"]:
            one = AgentReportSerializer(data=item)
            if one.is_valid():
                valid.append(one.to_report())
            else:
                seq = item.get("seq")
                rejected.append(
                    {
                        "lease_id": str(item.get("lease_id")) if item.get("lease_id") else None,
                        "seq": seq if isinstance(seq, int) else None,
                        "error": _flatten(one.errors),
                        "code": 400,
                    }
                )
        outcome = agent_reports_ingest(server=request.auth, reports=valid)
        return Response(
            {"acked": [list(pair) for pair in outcome.acked], "rejected": rejected + outcome.rejected}
        )


def _flatten(errors) -> str:
    parts = []
    for field, messages in errors.items():
        if isinstance(messages, dict):
            messages = [f"{k}: {v}" for k, v in messages.items()]
        parts.append(f"{field}: {' '.join(str(m) for m in messages)}")
    return "; ".join(parts)
