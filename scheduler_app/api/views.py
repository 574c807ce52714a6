"""User endpoints: jobs (submit, list, detail, cancel), the cluster overview, server drain/resume."""

import dataclasses
import json
from functools import cache
from typing import Any

from axes.handlers.proxy import AxesProxyHandler
from django.core.exceptions import ValidationError as DjangoValidationError
from django.db.models import Prefetch
from django.http import QueryDict
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema, extend_schema_view
from rest_framework import mixins, status, viewsets
from rest_framework.authentication import TokenAuthentication
from rest_framework.authtoken.models import Token
from rest_framework.authtoken.serializers import AuthTokenSerializer
from rest_framework.authtoken.views import ObtainAuthToken
from rest_framework.decorators import action
from rest_framework.exceptions import PermissionDenied, ValidationError
from rest_framework.parsers import FormParser, MultiPartParser
from rest_framework.permissions import IsAdminUser
from rest_framework.renderers import JSONRenderer
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.settings import api_settings
from rest_framework.views import APIView

from cluster_app.models import Server
from cluster_app.services import ServerStateError
from infra.prepared_sql import prepared_statements
from scheduler_app.api.filters import JobFilter
from scheduler_app.api.parsers import BoundedJSONParser
from scheduler_app.api.serializers.cluster import (
    ClusterOverviewSerializer,
    ServerDrainSerializer,
    ServerStateSerializer,
)
from scheduler_app.api.serializers.fields_once import serializer_render
from scheduler_app.api.serializers.job_submit import JobSubmitSerializer, job_request_plain
from scheduler_app.api.serializers.job_update import JobUpdateSerializer
from scheduler_app.api.serializers.jobs import JobDetailSerializer, JobSerializer, JobSubmittedSerializer
from scheduler_app.api.token_auth import LeanTokenAuthentication
from scheduler_app.models import Allocation, Job
from scheduler_app.models.idempotency import MAX_IDEMPOTENCY_KEY_CHARS
from scheduler_app.selectors import (
    cluster_overview,
    job_detail_queryset,
    job_list,
    job_manageable,
    job_queue,
    job_queue_of,
    job_submitted_as_stored,
    job_submitted_detail,
    jobs_with_restarts,
)
from scheduler_app.services.admission_worker import admission_answer_wait, admission_pending
from scheduler_app.services.idempotency import (
    IDEMPOTENCY_KEY_PATTERN,
    IdempotencyKeyError,
    IdempotencyKeyInvalid,
    IdempotentAnswer,
    idempotency_key_parse,
    idempotency_key_run,
    idempotency_request_digest,
)
from scheduler_app.services.job_control import JobStateError, job_cancel, job_hold, job_release, job_update
from scheduler_app.services.jobs import job_submit
from scheduler_app.services.nodes import node_drain, node_resume
from scheduler_app.web.lockout import lockout_response

# What the list's `nodes` reads of each lease: one query for the page, not the leases' logs.
LEASE_NODES = (
    Allocation.objects.select_related("server")
    .only("job_id", "round_id", "started_at", "ended_at", "server__name")
    .order_by("started_at", "id")
)
IDEMPOTENCY_KEY_HEADER = "Idempotency-Key"
IDEMPOTENCY_KEY_PARAMETER = OpenApiParameter(
    name=IDEMPOTENCY_KEY_HEADER,
    location=OpenApiParameter.HEADER,
    required=False,
    type={"type": "string", "pattern": IDEMPOTENCY_KEY_PATTERN, "maxLength": MAX_IDEMPOTENCY_KEY_CHARS},
    description="A fresh key per submission (a UUID): a retry with the same key and body within "
    "24 hours gets the first answer (the same job) instead of a second job, with `Idempotent-Replayed: "
    "true`; the same key with another body is a 422, and one sent while its first request still runs "
    "waits for it (a 409 after 10 s). Keys are per user.",
)


