"""Forms of the user pages: job submission (validated again by services.jobs) and the queue filters."""

from __future__ import annotations

import math
import re

import django_filters
from django import forms
from django.contrib.auth.models import AbstractBaseUser
from django.core.exceptions import ValidationError
from django.utils import timezone
from django.utils.dateparse import parse_datetime

from cli.durations import parse_duration_s, parse_time_limit_s
from cli.job_names import default_job_name
from profiles_app.models import Workload
from scheduler_app.api.filters import JobFilter
from scheduler_app.batch_script import DirectiveError, parse_directives
from scheduler_app.job_paths import MAX_PATH_CHARS
from scheduler_app.models import JobState, Team
from scheduler_app.services.job_requests import MAX_ARRAY_TASKS, MAX_SCRIPT_CHARS, SCRIPT_JOB_NAME, JobRequest

# The API's names for directives (batch_script) -> this form's field names, where they differ.
DIRECTIVE_FIELDS = {
    "nodes": "num_nodes",
    "time_limit_s": "time_limit",
    "checkpoint_every_s": "checkpoint_every",
    "chdir": "work_dir",
    "output": "output_path",
    "error": "error_path",
}
SCRIPT_PLACEHOLDER = """#!/bin/bash
#SBATCH --job-name=train
#SBATCH --gpus=2
#SBATCH --time=4:00:00
python train.py --resume-from "$ATTUNE_CHECKPOINT_DIR"
"""

# The command line's duration syntax (cli/durations.py, the one parser), said once for both fields.
DURATION_HELP = "E.g. 90m, 6h, 1h30m, 2d, or Slurm's 1-12:00 (D-HH:MM), HH:MM:SS, or minutes (30)."
# What the queue shows when no state is ticked: squeue's default, the jobs still in the system.
DEFAULT_QUEUE_STATES = (JobState.PENDING, JobState.RUNNING)


