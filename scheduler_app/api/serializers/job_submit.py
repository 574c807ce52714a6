"""Serializer of the users' job submissions: a submission into a JobRequest, and a common one checked
by hand (job_request_plain)."""

from __future__ import annotations

from typing import Any

from django.db import connection
from rest_framework import serializers

from profiles_app.models import Workload
from scheduler_app.api.fields import (
    StrictBooleanField,
    StrictCharField,
    StrictFloatField,
    StrictIntegerField,
    StrictSlugRelatedField,
)
from scheduler_app.batch_script import DirectiveError, parse_directives
from scheduler_app.models import Team
from scheduler_app.services.job_requests import (
    MAX_COMMAND_CHARS,
    MAX_DEPENDENCIES,
    MAX_DURATION_S,
    MAX_JOB_ID,
    MAX_PATH_CHARS,
    MAX_QOS_RATE_ITERS_PER_S,
    MAX_SCRIPT_CHARS,
    MAX_TOTAL_ITERS,
    MIN_CHECKPOINT_EVERY_S,
    MIN_CPUS_PER_GPU,
    MIN_MEM_GB_PER_GPU,
    MIN_QOS_LATENCY_S,
    MIN_QOS_RATE_ITERS_PER_S,
    SCRIPT_JOB_NAME,
    JobRequest,
)


class JobSubmitSerializer(serializers.Serializer):
    name = StrictCharField(max_length=200)
    workload = StrictSlugRelatedField(
        slug_field="name",
        queryset=Workload.objects.all(),
        required=False,
        allow_null=True,
        help_text="A catalog workload's name; or give `command`",
    )
    command = StrictCharField(
        required=False,
        allow_blank=True,
        default="",
        max_length=MAX_COMMAND_CHARS,
        help_text="Own command, run by sh -c; or give `script`",
    )
    script = StrictCharField(
        required=False,
        allow_blank=True,
        default="",
        trim_whitespace=False,
        max_length=MAX_SCRIPT_CHARS,
        help_text="Own batch script, run by bash. Its #ATTUNE and #SBATCH directives fill the fields "
        "this request does not give (the request's own fields win, as sbatch's options do).",
    )
    nodes = StrictIntegerField(
        required=False,
        allow_null=True,
        min_value=1,
        max_value=1024,
        source="num_nodes",
        help_text="Exactly this many servers, GPUs split evenly (--nodes); an own command without it "
        "runs on one server",
    )
    chdir = StrictCharField(
        required=False,
        allow_blank=True,
        default="",
        max_length=MAX_PATH_CHARS,
        source="work_dir",
        help_text="Working directory on the node (absolute); default: submit_dir, else the account's home",
    )
    script_name = StrictCharField(
        required=False,
        allow_blank=True,
        default="",
        max_length=200,
        write_only=True,
        help_text="The script's file name: the job's name when neither `name` nor --job-name gives one",
    )
    submit_dir = StrictCharField(
        required=False,
        allow_blank=True,
        default="",
        max_length=MAX_PATH_CHARS,
        help_text="Where the submitting command line ran (sbatch's default working directory)",
    )
    output = StrictCharField(
        required=False,
        allow_blank=True,
        default="",
        max_length=MAX_PATH_CHARS,
        source="output_path",
        help_text="stdout file, relative to the working directory: %j job id, %A array id, %a task "
        "index, %x name, %u user, %n node rank, %N node name (default attune-%j.out; on several "
        "servers attune-%j.%n.out)",
    )
    error = StrictCharField(
        required=False,
        allow_blank=True,
        default="",
        max_length=MAX_PATH_CHARS,
        source="error_path",
        help_text="stderr file (same patterns); default: with stdout",
    )
    team = StrictSlugRelatedField(
        slug_field="name", queryset=Team.objects.all(), required=False, allow_null=True
    )
    num_gpus = StrictIntegerField(min_value=1, max_value=32767, required=False, default=1)
    total_iters = StrictIntegerField(
        min_value=1,
        max_value=MAX_TOTAL_ITERS,
        required=False,
        allow_null=True,
        help_text="Work in iterations; required for a catalog workload. An own command without it is "
        "as long as its time limit",
    )
    cpus_per_gpu = StrictFloatField(
        min_value=MIN_CPUS_PER_GPU,
        required=False,
        allow_null=True,
        help_text="At most what the largest server offers per GPU",
    )
    mem_gb_per_gpu = StrictFloatField(
        min_value=MIN_MEM_GB_PER_GPU,
        required=False,
        allow_null=True,
        help_text="At most what the largest server offers per GPU",
    )
    qos_deadline_at = serializers.DateTimeField(
        required=False, allow_null=True, help_text="At most 5 years ahead"
    )
    qos_max_latency_s = StrictFloatField(
        required=False,
        allow_null=True,
        min_value=MIN_QOS_LATENCY_S,
        max_value=MAX_DURATION_S,
        help_text="From 1 second to 365 days",
    )
    qos_min_rate_iters_per_s = StrictFloatField(
        required=False,
        allow_null=True,
        min_value=MIN_QOS_RATE_ITERS_PER_S,
        max_value=MAX_QOS_RATE_ITERS_PER_S,
        # The service's words (services/job_requests.py), whichever of the two says it first.
        error_messages={
            "min_value": "The minimum rate must be a positive number of iterations per second.",
            "max_value": f"The minimum rate must be at most {MAX_QOS_RATE_ITERS_PER_S:.0e} iterations/s.",
        },
        help_text="Minimum processing rate while running, iterations/s (GENIE); above 0. A job has at "
        "most one QoS target: a deadline, a maximum latency or a minimum rate",
    )
    priority = StrictIntegerField(required=False, default=0, min_value=-100, max_value=100)
    time_limit_s = StrictIntegerField(
        required=False, allow_null=True, min_value=1, max_value=MAX_DURATION_S, help_text="At most 365 days"
    )
    checkpoint_every_s = StrictFloatField(
        required=False,
        allow_null=True,
        min_value=MIN_CHECKPOINT_EVERY_S,
        max_value=MAX_DURATION_S,
        error_messages={
            "min_value": f"The checkpoint interval is at least {MIN_CHECKPOINT_EVERY_S:g} second.",
            "max_value": f"The checkpoint interval is at most {MAX_DURATION_S // 86400} days.",
        },
        help_text="How often the job checkpoints, seconds (> 0): a move or preemption loses the work "
        "since its last checkpoint. Null: a catalog workload's profile; an own command, none (a restart "
        "redoes its whole lease)",
    )
    depends_on = serializers.ListField(
        child=StrictIntegerField(min_value=1, max_value=MAX_JOB_ID),
        required=False,
        default=list,
        max_length=MAX_DEPENDENCIES,
        help_text="Ids of jobs that must complete before this one starts (Slurm's afterok)",
    )
    hold = StrictBooleanField(
        required=False, default=False, help_text="Submit held (sbatch --hold): it waits for a release"
    )
    array = StrictCharField(
        required=False,
        allow_blank=True,
        default="",
        max_length=1000,
        help_text="Submit one job per task index (Slurm's --array): 0-9, 1,3,5-7 or 0-15:4; "
        "%N after them runs at most N tasks at once (0-99%4)",
    )

    def to_internal_value(self, data: Any) -> dict[str, Any]:
        # A script's directives fill what the request leaves out; the request's own fields win. A
        # script named by neither is named after its file, as sbatch does.
        script = data.get("script") if hasattr(data, "get") else None
        if isinstance(script, str) and script.strip():
            try:
                directives = parse_directives(script)
            except DirectiveError as exc:
                raise serializers.ValidationError({"script": [str(exc)]}) from exc
            given = data.dict() if hasattr(data, "dict") else dict(data)
            data = {**directives, **given}
            # Absent or "": named by its file. null stays null and is refused, as the schema says.
            if data.get("name", "") == "":
                # A blank file name names nothing (the schema lets script_name be blank).
                data["name"] = str(given.get("script_name") or "").strip() or SCRIPT_JOB_NAME
        return super().to_internal_value(data)

    def validate_priority(self, value: int) -> int:
        request = self.context.get("request")
        if value > 0 and not (request and request.user.is_staff):
            raise serializers.ValidationError("Only staff may raise a job's priority.")
        return value

    def to_request(self) -> JobRequest:
        data = {k: v for k, v in self.validated_data.items() if k != "script_name"}
        return JobRequest(**{**data, "depends_on": tuple(data["depends_on"])})