@extend_schema_view(
    list=extend_schema(
        summary="Every user's jobs, newest first (squeue; only yours with ATTUNE_PRIVATE_JOBS)", tags=["jobs"]
    ),
    retrieve=extend_schema(
        summary="A job with its queue position, leases, events and log tail", tags=["jobs"]
    ),
    create=extend_schema(
        summary="Submit a job",
        tags=["jobs"],
        request=JobSubmitSerializer,
        parameters=[IDEMPOTENCY_KEY_PARAMETER],
        responses={
            201: JobSubmittedSerializer,
            409: OpenApiResponse(description="A request with this Idempotency-Key is still in progress"),
            422: OpenApiResponse(description="This Idempotency-Key was used with another request body"),
        },
    ),
)
class JobViewSet(
    mixins.ListModelMixin, mixins.RetrieveModelMixin, mixins.CreateModelMixin, viewsets.GenericViewSet
):
    filterset_class = JobFilter
    queryset = Job.objects.none()  # for the schema generator; get_queryset scopes to the user
    # The settings' classes, a token read in one statement (LeanTokenAuthentication): the same answers.
    authentication_classes = [
        LeanTokenAuthentication if cls is TokenAuthentication else cls
        for cls in api_settings.DEFAULT_AUTHENTICATION_CLASSES
    ]

    def dispatch(self, request, *args, **kwargs):
        if self.action_map.get(request.method.lower()) != "create":
            return super().dispatch(request, *args, **kwargs)
        # A submission's statements are the same each time, from the token's to the answer's: prepared
        # (infra/prepared_sql.py), PostgreSQL plans them once per connection, not once per submission.
        with prepared_statements():
            return super().dispatch(request, *args, **kwargs)

    def get_queryset(self):
        if getattr(self, "swagger_fake_view", False):
            return Job.objects.none()
        if self.action == "list":
            # Each job's restarts in the list's own query (cli queue --long shows them): no query per job.
            return jobs_with_restarts(job_list(user=self.request.user)).prefetch_related(
                "depends_on", Prefetch("allocations", queryset=LEASE_NODES)
            )
        return job_detail_queryset(user=self.request.user).prefetch_related("depends_on")

    def get_serializer_class(self):
        if self.action == "create":
            return JobSubmitSerializer
        return JobSerializer if self.action == "list" else JobDetailSerializer

    def get_serializer_context(self):
        context = super().get_serializer_context()
        # Computed at most once per request, and only if a pending job is rendered.
        context["queue"] = cache(job_queue)
        return context

    def create(self, request: Request, *args, **kwargs) -> Response:
        value = request.headers.get(IDEMPOTENCY_KEY_HEADER)
        if value is None:
            return _response(self._submit(request))
        try:
            answer = idempotency_key_run(
                owner=request.user,
                key=idempotency_key_parse(value=value),
                request_digest=idempotency_request_digest(data=_plain(request.data)),
                execute=lambda: _as_json_data(self._submit(request)),
            )
        except IdempotencyKeyInvalid as exc:
            raise ValidationError({IDEMPOTENCY_KEY_HEADER: [str(exc)]}) from exc
        except IdempotencyKeyError as exc:
            return Response({"detail": str(exc)}, status=exc.status_code)
        return _response(answer)

    def _submit(self, request: Request) -> IdempotentAnswer:
        job_request = job_request_plain(request.data)
        if job_request is None:
            serializer = JobSubmitSerializer(data=request.data, context=self.get_serializer_context())
            serializer.is_valid(raise_exception=True)
            job_request = serializer.to_request()
        try:
            jobs = job_submit(owner=request.user, request=job_request)
        except DjangoValidationError as exc:
            raise ValidationError(
                exc.message_dict if hasattr(exc, "error_dict") else {"detail": exc.messages}
            ) from exc
        # A quick admission forecast makes the answer; a deep queue's follows on the job page (one
        # answered in the request, e.g. behind the forecast's window, has nothing to wait for).
        pending = admission_pending(jobs[0])
        waited = pending and admission_answer_wait(job_ids=[jobs[0].pk])
        dependencies = bool(job_request.depends_on)
        # Left to the worker and not waited for: nothing can have stored its estimate since its commit
        # (admission_answer_wait), so it is answered as stored too, not read again.
        job = job_submitted_as_stored(
            job=jobs[0], dependencies=dependencies, no_estimate_since=pending and not waited
        ) or job_submitted_detail(user=request.user, job_id=jobs[0].pk, dependencies=dependencies)
        context = self.get_serializer_context()
        # Its own place in the queue only, from its row as read: not a read of every pending job's.
        context["queue"] = cache(lambda: job_queue_of(job))
        context["array_job_ids"] = [j.pk for j in jobs] if job.array_job_id is not None else None
        body = serializer_render(JobSubmittedSerializer, job, context)
        return IdempotentAnswer(status_code=status.HTTP_201_CREATED, body=body, job_id=job.pk)

    @extend_schema(
        request=None,
        tags=["jobs"],
        summary="Cancel a pending or running job",
        responses={200: JobDetailSerializer, 409: OpenApiResponse(description="Already finished")},
    )
    @action(detail=True, methods=["post"])
    def cancel(self, request: Request, pk=None) -> Response:
        return self._change(lambda job: job_cancel(job=job, by=request.user))

    @extend_schema(
        request=None,
        tags=["jobs"],
        summary="Hold a pending job out of the queue until released (scontrol hold)",
        responses={200: JobDetailSerializer, 409: OpenApiResponse(description="Not pending")},
    )
    @action(detail=True, methods=["post"])
    def hold(self, request: Request, pk=None) -> Response:
        return self._change(lambda job: job_hold(job=job, by=request.user))

    @extend_schema(
        request=None,
        tags=["jobs"],
        summary="Release a held job back into the queue (scontrol release)",
        responses={
            200: JobDetailSerializer,
            403: OpenApiResponse(description="Held by an administrator"),
            409: OpenApiResponse(description="Not held"),
        },
    )
    @action(detail=True, methods=["post"])
    def release(self, request: Request, pk=None) -> Response:
        return self._change(lambda job: job_release(job=job, by=request.user))

    @extend_schema(
        request=JobUpdateSerializer,
        tags=["jobs"],
        summary="Change a job's time limit, or its array's limit on tasks at once (scontrol update)",
        responses={
            200: JobDetailSerializer,
            403: OpenApiResponse(description="Not yours, or a raise of the time limit by its owner"),
            409: OpenApiResponse(description="Already ended"),
        },
    )
    def partial_update(self, request: Request, pk=None) -> Response:
        update = JobUpdateSerializer(data=request.data)
        update.is_valid(raise_exception=True)
        try:
            return self._change(lambda job: job_update(job=job, by=request.user, **update.validated_data))
        except DjangoValidationError as exc:
            raise ValidationError(exc.message_dict) from exc

    def _change(self, change) -> Response:
        """Apply a job service to the requested job; its state errors are 409s. Every user sees every
        job, but only its owner and staff act on it (403)."""
        job = self.get_object()
        if not job_manageable(user=self.request.user).filter(pk=job.pk).exists():
            raise PermissionDenied("Only the job's owner or staff may change it.")
        try:
            change(job)
        except JobStateError as exc:
            return Response({"detail": str(exc)}, status=status.HTTP_409_CONFLICT)
        job = self.get_queryset().get(pk=job.pk)
        return Response(JobDetailSerializer(job, context=self.get_serializer_context()).data)


