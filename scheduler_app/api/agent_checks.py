"""A sync's body checked by hand where it is well formed, with the serializers' result; else by them.

DRF checks a sync's nested sample and each report field by field (run_validation, validators, error
collection at every level): 0.25 ms of the web tier's CPU for a sample of 8 GPUs and 0.05 ms a report,
on every sync of every agent (bench.sync_cost, 2026-11-29). These checks accept only what the
serializers surely accept, and return what they would return: exact JSON types (no coercion), every
bound, strings DRF would neither trim nor refuse. Anything else, malformed or merely unusual (a key
missing that has no default, a number sent as a string, non-ASCII text), gives None and the caller runs
the serializer, whose answer and error messages stay the protocol's. tests/api/test_agent_checks.py
checks that both agree.
"""

from __future__ import annotations

import math
import uuid
from typing import Any

from rest_framework.exceptions import ValidationError

from scheduler_app.api.serializers.agents import (
    MAX_GPU_MEMORY_MB,
    MAX_GPUS_PER_SERVER,
    MAX_NODE_MEM_GB,
    AgentReportSerializer,
    AgentSyncSerializer,
    reports_check,
)
from scheduler_app.services.agents import AGENT_REPORT_MAX_SEQ, clean_text

_MISSING = object()
MAX_RUNNING = 4096  # AgentSyncSerializer.running's max_length
MAX_REPORTS = 5000  # AgentSyncSerializer.reports' max_length
MAX_GPU_UUID_CHARS = 64  # AgentGpuUsageSerializer.uuid's max_length


def _number(value: Any, low: float, high: float) -> float | None:
    """A StrictFloatField's value for a JSON number within [low, high]; None: the serializer decides."""
    kind = type(value)
    if kind is int:
        if not -(2**53) <= value <= 2**53:  # exactly a float; beyond, the serializer rounds or refuses
            return None
        value = float(value)
    elif kind is not float:
        return None
    return value if math.isfinite(value) and low <= value <= high else None


def _plain_text(value: Any, max_chars: int) -> str | None:
    """A required CharField's value: ASCII (no surrogates), no NUL, nothing to trim, not blank."""
    if (
        type(value) is not str
        or not 0 < len(value) <= max_chars
        or not value.isascii()
        or "\x00" in value
        or value.strip() != value
    ):
        return None
    return value


def _datetime(value: Any, field: Any) -> Any:
    """The DateTimeField's own parse of an ISO string (the request's time zone); None where it refuses."""
    if type(value) is not str:
        return None
    try:
        return field.to_internal_value(value)
    except ValidationError:
        return None


def _lease_id(value: Any) -> uuid.UUID | None:
    """A StrictUUIDField's value (uuid.UUID(hex=...), as DRF's UUIDField parses a string)."""
    if type(value) is not str:
        return None
    try:
        return uuid.UUID(hex=value)
    except ValueError:
        return None


def _sample(sample: Any, checker: AgentSyncSerializer) -> dict[str, Any] | None:
    """AgentHeartbeatSerializer's validated data for a well-formed sample; None otherwise."""
    if type(sample) is not dict:
        return None
    sampled_at = _datetime(sample.get("sampled_at"), checker.fields["sample"].fields["sampled_at"])
    cpu = _number(sample.get("cpu_util_pct"), 0, 100)
    mem = _number(sample.get("mem_used_gb"), 0, MAX_NODE_MEM_GB)
    if sampled_at is None or cpu is None or mem is None:
        return None
    gpus = sample.get("gpus", _MISSING)
    if gpus is _MISSING:
        gpus = []
    if type(gpus) is not list or len(gpus) > MAX_GPUS_PER_SERVER:
        return None
    usage = []
    for gpu in gpus:
        if type(gpu) is not dict:
            return None
        gpu_uuid = _plain_text(gpu.get("uuid"), MAX_GPU_UUID_CHARS)
        util = _number(gpu.get("util_pct"), 0, 100)
        mem_mb = _number(gpu.get("mem_used_mb"), 0, MAX_GPU_MEMORY_MB)
        if gpu_uuid is None or util is None or mem_mb is None:
            return None
        usage.append({"uuid": gpu_uuid, "util_pct": util, "mem_used_mb": mem_mb})
    return {"sampled_at": sampled_at, "cpu_util_pct": cpu, "mem_used_gb": mem, "gpus": usage}


def _sizes(sizes: Any) -> dict[uuid.UUID, tuple[int, float]] | None:
    """AgentSyncSerializer.validate_sizes' result for well-formed sizes; None otherwise."""
    if type(sizes) is not dict or len(sizes) > MAX_RUNNING:
        return None
    out = {}
    for key, value in sizes.items():
        lease = _lease_id(key)
        if lease is None or type(value) is not list or len(value) != 2:
            return None
        cpus, mem_gb = _number(value[0], 0, math.inf), _number(value[1], 0, math.inf)
        if cpus is None or mem_gb is None:
            return None
        out[lease] = (int(cpus), mem_gb)
    return out


def sync_body_check(data: Any, checker: AgentSyncSerializer) -> dict[str, Any] | None:
    """`checker.run_validation(data)`'s result where the body is well formed (reports are checked
    one by one later, `reports_check_fast`); None: run the serializer."""
    if type(data) is not dict:
        return None
    sample = _sample(data.get("sample"), checker)
    running = data.get("running", _MISSING)
    sizes = data.get("sizes", _MISSING)
    reports = data.get("reports", _MISSING)
    if sample is None:
        return None
    if running is _MISSING:
        running = []
    elif type(running) is not list or len(running) > MAX_RUNNING:
        return None
    leases = [_lease_id(lease) for lease in running]
    if None in leases:
        return None
    checked_sizes = {} if sizes is _MISSING else _sizes(sizes)
    if checked_sizes is None:
        return None
    if reports is _MISSING:
        reports = []
    elif type(reports) is not list or len(reports) > MAX_REPORTS:
        return None
    return {"sample": sample, "running": leases, "sizes": checked_sizes, "reports": list(reports)}


def _report(item: Any, checker: AgentReportSerializer) -> dict[str, Any] | None:
    """`checker.run_validation(item)`'s result for a well-formed report; None: run the serializer."""
    if type(item) is not dict:
        return None
    lease, seq, kind = _lease_id(item.get("lease_id")), item.get("seq"), item.get("kind")
    if lease is None or type(seq) is not int or not 0 <= seq <= AGENT_REPORT_MAX_SEQ or type(kind) is not str:
        return None
    kind_value = checker.fields["kind"].choice_strings_to_values.get(kind)
    at = _datetime(item.get("at"), checker.fields["at"])
    data = item.get("data", _MISSING)
    if kind_value is None or at is None:
        return None
    if data is _MISSING:
        data = {}
    elif type(data) is not dict:
        return None
    attrs = {"lease_id": lease, "seq": seq, "kind": kind_value, "at": at, "data": clean_text(dict(data))}
    try:
        return checker.validate(attrs)
    except ValidationError:
        return None


def reports_check_fast(
    items: list[Any], *, checker: AgentReportSerializer
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """`reports_check`'s result, in the same order: each report checked by hand where well formed,
    else by the serializer (which words its rejection)."""
    valid, rejected = [], []
    for item in items:
        report = _report(item, checker)
        if report is not None:
            valid.append(report)
            continue
        ok, refused = reports_check([item], checker=checker)
        valid += ok
        rejected += refused
    return valid, rejected
