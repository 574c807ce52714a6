"""Serializers of the users' job endpoints' answers: a job with its leases, events and admission
prediction (a submission's own serializer: job_submit.py)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from scheduler_app.api.serializers.fields_once import FieldsOnceModelSerializer, serializer_render
from scheduler_app.api.serializers.restarts import JobRestartsSerializer
from scheduler_app.job_paths import default_output_pattern, output_path_expand
from scheduler_app.models import AdmissionPrediction, Allocation, Job, JobEvent, JobState
from scheduler_app.selectors import job_details_visible, job_estimate, job_restarts
from scheduler_app.services.admission_judge import qos_at_risk_message
from scheduler_app.services.forecast_as_of import forecast_confirmed_at, job_estimate_as_of

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
            "array_task_limit",
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