# The fields a common submission (a catalog job: `sbatch` in a sweep's loop) gives, checked by hand
# (job_request_plain) as the serializer checks them: its fields cost more CPU to build for each request
# than the rest of the check.
PLAIN_FIELDS = frozenset({"name", "workload", "num_gpus", "total_iters", "priority", "hold"})
MAX_NAME_CHARS = 200
MAX_NUM_GPUS = 32767


def _whole(value: Any, least: int, most: int) -> bool:
    return type(value) is int and least <= value <= most


def job_request_plain(data: Any) -> JobRequest | None:
    """A JSON submission of a catalog job with only PLAIN_FIELDS, each well-formed, as the JobRequest
    JobSubmitSerializer(data=data).to_request() gives; None for anything else (another field, a form,
    a value the serializer might refuse or read otherwise, an unknown workload, a priority above 0
    that only staff may give): the serializer then checks it and says what is wrong. The same request
    either way (tests/api/test_submission_plain.py)."""
    if type(data) is not dict or not data.keys() <= PLAIN_FIELDS:
        return None
    name, workload = data.get("name"), data.get("workload")
    # What CharField would refuse or change besides trimming (NUL, surrogates, line breaks) goes to it.
    if type(name) is not str or len(name) > MAX_NAME_CHARS or not name.isprintable() or not name.strip():
        return None
    if type(workload) is not str or not workload or not workload.isprintable():
        return None
    num_gpus, total_iters = data.get("num_gpus", 1), data.get("total_iters")
    priority, hold = data.get("priority", 0), data.get("hold", False)
    if not _whole(num_gpus, 1, MAX_NUM_GPUS) or not _whole(priority, -100, 0) or type(hold) is not bool:
        return None
    if total_iters is not None and not _whole(total_iters, 1, MAX_TOTAL_ITERS):
        return None
    # The row the serializer's StrictSlugRelatedField reads (name is unique), written out: cheaper to
    # build than the ORM's query.
    fields = [f.attname for f in Workload._meta.concrete_fields]
    quote = connection.ops.quote_name
    columns = ", ".join(quote(f.column) for f in Workload._meta.concrete_fields)
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT {columns} FROM {quote(Workload._meta.db_table)} WHERE name = %s", [workload])
        row = cursor.fetchone()
    if row is None:
        return None
    found = Workload.from_db(connection.alias, fields, row)
    return JobRequest(
        name=name.strip(),
        workload=found,
        num_gpus=num_gpus,
        total_iters=total_iters,
        priority=priority,
        hold=hold,
    )
