"""Serializers of the agent protocol (docs/agent-protocol.md): registration and the sync."""

from __future__ import annotations

import math
from typing import Any
from uuid import UUID

from rest_framework import serializers

from cluster_app.services import GpuSpec, GpuUsage, NodeInventory, UsageReport
from scheduler_app.api.fields import (
    StrictCharField,
    StrictFloatField,
    StrictIntegerField,
    StrictUUIDField,
)
from scheduler_app.models import AgentReportKind
from scheduler_app.services.agents import AGENT_REPORT_MAX_SEQ, clean_text
from scheduler_app.services.profiling import PROFILING_REPORT_KINDS
from scheduler_app.services.report_apply import MAX_REPORTED_ITERS

# Bounds of what a node can report, far above any real machine: what passes them fits the database's
# columns and every sum the dashboards take of them.
MAX_GPU_MEMORY_MB = 10**7  # 10 TB on one GPU
MAX_NODE_MEM_GB = 10**6  # 1 PB of DRAM in one server
MAX_STORAGE_MBPS = 10**7  # 10 TB/s
# GPUs one server may register (indices 0-1023), hence list in one usage sample: far above any real
# machine, and a bound on what validating and storing one sample costs (10,000 entries were accepted).
MAX_GPUS_PER_SERVER = 1024


class AgentGpuSerializer(serializers.Serializer):
    index = StrictIntegerField(min_value=0, max_value=1023)
    uuid = StrictCharField(max_length=64)
    model = StrictCharField(max_length=100, required=False, allow_blank=True, default="")
    memory_mb = StrictIntegerField(min_value=0, max_value=MAX_GPU_MEMORY_MB, required=False, default=0)


class AgentRegisterSerializer(serializers.Serializer):
    agent_version = StrictCharField(max_length=50, required=False, allow_blank=True, default="")
    hostname = StrictCharField(max_length=255, required=False, allow_blank=True, default="")
    address = StrictCharField(
        max_length=255,
        required=False,
        allow_blank=True,
        default="",
        help_text="Where the node's peers reach it (a multi-node job's MASTER_ADDR); default: hostname",
    )
    num_cpus = StrictIntegerField(min_value=1, max_value=32767)
    mem_gb = StrictFloatField(min_value=0.001, max_value=MAX_NODE_MEM_GB)
    storage_mbps = StrictFloatField(min_value=0, max_value=MAX_STORAGE_MBPS, required=False, default=0.0)
    # A ListField, not many=True: drf-spectacular states a ListField's bounds (minItems, maxItems).
    gpus = serializers.ListField(
        child=AgentGpuSerializer(), allow_empty=False, min_length=1, max_length=MAX_GPUS_PER_SERVER
    )
    cgroup_mode = StrictCharField(max_length=32, required=False, allow_blank=True, default="")
    features = serializers.ListField(
        child=StrictCharField(max_length=32),
        required=False,
        default=list,
        max_length=32,
        help_text='What the agent can do beyond the base protocol: "resize" (it applies a running '
        "lease's new cores and memory in place, from `resize` commands)",
    )
    time_scale = StrictFloatField(
        min_value=1e-4,
        max_value=1e4,
        required=False,
        default=1.0,
        help_text="A fake node's time per second of a job's profile (0.05: 20x faster); 1 on a real node",
    )

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
            time_scale=d["time_scale"],
            features=frozenset(d["features"]),
        )


class AgentFenceSerializer(serializers.Serializer):
    """The lease fence (docs/faults.md, "Fencing"), measured on the node's monotonic clock."""

    lease_fence_s = serializers.FloatField(
        help_text="A lease not renewed by an answered sync for this long is stopped on its node"
    )
    grace_s = serializers.FloatField(help_text="Seconds between the fence's SIGTERM and its SIGKILL")


class AgentRegisterResponseSerializer(serializers.Serializer):
    server = serializers.CharField()
    sync_interval_s = serializers.FloatField(help_text="Seconds between syncs (jittered by the agent)")
    fence = AgentFenceSerializer()


class GpuConflictSerializer(serializers.Serializer):
    detail = serializers.CharField()
    conflicting_uuids = serializers.ListField(child=serializers.CharField())


class AgentNotRegisteredSerializer(serializers.Serializer):
    detail = serializers.CharField()
    code = serializers.CharField(help_text='"not_registered": register first (a sync stores nothing before)')


class AgentGpuUsageSerializer(serializers.Serializer):
    uuid = StrictCharField(max_length=64)
    util_pct = StrictFloatField(min_value=0, max_value=100)
    mem_used_mb = StrictFloatField(min_value=0, max_value=MAX_GPU_MEMORY_MB)


class AgentHeartbeatSerializer(serializers.Serializer):
    sampled_at = serializers.DateTimeField()
    cpu_util_pct = StrictFloatField(min_value=0, max_value=100, help_text="The whole node's, 0-100")
    mem_used_gb = StrictFloatField(min_value=0, max_value=MAX_NODE_MEM_GB)
    gpus = serializers.ListField(
        child=AgentGpuUsageSerializer(),
        required=False,
        default=list,
        max_length=MAX_GPUS_PER_SERVER,
        error_messages={
            "max_length": "a sample lists at most {max_length} GPUs (a server registers at most as many)"
        },
    )

    @staticmethod
    def usage_of(d: dict[str, Any]) -> UsageReport:
        """The usage report of validated data (this serializer's, or a sync's nested `sample`)."""
        return UsageReport(
            sampled_at=d["sampled_at"],
            cpu_util_pct=d["cpu_util_pct"],
            mem_used_gb=d["mem_used_gb"],
            gpus=[GpuUsage(**g) for g in d["gpus"]],
        )


