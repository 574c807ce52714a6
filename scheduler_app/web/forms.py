"""Forms of the user pages: job submission (validated again by services.jobs) and the queue filters."""

from __future__ import annotations

import re

import django_filters
from django import forms
from django.contrib.auth.models import AbstractBaseUser
from django.core.exceptions import ValidationError
from django.utils import timezone

from profiles_app.models import Workload
from scheduler_app.api.filters import JobFilter
from scheduler_app.models import JobState, Team
from scheduler_app.services.jobs import JobRequest

# What the queue shows when no state is ticked: squeue's default, the jobs still in the system.
DEFAULT_QUEUE_STATES = (JobState.PENDING, JobState.RUNNING)


class JobSubmitForm(forms.Form):
    """What a user asks for. Types and shapes are checked here; the rules (GPUs on the cluster, team
    membership, one QoS target...) stay in job_submit, whose errors `add_service_errors` places next
    to their fields."""

    name = forms.CharField(max_length=200, label="Job name")
    workload = forms.ModelChoiceField(
        queryset=Workload.objects.order_by("name"),
        to_field_name="name",
        required=False,
        label="Catalog workload",
        empty_label="(none: run my own command)",
        help_text="A profiled model from the catalog; or leave empty and give a command.",
    )
    command = forms.CharField(
        required=False,
        label="Own command",
        widget=forms.Textarea(attrs={"rows": 2, "spellcheck": "false"}),
        help_text="Run with sh -c on the allocated server; its speed is measured while it runs.",
    )
    num_gpus = forms.IntegerField(min_value=1, max_value=32767, initial=1, label="GPUs")
    total_iters = forms.IntegerField(min_value=1, label="Total iterations")
    cpus_per_gpu = forms.FloatField(
        required=False,
        label="CPU cores per GPU",
        help_text="Optional override; empty lets the scheduler choose what speeds the job up.",
    )
    mem_gb_per_gpu = forms.FloatField(
        required=False,
        label="Memory per GPU (GB)",
        help_text="Optional override; empty lets the scheduler choose.",
    )
    team = forms.ModelChoiceField(
        queryset=Team.objects.none(), to_field_name="name", required=False, label="Team", empty_label="(none)"
    )
    depends_on = forms.CharField(
        required=False,
        max_length=1000,
        label="After jobs",
        help_text="Optional job ids (e.g. 12, 13): this job starts once they have all completed.",
    )
    array = forms.CharField(
        required=False,
        max_length=1000,
        label="Array",
        help_text="Optional task indices (e.g. 0-9 or 1,3,5-7): one job each, whose process sees "
        "ATTUNE_ARRAY_TASK_ID (and SLURM_ARRAY_TASK_ID).",
    )
    qos_deadline_at = forms.DateTimeField(
        required=False,
        label="Deadline",
        widget=forms.DateTimeInput(attrs={"type": "datetime-local"}, format="%Y-%m-%dT%H:%M"),
    )
    qos_max_latency_s = forms.FloatField(
        required=False,
        label="Maximum latency (s)",
        help_text="QoS target from submission to the end (queueing and running); or give a deadline.",
    )

    def __init__(self, *args, user: AbstractBaseUser, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        # Only the teams the user belongs to: job_submit refuses any other.
        self.fields["team"].queryset = Team.objects.filter(members=user).order_by("name")
        tz_name = timezone.get_current_timezone_name()
        self.fields["qos_deadline_at"].help_text = f"QoS target: finish by this time ({tz_name})."

    def clean_depends_on(self) -> tuple[int, ...]:
        # Commas, spaces or Slurm's colons (afterok:12:13) between the ids.
        tokens = re.split(r"[\s,:]+", self.cleaned_data["depends_on"].strip().removeprefix("afterok:"))
        ids = []
        for token in filter(None, tokens):
            if not token.isdigit() or int(token) < 1:
                raise ValidationError(f"“{token}” is not a job id: give job numbers, e.g. 12, 13.")
            ids.append(int(token))
        return tuple(ids)

    def clean(self) -> dict:
        cleaned = super().clean()
        # The service would run the catalog workload and silently ignore the command: say so instead.
        if cleaned.get("workload") is not None and (cleaned.get("command") or "").strip():
            self.add_error("command", "Choose a catalog workload or give a command, not both.")
        return cleaned

    def to_request(self) -> JobRequest:
        d = self.cleaned_data
        return JobRequest(
            name=d["name"],
            num_gpus=d["num_gpus"],
            total_iters=d["total_iters"],
            workload=d["workload"],
            command=d["command"],
            team=d["team"],
            cpus_per_gpu=d["cpus_per_gpu"],
            mem_gb_per_gpu=d["mem_gb_per_gpu"],
            qos_deadline_at=d["qos_deadline_at"],
            qos_max_latency_s=d["qos_max_latency_s"],
            depends_on=d["depends_on"],
            array=d["array"].strip(),
        )

    def add_service_errors(self, exc: ValidationError) -> None:
        """Put job_submit's per-field messages next to their fields (others above the form)."""
        errors = exc.message_dict if hasattr(exc, "error_dict") else {None: exc.messages}
        for field, messages in errors.items():
            target = field if field in self.fields else None
            for message in messages:
                self.add_error(target, message)


class QueueFilter(JobFilter):
    """The API's job filters with widgets for a page: state boxes to tick, a team list."""

    state = django_filters.MultipleChoiceFilter(
        choices=JobState.choices, widget=forms.CheckboxSelectMultiple, label="State"
    )
    team = django_filters.ModelChoiceFilter(
        field_name="team",
        to_field_name="name",
        queryset=Team.objects.order_by("name"),
        label="Team",
        empty_label="(any)",
    )
    owner = django_filters.CharFilter(field_name="owner__username", label="User")

    class Meta(JobFilter.Meta):
        fields = ["state", "team", "owner"]