class JobSubmitForm(forms.Form):
    """What a user asks for. Types and shapes are checked here; the rules (GPUs on the cluster, team
    membership, one QoS target...) stay in job_submit, whose errors `add_service_errors` places next
    to their fields."""

    name = forms.CharField(
        max_length=200,
        required=False,
        label="Job name",
        help_text="Empty: the script's --job-name, else the workload's name or the command's program "
        f"({SCRIPT_JOB_NAME} for a script).",
    )
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
        help_text="Run with sh -c on the allocated server, as your Unix account; its speed is measured "
        "while it runs.",
    )
    script = forms.CharField(
        required=False,
        strip=False,
        max_length=MAX_SCRIPT_CHARS,
        label="Or a batch script",
        widget=forms.Textarea(attrs={"rows": 8, "spellcheck": "false", "placeholder": SCRIPT_PLACEHOLDER}),
        help_text="Run by bash as your Unix account. Its #SBATCH / #ATTUNE lines fill the fields "
        "left empty here (fields given here win).",
    )
    num_gpus = forms.IntegerField(
        min_value=1, max_value=32767, required=False, label="GPUs", help_text="Default 1, or the script's."
    )
    num_nodes = forms.IntegerField(
        min_value=1,
        max_value=1024,
        required=False,
        label="Servers",
        help_text="Exactly this many servers, GPUs split evenly. Your command or script then runs once "
        "per server with MASTER_ADDR, MASTER_PORT, NNODES, NODE_RANK, WORLD_SIZE (torchrun's names) "
        "and SLURM_* set. Empty: one server for your own command.",
    )
    total_iters = forms.IntegerField(
        min_value=1,
        required=False,
        label="Total iterations",
        help_text="Required for a catalog workload. Your own command may omit it: its time limit then "
        "sizes it, and the progress it writes to $ATTUNE_PROGRESS_PATH is shown.",
    )
    time_limit = forms.CharField(
        required=False,
        max_length=32,
        label="Time limit",
        help_text=f"The job is stopped after it. {DURATION_HELP}",
    )
    checkpoint_every = forms.CharField(
        required=False,
        max_length=32,
        label="Checkpoints every",
        help_text="How often your job checkpoints: a move or preemption loses the work since the last "
        "one. Empty: a catalog workload's profile; your own command, none (a restart redoes its whole "
        f"run). {DURATION_HELP}",
    )
    hold = forms.BooleanField(
        required=False,
        label="Submit held",
        help_text="It waits out of the queue until you release it from its page (sbatch --hold).",
    )
    work_dir = forms.CharField(
        required=False,
        max_length=MAX_PATH_CHARS,
        label="Working directory",
        help_text="An absolute path on the servers; empty: your home directory there.",
    )
    output_path = forms.CharField(
        required=False,
        max_length=MAX_PATH_CHARS,
        label="Output file",
        help_text="stdout, in the working directory unless absolute: %j job id, %x name, %u user, "
        "%A/%a array id and index, %n/%N node rank and name. Default attune-%j.out (on several "
        "servers attune-%j.%n.out, one per server).",
    )
    error_path = forms.CharField(
        required=False, max_length=MAX_PATH_CHARS, label="Error file", help_text="stderr; empty: with stdout."
    )
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
        "ATTUNE_ARRAY_TASK_ID (and SLURM_ARRAY_TASK_ID). Add %N to run at most N at once (0-99%4).",
    )
    qos_deadline_at = forms.DateTimeField(
        required=False,
        label="Deadline",
        widget=forms.DateTimeInput(attrs={"type": "datetime-local"}, format="%Y-%m-%dT%H:%M"),
    )
    qos_max_latency_s = forms.CharField(
        required=False,
        max_length=32,
        label="Maximum latency",
        help_text="QoS target from submission to the end (queueing and running); or give a deadline. "
        + DURATION_HELP,
    )
    qos_min_rate_iters_per_s = forms.FloatField(
        required=False,
        label="Minimum rate",
        help_text="QoS target: at least this many iterations per second while it runs (GENIE), e.g. 2.5; "
        "instead of a deadline or a maximum latency.",
    )

    def __init__(self, *args, user: AbstractBaseUser, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.user = user
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

    def clean_time_limit(self) -> int | None:
        return _time_limit_s(self.cleaned_data["time_limit"])

    def clean_checkpoint_every(self) -> float | None:
        text = self.cleaned_data["checkpoint_every"].strip()
        if not text:
            return None
        try:
            return parse_duration_s(text, option="The checkpoint interval", leave_out="leave it empty")
        except ValueError as exc:
            raise ValidationError(str(exc)) from exc

    def clean_qos_max_latency_s(self) -> float | None:
        text = self.cleaned_data["qos_max_latency_s"].strip()
        if not text:
            return None
        try:
            return parse_duration_s(text, option="The maximum latency", leave_out="leave it empty")
        except ValueError as exc:
            raise ValidationError(str(exc)) from exc

    def clean_qos_min_rate_iters_per_s(self) -> float | None:
        rate = self.cleaned_data["qos_min_rate_iters_per_s"]
        if rate is not None and not 0 < rate < math.inf:
            raise ValidationError("The minimum rate must be a positive number of iterations per second.")
        return rate

    def clean(self) -> dict:
        cleaned = super().clean()
        # The service would run the catalog workload and silently ignore the command: say so instead.
        if cleaned.get("workload") is not None and (cleaned.get("command") or "").strip():
            self.add_error("command", "Choose a catalog workload or give a command, not both.")
        script = cleaned.get("script") or ""
        if script.strip():
            try:
                directives = parse_directives(script)
            except DirectiveError as exc:
                self.add_error("script", str(exc))
                return cleaned
            self._fill_from_directives(cleaned, directives)
        if not (cleaned.get("name") or "").strip():
            # Named as the command line names it (cli/job_names.py); a pasted script has no file name
            # to be named after, so it gets the name the API gives one without.
            workload = cleaned.get("workload")
            named = default_job_name(workload.name if workload else None, cleaned.get("command") or "")
            cleaned["name"] = named or (SCRIPT_JOB_NAME if script.strip() else "")
        return cleaned

    def _fill_from_directives(self, cleaned: dict, directives: dict) -> None:
        """The script's directives fill what the form left empty (the form's own fields win, as
        sbatch's command-line options do)."""
        for key, value in directives.items():
            field = DIRECTIVE_FIELDS.get(key, key)
            # An unticked box cannot say "not given": a ticked one or the script's --hold holds it.
            current = cleaned.get(field)
            given = current is True if field == "hold" else current not in (None, "", ())
            if given:
                continue
            if field == "team":
                team = self.fields["team"].queryset.filter(name=value).first()
                if team is None:
                    self.add_error("script", f"#SBATCH/#ATTUNE --team {value}: you are in no such team.")
                value = team
            elif field == "priority" and value > 0 and not self.user.is_staff:
                self.add_error("script", "Only staff may raise a job's priority (--priority).")
                continue
            elif field == "qos_deadline_at":
                value = parse_datetime(value)
            elif field == "depends_on":
                value = tuple(value)
            cleaned[field] = value

    def to_request(self) -> JobRequest:
        d = self.cleaned_data
        return JobRequest(
            name=d["name"] or "",
            num_gpus=d["num_gpus"] or 1,
            total_iters=d["total_iters"],
            workload=d["workload"],
            command=d["command"],
            script=d["script"],
            num_nodes=d["num_nodes"],
            time_limit_s=d["time_limit"],
            checkpoint_every_s=d["checkpoint_every"],
            work_dir=d["work_dir"].strip(),
            output_path=d["output_path"].strip(),
            error_path=d["error_path"].strip(),
            hold=bool(d.get("hold")),
            priority=d.get("priority") or 0,
            team=d["team"],
            cpus_per_gpu=d["cpus_per_gpu"],
            mem_gb_per_gpu=d["mem_gb_per_gpu"],
            qos_deadline_at=d["qos_deadline_at"],
            qos_max_latency_s=d["qos_max_latency_s"],
            qos_min_rate_iters_per_s=d["qos_min_rate_iters_per_s"],
            depends_on=d["depends_on"],
            array=(d["array"] or "").strip(),
        )

    def add_service_errors(self, exc: ValidationError) -> None:
        """Put job_submit's per-field messages next to their fields (others above the form)."""
        errors = exc.message_dict if hasattr(exc, "error_dict") else {None: exc.messages}
        for field, messages in errors.items():
            target = field if field in self.fields else None
            for message in messages:
                self.add_error(target, message)


def _time_limit_s(text: str) -> int | None:
    """A time limit field's seconds (None when empty), in the command line's formats."""
    if not text.strip():
        return None
    try:
        return parse_time_limit_s(text.strip(), option="The time limit", leave_out="leave it empty")
    except ValueError as exc:
        raise ValidationError(str(exc)) from exc


class JobLimitsForm(forms.Form):
    """The job page's change of limits (scontrol update): a new time limit, an array's tasks at once."""

    time_limit = forms.CharField(required=False, max_length=32, label="Time limit")
    array_task_limit = forms.IntegerField(
        required=False, min_value=0, max_value=MAX_ARRAY_TASKS, label="Tasks at once"
    )
    # scontrol update JobId=ARRAYID: the time limit of every pending or running task of the array.
    every_task = forms.BooleanField(required=False, label="Every task of its array")

    def clean_time_limit(self) -> int | None:
        return _time_limit_s(self.cleaned_data["time_limit"])


class QueueFilter(JobFilter):
    """The API's job filters with widgets for a page: state boxes to tick, a team list."""

    state = django_filters.MultipleChoiceFilter(
        choices=JobState.choices, distinct=False, widget=forms.CheckboxSelectMultiple, label="State"
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