def _response(answer: IdempotentAnswer) -> Response:
    """A submission's answer; a replay of a key's first one says so (Stripe's Idempotent-Replayed)."""
    headers = {"Idempotent-Replayed": "true"} if answer.replayed else None
    return Response(answer.body, status=answer.status_code, headers=headers)


def _as_json_data(answer: IdempotentAnswer) -> IdempotentAnswer:
    """The answer's body as JSON data, exactly as rendered (DRF's encoder: dates, decimals...): what
    its key stores and a replay returns. An answer without a key is rendered once, by its Response."""
    return dataclasses.replace(answer, body=json.loads(JSONRenderer().render(answer.body)))


def _plain(data: Any) -> Any:
    """A request body as JSON data (a form's QueryDict as lists), for the idempotency digest."""
    return {key: data.getlist(key) for key in data} if isinstance(data, QueryDict) else data


class TokenView(ObtainAuthToken):
    """A user's API token for a username and password (JSON; a form works too). No credential needed."""

    authentication_classes: list = []
    parser_classes = [BoundedJSONParser, FormParser, MultiPartParser]

    @extend_schema(
        responses={
            200: AuthTokenSerializer,
            429: OpenApiResponse(
                description="Too many failed logins for this username from this address: retry after the "
                "Retry-After header's seconds (ATTUNE_LOGIN_FAILURE_LIMIT, ATTUNE_LOGIN_COOLOFF_S)"
            ),
        },
        tags=["auth"],
        summary="Get your API token: POST your username and password",
    )
    def post(self, request: Request, *args, **kwargs) -> Response:
        serializer = self.get_serializer(data=request.data)
        try:
            serializer.is_valid(raise_exception=True)
        except ValidationError:
            # django-axes refused the password check and flagged this (DRF's) request: its middleware
            # only sees Django's request, so the lockout answer is given here.
            if getattr(request, "axes_locked_out", False):
                return lockout_response(request._request)
            raise
        user = serializer.validated_data["user"]
        # No session login here, so no user_logged_in signal: tell axes, which clears the failures.
        AxesProxyHandler.user_logged_in(sender=type(self), request=request._request, user=user)
        token, _ = Token.objects.get_or_create(user=user)
        return Response({"token": token.key})


class ClusterView(APIView):
    @extend_schema(
        responses=ClusterOverviewSerializer,
        tags=["cluster"],
        summary="Servers, their state, capacity and what is in use",
    )
    def get(self, request: Request) -> Response:
        return Response(ClusterOverviewSerializer(cluster_overview()).data)


class ServerViewSet(viewsets.GenericViewSet):
    """Staff only: take a server out of service (drain) and put it back (resume)."""

    permission_classes = [IsAdminUser]
    queryset = Server.objects.all()
    lookup_field = "name"
    lookup_value_regex = r"[^/]+"
    serializer_class = ServerStateSerializer

    @extend_schema(
        request=ServerDrainSerializer,
        responses={200: ServerStateSerializer, 409: OpenApiResponse()},
        tags=["cluster"],
        summary="Drain: running jobs finish, nothing new is placed",
    )
    @action(detail=True, methods=["post"])
    def drain(self, request: Request, name=None) -> Response:
        body = ServerDrainSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        return self._change(node_drain, server=self.get_object(), reason=body.validated_data["reason"])

    @extend_schema(
        request=None,
        responses={200: ServerStateSerializer, 409: OpenApiResponse()},
        tags=["cluster"],
        summary="Resume a draining or drained server",
    )
    @action(detail=True, methods=["post"])
    def resume(self, request: Request, name=None) -> Response:
        return self._change(node_resume, server=self.get_object())

    def _change(self, service, **kwargs) -> Response:
        try:
            server = service(**kwargs)
        except ServerStateError as exc:
            return Response({"detail": str(exc)}, status=status.HTTP_409_CONFLICT)
        return Response(ServerStateSerializer(server).data)
