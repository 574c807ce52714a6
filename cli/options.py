"""The service's field names as the options that set them, so that a refusal names what the user typed."""

from __future__ import annotations

from typing import Any

from cli.api import CliError, error_lines

# POST /api/v1/jobs/'s fields -> submit's options (the API's names mean nothing at a prompt).
OPTION_OF_FIELD = {
    "name": "--job-name",
    "workload": "--workload",
    "command": "--command",
    "num_gpus": "--gpus",
    "nodes": "--nodes",
    "total_iters": "--iters",
    "cpus_per_gpu": "--cpus-per-gpu",
    "mem_gb_per_gpu": "--mem-per-gpu",
    "team": "--team",
    "priority": "--priority",
    "qos_deadline_at": "--deadline",
    "qos_max_latency_s": "--max-latency",
    "qos_min_rate_iters_per_s": "--min-rate",
    "time_limit_s": "--time",
    "checkpoint_every_s": "--checkpoint-every",
    "depends_on": "--dependency",
    "hold": "--hold",
    "array": "--array",
    "output": "--output",
    "error": "--error",
    "chdir": "--chdir",
}


def option_fields(fields: dict[str, Any]) -> dict[str, Any]:
    """A refusal's {field: messages} keyed by the options instead."""
    return {OPTION_OF_FIELD.get(field, field): messages for field, messages in fields.items()}


def with_option_names(exc: CliError) -> CliError:
    """A submission's refusal restated with option names ("--gpus: ..." for "num_gpus: ...")."""
    if not exc.fields:
        return exc
    return CliError(
        "\n".join(error_lines(option_fields(exc.fields))), exit_code=exc.exit_code, fields=exc.fields
    )
