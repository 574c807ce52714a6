"""The accounting endpoint (sacct/sreport): usage per user or team over a window, as JSON or CSV."""

from __future__ import annotations

import csv
import io
from typing import Any

from django.http import Http404
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import extend_schema
from rest_framework.exceptions import ValidationError
from rest_framework.renderers import BaseRenderer, BrowsableAPIRenderer, JSONRenderer
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from scheduler_app.api.serializers.accounting import (
    ACCOUNTING_FORMATS,
    AccountingQuerySerializer,
    AccountingReportSerializer,
)
from scheduler_app.selectors import END_STATES, accounting_report

CSV_COLUMNS = (
    "name",
    "gpu_hours",
    "cpu_core_hours",
    "mem_gb_hours",
    *END_STATES,
    "jobs_total",
    "mean_wait_s",
    "p95_wait_s",
)
# A cell starting with one of these is a formula to a spreadsheet; a leading quote keeps it text.
FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")


class AccountingCSVRenderer(BaseRenderer):
    """The report's rows as CSV: one row per name, one column per end state; empty cell for null."""

    media_type = "text/csv"
    format = "csv"
    charset = "utf-8"

    def render(
        self, data: Any, accepted_media_type: str | None = None, renderer_context: Any = None
    ) -> bytes:
        out = io.StringIO()
        writer = csv.writer(out, lineterminator="\r\n")
        writer.writerow(CSV_COLUMNS)
        for row in data["rows"]:
            name = row["name"]
            cells = {**row, **row["jobs"], "name": f"'{name}" if name.startswith(FORMULA_STARTS) else name}
            writer.writerow(["" if cells[c] is None else cells[c] for c in CSV_COLUMNS])
        return out.getvalue().encode(self.charset)


class AccountingView(APIView):
    """Users see their own row (by user) or their teams' rows (by team); staff see every row."""

    renderer_classes = [JSONRenderer, BrowsableAPIRenderer, AccountingCSVRenderer]

    @extend_schema(
        parameters=[AccountingQuerySerializer],
        responses={
            (200, "application/json"): AccountingReportSerializer,
            (200, "text/csv"): OpenApiTypes.STR,
        },
        tags=["accounting"],
        summary="Accounting (sacct/sreport): GPU-, core- and GB-hours, jobs by end state and waits, "
        "per user or team",
    )
    def get(self, request: Request) -> Response:
        query = AccountingQuerySerializer(data=request.query_params)
        query.is_valid(raise_exception=True)
        report = accounting_report(**query.validated_data, user=request.user)
        response = Response(AccountingReportSerializer(report).data)
        if isinstance(request.accepted_renderer, AccountingCSVRenderer):
            name = f"accounting-{report.by}-{report.start:%Y%m%dT%H%M}-{report.end:%Y%m%dT%H%M}.csv"
            response["Content-Disposition"] = f'attachment; filename="{name}"'
        return response

    def perform_content_negotiation(self, request: Request, force: bool = False) -> Any:
        # DRF answers an unknown ?format= with a 404; it is a bad parameter, named like the others.
        try:
            return super().perform_content_negotiation(request, force)
        except Http404:
            raise ValidationError({"format": [f"Give one of {', '.join(ACCOUNTING_FORMATS)}."]}) from None

    def handle_exception(self, exc: Exception) -> Response:
        response = super().handle_exception(exc)
        # An error is JSON, as the schema documents for every 4xx, even when CSV was asked for.
        if isinstance(getattr(self.request, "accepted_renderer", None), AccountingCSVRenderer):
            self.request.accepted_renderer = JSONRenderer()
            self.request.accepted_media_type = JSONRenderer.media_type
        return response