class AgentCommandSerializer(serializers.Serializer):
    """One command; which fields are present depends on `kind`."""

    kind = serializers.ChoiceField(choices=["start", "preempt", "cancel", "drain", "profile", "resize"])
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
    method = serializers.CharField(
        required=False,
        help_text='profile: "genie" for GENIE\'s lightweight profile (configurations, not cores)',
    )
    configs = serializers.ListField(
        child=serializers.DictField(),
        required=False,
        help_text="profile (genie): configurations to measure next: key, argv, env, gpus, num_cpus, batch, "
        "num_servers, node_rank",
    )
    max_s_per_config = serializers.FloatField(
        required=False, help_text="profile (genie): each configuration's launch is stopped after this long"
    )


class AgentReportSerializer(serializers.Serializer):
    """One report, checked for shape (docs/agent-protocol.md section 4); checks that need the database
    (the lease's life, the job's total) are the service's. Strings in `data` are cleaned of NUL and of
    what is not UTF-8 (lone surrogates), at any depth, before anything is stored."""

    lease_id = StrictUUIDField()
    seq = StrictIntegerField(min_value=0, max_value=AGENT_REPORT_MAX_SEQ)
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


def reports_check(
    items: list[Any], *, checker: AgentReportSerializer
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Each of a sync's report items checked alone with `checker` (section 4): the validated reports,
    and a rejection (code 400, with its error) for each malformed item, a non-object one included."""
    valid, rejected = [], []
    for item in items:
        if not isinstance(item, dict):
            kind = "null" if item is None else type(item).__name__
            error = f"a report must be a JSON object, not {kind}"
            rejected.append({"lease_id": None, "seq": None, "error": error, "code": 400})
            continue
        try:
            valid.append(checker.run_validation(item))
        except serializers.ValidationError as exc:
            lease, seq = item.get("lease_id"), item.get("seq")
            rejected.append(
                {
                    # Echoed so that the agent drops that report from its spool; what cannot name one
                    # (a non-string lease, a non-integer seq) is left out.
                    "lease_id": lease if isinstance(lease, str) and lease else None,
                    "seq": seq if type(seq) is int else None,
                    "error": _flatten(exc.detail),
                    "code": 400,
                }
            )
    return valid, rejected


def _flatten(errors: Any) -> str:
    if not isinstance(errors, dict):
        return " ".join(str(m) for m in errors) if isinstance(errors, list) else str(errors)
    parts = []
    for field, messages in errors.items():
        if isinstance(messages, dict):
            messages = [f"{k}: {v}" for k, v in messages.items()]
        elif not isinstance(messages, list):
            messages = [messages]
        parts.append(f"{field}: {' '.join(str(m) for m in messages)}")
    return "; ".join(parts)


def _is_number(value: Any) -> bool:
    """A finite number >= 0 (not a bool). An integer is finite whatever its size (math.isfinite raises
    OverflowError on one beyond a float's range: a 500 for a report's 400-digit done_iters)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return False
    return (isinstance(value, int) or math.isfinite(value)) and value >= 0


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


class AgentReportRejectedSerializer(serializers.Serializer):
    lease_id = serializers.CharField(allow_null=True)
    seq = serializers.IntegerField(allow_null=True)
    error = serializers.CharField()
    code = serializers.IntegerField(
        help_text="404: lease not found on this server; 400: malformed or implausible (section 4)"
    )


class AgentSyncSerializer(serializers.Serializer):
    """One sync (docs/agent-protocol.md section 2): the node's usage, the leases it runs, its reports."""

    sample = AgentHeartbeatSerializer(help_text="Usage now: marks the server alive")
    running = serializers.ListField(
        child=StrictUUIDField(), required=False, default=list, max_length=4096, help_text="Leases it runs"
    )
    sizes = serializers.DictField(
        child=serializers.ListField(child=StrictFloatField(min_value=0), min_length=2, max_length=2),
        required=False,
        default=dict,
        help_text="An agent with the `resize` feature: lease id -> [cores, memory GB] it applies now; a "
        "running lease whose size differs from the service's gets a `resize` command",
    )

    def validate_sizes(self, sizes: dict[str, list[float]]) -> dict[UUID, tuple[int, float]]:
        if len(sizes) > 4096:
            raise serializers.ValidationError("at most 4096 leases")
        try:
            return {UUID(str(k)): (int(v[0]), float(v[1])) for k, v in sizes.items()}
        except ValueError as exc:
            raise serializers.ValidationError(f"keys must be lease ids: {exc}") from exc

    # Items are checked one by one (`reports_check`): a malformed report, even one that is not a JSON
    # object, is rejected alone, not the sync.
    reports = serializers.ListField(
        child=serializers.JSONField(allow_null=True),
        required=False,
        default=list,
        max_length=5000,
        help_text="Reports (section 4), each checked alone: a malformed one is listed in `rejected`",
    )


class AgentWaitSerializer(serializers.Serializer):
    url = serializers.CharField(help_text="GET it with ?ticket=&generation=&timeout_s= between syncs")
    ticket = serializers.CharField()
    generation = serializers.IntegerField(help_text="The server's wake generation when this sync read it")
    timeout_s = serializers.FloatField()


class AgentSyncResponseSerializer(serializers.Serializer):
    state = serializers.CharField(help_text="The server's state")
    commands = AgentCommandSerializer(many=True)
    acked = serializers.ListField(
        child=serializers.ListField(child=serializers.JSONField(), min_length=2, max_length=2),
        help_text="[lease_id, seq] pairs that are final (applied now or before)",
    )
    rejected = AgentReportRejectedSerializer(many=True)
    sync_interval_s = serializers.FloatField()
    wait = AgentWaitSerializer(allow_null=True, help_text="null: no long-poll; sync at the interval")
    fence = AgentFenceSerializer()
