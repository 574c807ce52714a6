"""Trace jobs and the reference trace format `job_id,model,arrival_s,total_iters,gpus` (reader and writer).

Optional extras after the five reference columns: a sixth column, either `deadline_s` (QoS) or
`min_rate=R` (the other QoS kind, iterations/s), then a last field `nodes=N` (the job's node count,
Slurm's --nodes). The keyed forms keep every line that was valid or invalid before so, since no
reference column ever starts with `nodes=` or `min_rate=`.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from profiles_app.catalog import load_catalog
from scheduler_app.core.types import SensitivityProfile

logger = logging.getLogger(__name__)

NUM_COLUMNS = 5
NUM_COLUMNS_WITH_DEADLINE = 6
NODES_PREFIX = "nodes="
MIN_RATE_PREFIX = "min_rate="


class TraceError(ValueError):
    """A trace row (or file) that cannot be used; the message names the file and the line."""


@dataclass(frozen=True, slots=True)
class TraceJob:
    """One job of a trace: `total_iters` iterations of `model` on `num_gpus` GPUs, arriving at `arrival_s`.

    `arrival_s` is seconds from the start of the trace. A job's work at the GPU-proportional point
    takes `total_iters x profile.iter_time_s` seconds (the reference's convention). `deadline_s`
    (optional, absolute seconds on the trace clock) makes it a QoS job (GENIE): it is met when the
    job finishes by then. In the trace format it is an optional sixth column. `min_rate_iters_per_s`
    (optional, GENIE's other QoS kind) instead asks for at least that many iterations per second
    while it runs; in the trace format the sixth column `min_rate=R`. `owner_id` (who
    submitted it, for the fair-share policy) is set by generators and benchmarks; the file format
    has no column for it. `num_nodes` (optional, `JobView.num_nodes`): exactly that many servers with
    num_gpus / num_nodes GPUs each; in the trace format a last field `nodes=N`. `gpu_choices`
    (optional, `JobView.gpu_choices`): other GPU counts the job accepts, for GENIE's allocator to pick
    from; generators set it (genie_trace), the file format has no column for it.
    """

    job_id: int
    model: str
    arrival_s: float
    total_iters: int
    num_gpus: int
    deadline_s: float | None = None
    owner_id: int | None = None
    num_nodes: int | None = None
    min_rate_iters_per_s: float | None = None
    gpu_choices: tuple[int, ...] = ()


def _format_number(value: float) -> str:
    """Whole numbers as integers (as the reference writes them), others in their shortest exact form."""
    if float(value).is_integer():
        return str(int(value))
    return repr(float(value))


def format_trace_line(job: TraceJob) -> str:
    """One line of the reference format (plus a sixth deadline or `min_rate=R` column for QoS jobs and a
    last `nodes=N` field for a node count), without the newline."""
    if job.deadline_s is not None and job.min_rate_iters_per_s is not None:
        raise TraceError(f"job {job.job_id}: a trace line holds one QoS target, not a deadline and a rate")
    line = f"{job.job_id},{job.model},{_format_number(job.arrival_s)},{job.total_iters},{job.num_gpus}"
    if job.deadline_s is not None:
        line += f",{_format_number(job.deadline_s)}"
    elif job.min_rate_iters_per_s is not None:
        line += f",{MIN_RATE_PREFIX}{_format_number(job.min_rate_iters_per_s)}"
    if job.num_nodes is not None:
        line += f",{NODES_PREFIX}{job.num_nodes}"
    return line


def write_trace(path: str | Path, jobs: Iterable[TraceJob]) -> None:
    """Write `jobs` in the reference format (no header, one job a line); read_trace reads it back exactly."""
    text = "".join(format_trace_line(job) + "\n" for job in jobs)
    Path(path).write_text(text)


def _parse_int(text: str, field: str, where: str) -> int:
    try:
        value = float(text)
    except ValueError:
        raise TraceError(f"{where}: {field} {text!r} is not a number") from None
    if not math.isfinite(value) or not value.is_integer():
        raise TraceError(f"{where}: {field} {text!r} is not a whole number")
    if value <= 0:
        raise TraceError(f"{where}: {field} must be positive, got {text!r}")
    return int(value)


def parse_trace_line(
    line: str, *, where: str, models: Mapping[str, SensitivityProfile] | None = None
) -> TraceJob:
    """Parse one non-blank line; `where` ("file:line") prefixes every error message."""
    fields = [f.strip() for f in line.split(",")]
    num_nodes: int | None = None
    if len(fields) > NUM_COLUMNS and fields[-1].startswith(NODES_PREFIX):
        num_nodes = _parse_int(fields.pop()[len(NODES_PREFIX) :], "nodes", where)
    if len(fields) not in (NUM_COLUMNS, NUM_COLUMNS_WITH_DEADLINE):
        raise TraceError(
            f"{where}: expected {NUM_COLUMNS} columns (job_id,model,arrival_s,total_iters,gpus) "
            f"or {NUM_COLUMNS_WITH_DEADLINE} (...,deadline_s or min_rate=R), then optionally nodes=N, "
            f"got {len(fields)}"
        )
    id_text, model, arrival_text, iters_text, gpus_text = fields[:NUM_COLUMNS]
    try:
        job_id = int(id_text)
    except ValueError:
        raise TraceError(f"{where}: job_id {id_text!r} is not an integer") from None
    if job_id < 0:
        raise TraceError(f"{where}: job_id must be >= 0, got {job_id}")
    if not model:
        raise TraceError(f"{where}: empty model name")
    if models is not None and model not in models:
        raise TraceError(f"{where}: unknown model {model!r}; valid: {', '.join(sorted(models))}")
    try:
        arrival_s = float(arrival_text)
    except ValueError:
        raise TraceError(f"{where}: arrival_s {arrival_text!r} is not a number") from None
    if not math.isfinite(arrival_s) or arrival_s < 0:
        raise TraceError(f"{where}: arrival_s must be a finite number >= 0, got {arrival_text!r}")
    total_iters = _parse_int(iters_text, "total_iters", where)
    num_gpus = _parse_int(gpus_text, "gpus", where)
    if num_nodes is not None and num_gpus % num_nodes:
        raise TraceError(f"{where}: gpus ({num_gpus}) must split evenly over nodes ({num_nodes})")
    deadline_s: float | None = None
    min_rate: float | None = None
    if len(fields) == NUM_COLUMNS_WITH_DEADLINE and fields[-1].startswith(MIN_RATE_PREFIX):
        text = fields[-1][len(MIN_RATE_PREFIX) :]
        try:
            min_rate = float(text)
        except ValueError:
            raise TraceError(f"{where}: min_rate {text!r} is not a number") from None
        if not math.isfinite(min_rate) or min_rate <= 0:
            raise TraceError(f"{where}: min_rate must be a positive number (iterations/s), got {text!r}")
    elif len(fields) == NUM_COLUMNS_WITH_DEADLINE and fields[-1]:
        try:
            deadline_s = float(fields[-1])
        except ValueError:
            raise TraceError(f"{where}: deadline_s {fields[-1]!r} is not a number") from None
        if not math.isfinite(deadline_s) or deadline_s < arrival_s:
            raise TraceError(f"{where}: deadline_s must be finite and >= arrival_s, got {fields[-1]!r}")
    return TraceJob(
        job_id=job_id,
        model=model,
        arrival_s=arrival_s,
        total_iters=total_iters,
        num_gpus=num_gpus,
        deadline_s=deadline_s,
        num_nodes=num_nodes,
        min_rate_iters_per_s=min_rate,
    )


def parse_trace(
    lines: Iterable[str], *, source: str = "<trace>", models: Mapping[str, SensitivityProfile] | None = None
) -> list[TraceJob]:
    """Parse trace lines (blank lines and `#` comments are skipped); job ids must be unique."""
    jobs: list[TraceJob] = []
    seen: dict[int, int] = {}
    for lineno, raw in enumerate(lines, start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        where = f"{source}:{lineno}"
        job = parse_trace_line(line, where=where, models=models)
        if job.job_id in seen:
            raise TraceError(f"{where}: duplicate job_id {job.job_id} (first on line {seen[job.job_id]})")
        seen[job.job_id] = lineno
        jobs.append(job)
    if not jobs:
        raise TraceError(f"{source}: no jobs in trace")
    return jobs


def read_trace(path: str | Path, *, models: Mapping[str, SensitivityProfile] | None = None) -> list[TraceJob]:
    """Read a trace file; `models` (default: the shipped catalog) is the set of known model names."""
    if models is None:
        models = load_catalog()
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise TraceError(f"{path}: cannot read trace: {exc.strerror or exc}") from exc
    jobs = parse_trace(text.splitlines(), source=str(path), models=models)
    logger.debug("read %d jobs from %s", len(jobs), path)
    return jobs
