"""Serializers of the REST API: validate input into service arguments, render selector output."""

from __future__ import annotations

import math
from typing import Any

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from cluster_app.services import GpuSpec, GpuUsage, NodeInventory, UsageReport
from profiles_app.models import Workload
from scheduler_app.api.fields import StrictBooleanField, StrictCharField, StrictFloatField, StrictIntegerField
from scheduler_app.batch_script import DirectiveError, parse_directives
from scheduler_app.models import (
    AdmissionPrediction,
    AgentReportKind,
    Allocation,
    Job,
    JobEvent,
    JobState,
    Team,
)
from scheduler_app.services.agents import (
    AGENT_REPORT_MAX_SEQ,
    MAX_REPORTED_ITERS,
    LeaseReport,
    clean_text,
)
from scheduler_app.services.jobs import (
    MAX_DEPENDENCIES,
    MAX_DURATION_S,
    MAX_JOB_ID,
    MAX_PATH_CHARS,
    MAX_SCRIPT_CHARS,
    MAX_TOTAL_ITERS,
    JobRequest,
)
from scheduler_app.services.profiling import PROFILING_REPORT_KINDS

# ---------------------------------------------------------------------------------------------------
# Agent protocol (docs/agent-protocol.md)
# ---------------------------------------------------------------------------------------------------


class AgentGpuSerializer(serializers.Serializer):
    index = serializers.IntegerField(min_value=0, max_value=1023)
    uuid = serializers.CharField(max_length=64)
    model = serializers.CharField(max_length=100, required=False, allow_blank=True, default="")
    memory_mb = serializers.IntegerField(min_value=0, required=False, default=0)


class AgentRegisterSerializer(serializers.Serializer):
    agent_version = serializers.CharField(max_length=50, required=False, allow_blank=True, default="")
    hostname = serializers.CharField(max_length=255, required=False, allow_blank=True, default="")
    address = serializers.CharField(
        max_length=255,
        required=False,
        allow_blank=True,
        default="",
        help_text="Where the node's peers reach it (a multi-node job's MASTER_ADDR); default: hostname",
    )
    num_cpus = serializers.IntegerField(min_value=1, max_value=32767)
    mem_gb = serializers.FloatField(min_value=0.001)
    storage_mbps = serializers.FloatField(min_value=0, required=False, default=0.0)
    gpus = AgentGpuSerializer(many=True, allow_empty=False)
    cgroup_mode = serializers.CharField(max_length=32, required=False, allow_blank=True, default="")

    def validate_gpus(self, gpus: list[dict[str, Any]]) -> list[dict[str, Any]]:
        if len({g["index"] for g in gpus}) != len(gpus):
            raise serializers.ValidationError("GPU indices must be unique.")
        if len({g["uuid"] for g in gpus}) != len(gpus):
            raise serializers.ValidationError("GPU UUIDs must be unique.")
        return gpus

    def to_inventory(self) -> NodeInventory:
        d = self.validated_data
        return NodeInventory(
            num_cpus=d["num_cpus"],
            mem_gb=d["mem_gb"],
            gpus=[GpuSpec(**g) for g in d["gpus"]],
            hostname=d["hostname"],
            address=d["address"],
            agent_version=d["agent_version"],
            storage_mbps=d["storage_mbps"],
        )


class AgentRegisterResponseSerializer(serializers.Serializer):
    server = serializers.CharField()
    heartbeat_interval_s = serializers.IntegerField()
    poll_interval_s = serializers.IntegerField()


class GpuConflictSerializer(serializers.Serializer):
    detail = serializers.CharField()
    conflicting_uuids = serializers.ListField(child=serializers.CharField())


class AgentGpuUsageSerializer(serializers.Serializer):
    uuid = serializers.CharField(max_length=64)
    util_pct = serializers.FloatField(min_value=0)
    mem_used_mb = serializers.FloatField(min_value=0)


