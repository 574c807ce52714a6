"""Serializers of the users' job endpoints: a submission into a JobRequest, a job with its leases."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.db import connection
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from profiles_app.models import Workload
from scheduler_app.api.fields import (
    StrictBooleanField,
    StrictCharField,
    StrictFloatField,
    StrictIntegerField,
    StrictSlugRelatedField,
)
from scheduler_app.api.serializers.fields_once import FieldsOnceModelSerializer, serializer_render
from scheduler_app.api.serializers.restarts import JobRestartsSerializer
from scheduler_app.batch_script import DirectiveError, parse_directives
from scheduler_app.job_paths import default_output_pattern, output_path_expand
from scheduler_app.models import AdmissionPrediction, Allocation, Job, JobEvent, JobState, Team
from scheduler_app.selectors import job_details_visible, job_estimate, job_restarts
from scheduler_app.services.admission_judge import qos_at_risk_message
from scheduler_app.services.forecast_as_of import forecast_confirmed_at, job_estimate_as_of
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
        help_text="Submit one job per task index (Slurm's --array): 0-9, 1,3,5-7 or 0-15:4",
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
                data["name"] = str(given.get("script_name") or "").strip() or "batch-script"
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


# The serializer context's key for the last finished refresh's time (JobSerializer._confirmed_at).
CONFIRMED_AT = "estimates_confirmed_at"

# What another user's job does not show: what it runs and where it writes (its owner's business).
HIDDEN_FROM_OTHERS = ("command", "script", "run_as", "work_dir", "output_path", "error_path")


class JobSerializer(FieldsOnceModelSerializer):
    owner = serializers.CharField(source="owner.username", read_only=True)
    team = serializers.CharField(source="team.name", read_only=True, allow_null=True, default=None)
    workload = serializers.CharField(source="workload.name", read_only=True, allow_null=True, default=None)
    queue_position = serializers.SerializerMethodField(
        help_text="1-based place among PENDING jobs in the policy's order at the last round (null: not yet)"
    )
    estimated_start_at = serializers.SerializerMethodField(
        help_text="A pending job's current estimate, the same on every page (docs/rest-api.md)"
    )
    estimated_finish_at = serializers.SerializerMethodField(
        help_text="A pending or running job's current estimate (null: unknown, see estimate_detail)"
    )
    estimate_detail = serializers.SerializerMethodField(help_text="Why an estimate is unknown")
    estimate_as_of = serializers.SerializerMethodField(
        help_text="As of when the estimate (its times or detail) holds: the start of the last forecast "
        "refresh that finished, or the later forecast that last changed it, such as its submission's "
        "(null: no estimate; docs/rest-api.md)"
    )
    deadline_at = serializers.DateTimeField(
        read_only=True,
        allow_null=True,
        help_text="The QoS target as a time: qos_deadline_at, or submission + qos_max_latency_s (null: none)",
    )
    details_hidden = serializers.SerializerMethodField(
        help_text="Another user's job: command, script, paths, log and event messages are left out"
    )
    depends_on = serializers.PrimaryKeyRelatedField(
        many=True, read_only=True, help_text="Jobs that must complete before this one starts"
    )
    array_job = serializers.PrimaryKeyRelatedField(
        read_only=True,
        allow_null=True,
        help_text="For a task of an array: the array's first task (Slurm's ArrayJobID)",
    )
    restarts = serializers.SerializerMethodField(
        help_text="Its moves, preemptions, requeues, resizes in place and the GPU time lost to restarts"
    )
    nodes = serializers.SerializerMethodField(
        help_text="The servers it runs on, or ran on last (scontrol's NodeList); empty: never started"
    )

    class Meta:
        model = Job
        fields = [
            "id",
            "name",
            "owner",
            "team",
            "workload",
            "command",
            "script",
            "run_as",
            "work_dir",
            "output_path",
            "error_path",
            "num_gpus",
            "num_nodes",
            "cpus_per_gpu",
            "mem_gb_per_gpu",
            "total_iters",
            "done_iters",
            "attained_service_gpu_s",
            "priority",
            "qos_deadline_at",
            "qos_max_latency_s",
            "qos_min_rate_iters_per_s",
            "deadline_at",
            "time_limit_s",
            "checkpoint_every_s",
            "depends_on",
            "held",
            "array_job",
            "array_task_id",
            "state",
            "pending_reason",
            "queue_position",
            "estimated_start_at",
            "estimated_finish_at",
            "estimate_detail",
            "estimate_as_of",
            "details_hidden",
            "submitted_at",
            "started_at",
            "finished_at",
            "exit_code",
            "restarts",
            "nodes",
        ]
        read_only_fields = fields

    @extend_schema_field(JobRestartsSerializer)
    def get_restarts(self, job: Job) -> dict[str, Any]:
        return serializer_render(JobRestartsSerializer, job_restarts(job), {})

    def get_nodes(self, job: Job) -> list[str]:
        # The prefetched leases, oldest first: the live ones, else those of the last start (one round).
        leases = list(job.allocations.all())
        live = [a for a in leases if a.ended_at is None]
        last = live or [a for a in leases if leases and a.round_id == leases[-1].round_id]
        return [a.server.name for a in last]

    def _queue_entry(self, job: Job):
        if job.state != JobState.PENDING or "queue" not in self.context:
            return None
        return self.context["queue"]().get(job.pk)

    def get_queue_position(self, job: Job) -> int | None:
        entry = self._queue_entry(job)
        return entry.position if entry else None

    @extend_schema_field(serializers.DateTimeField(allow_null=True))
    def get_estimated_start_at(self, job: Job) -> str | None:
        start = job_estimate(job).start_at if job.state == JobState.PENDING else None
        return serializers.DateTimeField().to_representation(start) if start else None

    @extend_schema_field(serializers.DateTimeField(allow_null=True))
    def get_estimated_finish_at(self, job: Job) -> str | None:
        finish = job_estimate(job).finish_at if job.state in (JobState.PENDING, JobState.RUNNING) else None
        return serializers.DateTimeField().to_representation(finish) if finish else None

    def get_estimate_detail(self, job: Job) -> str:
        return job_estimate(job).detail if job.state in (JobState.PENDING, JobState.RUNNING) else ""

    @extend_schema_field(serializers.DateTimeField(allow_null=True))
    def get_estimate_as_of(self, job: Job) -> str | None:
        at = job_estimate_as_of(job, self._confirmed_at)
        return serializers.DateTimeField().to_representation(at) if at else None

    def _confirmed_at(self) -> datetime | None:
        """The last finished refresh's time, read once per response (a list's rows share the context)."""
        if CONFIRMED_AT not in self.context:
            self.context[CONFIRMED_AT] = forecast_confirmed_at()
        return self.context[CONFIRMED_AT]

    def get_details_hidden(self, job: Job) -> bool:
        request = self.context.get("request")
        return request is not None and not job_details_visible(job, request.user)

    def to_representation(self, job: Job) -> dict[str, Any]:
        data = super().to_representation(job)
        if data.get("details_hidden"):
            # Another user's job: its summary, not what it runs or writes (scontrol show job's rule).
            for field in HIDDEN_FROM_OTHERS:
                if field in data:
                    data[field] = ""
        return data


class AllocationSerializer(FieldsOnceModelSerializer):
    server = serializers.CharField(source="server.name")
    gpu_indices = serializers.SerializerMethodField()
    gpu_uuids = serializers.SerializerMethodField()

    class Meta:
        model = Allocation
        fields = [
            "lease_id",
            "server",
            "gpu_indices",
            "gpu_uuids",
            "num_cpus",
            "mem_gb",
            "speedup",
            "started_at",
            "ended_at",
            "end_reason",
            "exit_code",
            "iters_per_s",
        ]
        read_only_fields = fields

    def get_gpu_indices(self, allocation: Allocation) -> list[int]:
        return [h.gpu.index for h in allocation.gpu_holds.all()]

    def get_gpu_uuids(self, allocation: Allocation) -> list[str]:
        return [h.gpu.uuid for h in allocation.gpu_holds.all()]


class JobEventSerializer(FieldsOnceModelSerializer):
    class Meta:
        model = JobEvent
        fields = ["at", "kind", "from_state", "to_state", "reason", "message", "data"]
        read_only_fields = fields


class AdmissionSerializer(FieldsOnceModelSerializer):
    finish_error_s = serializers.FloatField(
        read_only=True, allow_null=True, help_text="Actual minus predicted finish, once the job has ended"
    )

    class Meta:
        model = AdmissionPrediction
        fields = [
            "created_at",
            "policy",
            "allocator",
            "predicted_start_at",
            "predicted_finish_at",
            "deadline_at",
            "attainable",
            "detail",
            "actual_start_at",
            "actual_finish_at",
            "met_deadline",
            "measured_iters_per_s",
            "met_min_rate",
            "finish_error_s",
        ]
        read_only_fields = fields


class JobDetailSerializer(JobSerializer):
    allocations = AllocationSerializer(many=True, read_only=True)
    events = JobEventSerializer(many=True, read_only=True)
    log_tail = serializers.SerializerMethodField(help_text="The last lines of the job's output")
    admission = serializers.SerializerMethodField(
        help_text="Predicted at submission: start, finish, whether the QoS target is attainable"
    )
    stdout_file = serializers.SerializerMethodField(
        help_text="An own command's stdout file, its pattern expanded (the first node's on several); "
        "relative to work_dir; empty for a catalog workload"
    )
    stderr_file = serializers.SerializerMethodField(help_text="Its stderr file; empty: with stdout")

    class Meta(JobSerializer.Meta):
        fields = [
            *JobSerializer.Meta.fields,
            "stdout_file",
            "stderr_file",
            "admission",
            "allocations",
            "events",
            "log_tail",
        ]
        read_only_fields = fields

    @extend_schema_field(AdmissionSerializer(allow_null=True))
    def get_admission(self, job: Job) -> dict | None:
        try:
            prediction = job.admission_prediction
        except AdmissionPrediction.DoesNotExist:
            return None
        return serializer_render(AdmissionSerializer, prediction, {})

    def _file(self, job: Job, pattern: str) -> str:
        if job.workload_id is not None or not pattern:
            return ""
        nodes = self.get_nodes(job)
        return output_path_expand(
            pattern,
            job_id=job.pk,
            array_job_id=job.array_job_id,
            array_task_id=job.array_task_id,
            name=job.name,
            user=job.run_as,
            node_name=nodes[0] if nodes else "",
        )

    def get_stdout_file(self, job: Job) -> str:
        nodes = max(len(self.get_nodes(job)), job.num_nodes or 1)
        default = default_output_pattern(array=job.array_job_id is not None, num_nodes=nodes)
        return self._file(job, job.output_path or default)

    def get_stderr_file(self, job: Job) -> str:
        return self._file(job, job.error_path)

    def to_representation(self, job: Job) -> dict[str, Any]:
        data = super().to_representation(job)
        if data.get("details_hidden"):
            data["stdout_file"] = data["stderr_file"] = ""
            data["log_tail"] = []
            for event in data.get("events", []):
                event["message"], event["data"] = "", {}
        return data

    def get_log_tail(self, job: Job) -> list[str]:
        lines: list[str] = []
        for allocation in job.allocations.all():
            if allocation.log_tail:
                lines.extend(allocation.log_tail.splitlines())
        return lines[-200:]


class JobSubmittedSerializer(JobDetailSerializer):
    """The answer to a submission: the job (an array's first task) and, for an array, every task."""

    array_job_ids = serializers.SerializerMethodField(
        help_text="An array's tasks' ids, in index order; null when `array` was not given"
    )
    qos_warning = serializers.SerializerMethodField(
        help_text="Said plainly if the QoS target is predicted to be missed (the job is accepted), or empty"
    )

    class Meta(JobDetailSerializer.Meta):
        fields = [*JobDetailSerializer.Meta.fields, "array_job_ids", "qos_warning"]
        read_only_fields = fields

    @extend_schema_field(serializers.ListField(child=serializers.IntegerField(), allow_null=True))
    def get_array_job_ids(self, job: Job) -> list[int] | None:
        return self.context.get("array_job_ids")

    def get_qos_warning(self, job: Job) -> str:
        try:
            return qos_at_risk_message(job.admission_prediction)
        except AdmissionPrediction.DoesNotExist:
            return ""
