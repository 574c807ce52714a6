"""Serializers of the accounting report: its query parameters (validated strictly) and its body."""

from __future__ import annotations

from typing import Any

from django.utils import timezone
from rest_framework import ISO_8601, serializers

from scheduler_app.selectors import (
    ACCOUNTING_BY,
    ACCOUNTING_WINDOWS,
    DEFAULT_ACCOUNTING_WINDOW,
    MAX_ACCOUNTING_SPAN,
    accounting_window,
)

ACCOUNTING_FORMATS = ("json", "csv")


class AccountingQuerySerializer(serializers.Serializer):
    """`window`, or `start` (and `end`, default now); `by`; `format`. Resolves to start, end and by."""

    window = serializers.ChoiceField(
        choices=list(ACCOUNTING_WINDOWS),
        required=False,
        help_text=f"The last hour, 6 h, day, week, 30 days or 365 days, up to now (default "
        f"{DEFAULT_ACCOUNTING_WINDOW}); not with start/end",
    )
    start = serializers.DateTimeField(
        required=False,
        input_formats=[ISO_8601],
        help_text="Window start, ISO 8601 (no offset: UTC); instead of window",
    )
    end = serializers.DateTimeField(
        required=False,
        input_formats=[ISO_8601],
        help_text="Window end, ISO 8601 (default now): after start, at most "
        f"{MAX_ACCOUNTING_SPAN.days} days after it; needs start",
    )
    by = serializers.ChoiceField(
        choices=list(ACCOUNTING_BY), required=False, default="user", help_text="One row per user or per team"
    )
    format = serializers.ChoiceField(
        choices=list(ACCOUNTING_FORMATS),
        required=False,
        help_text="csv: one row per name, one column per end state (or send Accept: text/csv)",
    )

    def to_internal_value(self, data: Any) -> dict[str, Any]:
        # DRF reads an empty query value of an optional field as absent (an HTML form's empty input);
        # the schema says "?window=" is not a window.
        blank = [name for name in self.fields if name in data and data.get(name) == ""]
        if blank:
            raise serializers.ValidationError({name: ["Give a value, or leave it out."] for name in blank})
        return super().to_internal_value(data)

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        window, start, end = attrs.get("window"), attrs.get("start"), attrs.get("end")
        if window is not None and (start is not None or end is not None):
            raise serializers.ValidationError({"window": ["Give a window, or start (and end), not both."]})
        if start is None and end is not None:
            raise serializers.ValidationError({"start": ["Give start with end."]})
        now = timezone.now()
        if start is None:
            start, end = accounting_window(window or DEFAULT_ACCOUNTING_WINDOW, now=now)
        end = end if end is not None else now
        if end <= start:
            raise serializers.ValidationError({"end": ["Give an end after start."]})
        if end - start > MAX_ACCOUNTING_SPAN:
            raise serializers.ValidationError(
                {"start": [f"Give a window of at most {MAX_ACCOUNTING_SPAN.days} days."]}
            )
        return {"start": start, "end": end, "by": attrs["by"]}


class AccountingJobsSerializer(serializers.Serializer):
    """Jobs that ended in the window, by end state (every state present, zero when none).

    The states are spelled out so that the schema names them; a test keeps them equal to END_STATES.
    """

    COMPLETED = serializers.IntegerField(min_value=0)
    FAILED = serializers.IntegerField(min_value=0)
    CANCELLED = serializers.IntegerField(min_value=0)
    TIMEOUT = serializers.IntegerField(min_value=0)
    OUT_OF_MEMORY = serializers.IntegerField(min_value=0)


class AccountingRowSerializer(serializers.Serializer):
    name = serializers.CharField(help_text='Username, or team name ("(no team)" for jobs without one)')
    gpu_hours = serializers.FloatField(min_value=0, help_text="GPU-hours allocated in the window")
    cpu_core_hours = serializers.FloatField(min_value=0, help_text="CPU core-hours allocated")
    mem_gb_hours = serializers.FloatField(min_value=0, help_text="Memory GB-hours allocated")
    jobs = AccountingJobsSerializer()
    jobs_total = serializers.IntegerField(min_value=0, help_text="Jobs that ended in the window")
    mean_wait_s = serializers.FloatField(
        allow_null=True, help_text="Mean start minus submission of the jobs started in the window"
    )
    p95_wait_s = serializers.FloatField(allow_null=True, help_text="Its 95th percentile (interpolated)")


class RestartLossDaySerializer(serializers.Serializer):
    day = serializers.DateField(help_text="A day in the service's time zone")
    gpu_hours = serializers.FloatField(
        min_value=0,
        help_text="GPU-hours lost to restarts that day: the work that leases ended by a restart had to do "
        "again (on the day they ended), and restarts' start-ups (on the day they started)",
    )


class AccountingReportSerializer(serializers.Serializer):
    start = serializers.DateTimeField()
    end = serializers.DateTimeField()
    by = serializers.ChoiceField(choices=list(ACCOUNTING_BY))
    rows = AccountingRowSerializer(many=True, help_text="Largest gpu_hours first")
    restart_loss_by_day = RestartLossDaySerializer(
        many=True,
        help_text="GPU-hours lost to restarts on each day of the window that lost any, oldest first, of the "
        "jobs the rows count (staff: the cluster's)",
    )