class AgentHeartbeatSerializer(serializers.Serializer):
    sampled_at = serializers.DateTimeField()
    cpu_util_pct = serializers.FloatField(min_value=0)
    mem_used_gb = serializers.FloatField(min_value=0)
    gpus = AgentGpuUsageSerializer(many=True, required=False, default=list)

    def to_usage(self) -> UsageReport:
        d = self.validated_data
        return UsageReport(
            sampled_at=d["sampled_at"],
            cpu_util_pct=d["cpu_util_pct"],
            mem_used_gb=d["mem_used_gb"],
            gpus=[GpuUsage(**g) for g in d["gpus"]],
        )


class AgentHeartbeatResponseSerializer(serializers.Serializer):
    state = serializers.CharField()


class AgentPollSerializer(serializers.Serializer):
    running = serializers.ListField(child=serializers.UUIDField(), required=False, default=list)


class AgentCommandSerializer(serializers.Serializer):
    """One command; which fields are present depends on `kind`."""

    kind = serializers.ChoiceField(choices=["start", "preempt", "cancel", "drain", "profile"])
    lease_id = serializers.UUIDField(required=False)
    grace_s = serializers.IntegerField(required=False)
    job_id = serializers.IntegerField(required=False)
    job_name = serializers.CharField(required=False)
    argv = serializers.ListField(child=serializers.CharField(), required=False)
    env = serializers.DictField(child=serializers.CharField(), required=False)
    gpu_uuids = serializers.ListField(child=serializers.CharField(), required=False)
    num_cpus = serializers.IntegerField(required=False)
    mem_gb = serializers.FloatField(required=False)
    resume_iters = serializers.IntegerField(required=False)
    workload = serializers.CharField(required=False, help_text="profile: the workload's name")
    cpu_counts = serializers.ListField(
        child=serializers.IntegerField(), required=False, help_text="profile: core counts to measure next"
    )
    warmup = serializers.BooleanField(required=False, help_text="profile: one untimed run first")
    iters = serializers.IntegerField(required=False, help_text="profile: timed iterations per point")
    warmup_iters = serializers.IntegerField(required=False, help_text="profile: untimed iterations first")


class AgentPollResponseSerializer(serializers.Serializer):
    commands = AgentCommandSerializer(many=True)


class AgentReportSerializer(serializers.Serializer):
    """One report, checked for shape (docs/agent-protocol.md section 4); checks that need the database
    (the lease's life, the job's total) are the service's. Strings in `data` are cleaned of NUL and of
    what is not UTF-8 (lone surrogates), at any depth, before anything is stored."""

    lease_id = serializers.UUIDField()
    seq = serializers.IntegerField(min_value=0, max_value=AGENT_REPORT_MAX_SEQ)
    # A profiling run's reports (docs/profiling.md) share the endpoint, under the run's lease id.
    kind = serializers.ChoiceField(choices=[*AgentReportKind.values, *PROFILING_REPORT_KINDS])
    at = serializers.DateTimeField()
    data = serializers.DictField(required=False, default=dict)

    def validate_data(self, value: dict[str, Any]) -> dict[str, Any]:
        return clean_text(value)

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        data, kind = attrs["data"], attrs["kind"]
        if kind == AgentReportKind.PROGRESS and not _is_number(data.get("done_iters")):
            raise serializers.ValidationError({"data": "progress needs a numeric done_iters"})
        if kind in (AgentReportKind.PROGRESS, AgentReportKind.EXITED):
            done = data.get("done_iters")
            if done is not None and not (_is_number(done) and done <= MAX_REPORTED_ITERS):
                raise serializers.ValidationError(
                    {"data": f"done_iters must be a number between 0 and {MAX_REPORTED_ITERS}"}
                )
            ips = data.get("iters_per_s")
            if ips is not None and not _is_number(ips):
                raise serializers.ValidationError(
                    {"data": "iters_per_s must be a finite number >= 0 (0 or null: not measured)"}
                )
            scale = data.get("time_scale")
            if scale is not None and not (_is_number(scale) and scale > 0):
                raise serializers.ValidationError({"data": "time_scale must be a finite number > 0"})
        if kind == AgentReportKind.LOG and not isinstance(data.get("lines"), list):
            raise serializers.ValidationError({"data": "log needs a list of lines"})
        if kind == AgentReportKind.EXITED:
            code, signal = data.get("exit_code"), data.get("signal")
            if code is not None and not (_is_int(code) and 0 <= code <= 255):
                raise serializers.ValidationError({"data": "exit_code must be an integer 0-255 or null"})
            if signal is not None and not (_is_int(signal) and 1 <= signal <= 64):
                raise serializers.ValidationError({"data": "signal must be an integer 1-64 or null"})
        return attrs

    def to_report(self) -> LeaseReport:
        return LeaseReport(**self.validated_data)


def _is_number(value: Any) -> bool:
    """A finite number >= 0 (not a bool)."""
    return (
        isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value) and value >= 0
    )


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


class AgentReportsSerializer(serializers.Serializer):
    # Items are validated one by one in the view: a malformed report is rejected, not the batch.
    reports = serializers.ListField(child=serializers.DictField(), max_length=5000)


class AgentReportRejectedSerializer(serializers.Serializer):
    lease_id = serializers.CharField(allow_null=True)
    seq = serializers.IntegerField(allow_null=True)
    error = serializers.CharField()
    code = serializers.IntegerField(
        help_text="404: lease not found on this server; 400: malformed or implausible (section 4)"
    )


class AgentReportsResponseSerializer(serializers.Serializer):
    acked = serializers.ListField(
        child=serializers.ListField(child=serializers.JSONField(), min_length=2, max_length=2),
        help_text="[lease_id, seq] pairs that are final (applied now or before)",
    )
    rejected = AgentReportRejectedSerializer(many=True)


# ---------------------------------------------------------------------------------------------------
# Jobs
# ---------------------------------------------------------------------------------------------------


class JobSubmitSerializer(serializers.Serializer):
    name = StrictCharField(max_length=200)
    workload = serializers.SlugRelatedField(
        slug_field="name",
        queryset=Workload.objects.all(),
        required=False,
        allow_null=True,
        help_text="A catalog workload's name; or give `command`",
    )
    command = StrictCharField(
        required=False, allow_blank=True, default="", help_text="Own command, run by sh -c; or give `script`"
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
    team = serializers.SlugRelatedField(
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
        required=False, allow_null=True, help_text="At most what the largest server offers per GPU"
    )
    mem_gb_per_gpu = StrictFloatField(
        required=False, allow_null=True, help_text="At most what the largest server offers per GPU"
    )
    qos_deadline_at = serializers.DateTimeField(
        required=False, allow_null=True, help_text="At most 5 years ahead"
    )
    qos_max_latency_s = StrictFloatField(
        required=False, allow_null=True, max_value=MAX_DURATION_S, help_text="At most 365 days"
    )
    priority = StrictIntegerField(required=False, default=0, min_value=-100, max_value=100)
    time_limit_s = StrictIntegerField(
        required=False, allow_null=True, min_value=1, max_value=MAX_DURATION_S, help_text="At most 365 days"
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
            if not data.get("name"):
                data["name"] = str(given.get("script_name") or "") or "batch-script"
        return super().to_internal_value(data)

    def validate_priority(self, value: int) -> int:
        request = self.context.get("request")
        if value > 0 and not (request and request.user.is_staff):
            raise serializers.ValidationError("Only staff may raise a job's priority.")
        return value

    def to_request(self) -> JobRequest:
        data = {k: v for k, v in self.validated_data.items() if k != "script_name"}
        return JobRequest(**{**data, "depends_on": tuple(data["depends_on"])})


class JobSerializer(serializers.ModelSerializer):
    owner = serializers.CharField(source="owner.username", read_only=True)
    team = serializers.CharField(source="team.name", read_only=True, allow_null=True, default=None)
    workload = serializers.CharField(source="workload.name", read_only=True, allow_null=True, default=None)
    queue_position = serializers.SerializerMethodField(help_text="1-based place among PENDING jobs")
    estimated_start_at = serializers.SerializerMethodField(help_text="Rough estimate; see docs/rest-api.md")
    depends_on = serializers.PrimaryKeyRelatedField(
        many=True, read_only=True, help_text="Jobs that must complete before this one starts"
    )
    array_job = serializers.PrimaryKeyRelatedField(
        read_only=True, help_text="For a task of an array: the array's first task (Slurm's ArrayJobID)"
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
            "time_limit_s",
            "depends_on",
            "held",
            "array_job",
            "array_task_id",
            "state",
            "pending_reason",
            "queue_position",
            "estimated_start_at",
            "submitted_at",
            "started_at",
            "finished_at",
            "exit_code",
        ]
        read_only_fields = fields

    def _queue_entry(self, job: Job):
        if job.state != JobState.PENDING or "queue" not in self.context:
            return None
        return self.context["queue"]().get(job.pk)

    def get_queue_position(self, job: Job) -> int | None:
        entry = self._queue_entry(job)
        return entry.position if entry else None

    def get_estimated_start_at(self, job: Job) -> str | None:
        entry = self._queue_entry(job)
        if entry is None or entry.estimated_start_at is None:
            return None
        return serializers.DateTimeField().to_representation(entry.estimated_start_at)


class AllocationSerializer(serializers.ModelSerializer):
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


class JobEventSerializer(serializers.ModelSerializer):
    class Meta:
        model = JobEvent
        fields = ["at", "kind", "from_state", "to_state", "reason", "message", "data"]
        read_only_fields = fields


class AdmissionSerializer(serializers.ModelSerializer):
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

    class Meta(JobSerializer.Meta):
        fields = [*JobSerializer.Meta.fields, "admission", "allocations", "events", "log_tail"]
        read_only_fields = fields

    @extend_schema_field(AdmissionSerializer(allow_null=True))
    def get_admission(self, job: Job) -> dict | None:
        try:
            prediction = job.admission_prediction
        except AdmissionPrediction.DoesNotExist:
            return None
        return AdmissionSerializer(prediction).data

    def get_log_tail(self, job: Job) -> list[str]:
        lines: list[str] = []
        for allocation in job.allocations.all():
            if allocation.log_tail:
                lines.extend(allocation.log_tail.splitlines())
        return lines[-200:]


# ---------------------------------------------------------------------------------------------------
# Cluster and servers
# ---------------------------------------------------------------------------------------------------


class ResourcesSerializer(serializers.Serializer):
    gpus = serializers.IntegerField()
    cpus = serializers.IntegerField()
    mem_gb = serializers.FloatField()


class OverviewGpuSerializer(serializers.Serializer):
    index = serializers.IntegerField()
    uuid = serializers.CharField()
    busy = serializers.BooleanField()
    job_id = serializers.IntegerField(allow_null=True)


class OverviewServerSerializer(serializers.Serializer):
    name = serializers.CharField()
    hostname = serializers.CharField()
    state = serializers.CharField()
    state_reason = serializers.CharField()
    gpu_model = serializers.CharField()
    agent_version = serializers.CharField()
    last_heartbeat_at = serializers.DateTimeField(allow_null=True)
    capacity = ResourcesSerializer()
    in_use = ResourcesSerializer()
    gpus = OverviewGpuSerializer(many=True)


class OverviewTotalsSerializer(serializers.Serializer):
    servers = serializers.IntegerField()
    gpus = serializers.IntegerField()
    cpus = serializers.IntegerField()
    mem_gb = serializers.FloatField()
    gpus_in_use = serializers.IntegerField()
    cpus_in_use = serializers.IntegerField()
    mem_gb_in_use = serializers.FloatField()
    schedulable_gpus = serializers.IntegerField()


class ClusterOverviewSerializer(serializers.Serializer):
    totals = OverviewTotalsSerializer()
    servers = OverviewServerSerializer(many=True)


class ServerDrainSerializer(serializers.Serializer):
    reason = serializers.CharField(max_length=255, required=False, allow_blank=True, default="")


class ServerStateSerializer(serializers.Serializer):
    name = serializers.CharField()
    state = serializers.CharField()
    state_reason = serializers.CharField()
