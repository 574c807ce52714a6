"""`cancel`, `hold`, `release` and `update` (scancel, scontrol hold/release/update): which jobs, and
each one's change."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any, TextIO

from cli.api import Api, CliError
from cli.commands import LIVE_STATES
from cli.durations import parse_time_limit_s
from cli.output import clock


def resolve_job_refs(api: Api, refs: list[int | tuple[int, int]]) -> list[int]:
    """Job ids, with each array task written as (array id, index), Slurm's 42_3, replaced by its own
    id: one list request per array named."""
    tasks: dict[int, dict[int, int]] = {}
    ids = []
    for ref in refs:
        if isinstance(ref, int):
            ids.append(ref)
            continue
        array, index = ref
        if array not in tasks:
            tasks[array] = {t["array_task_id"]: t["id"] for t in api.jobs({"array_job": array})}
        if index not in tasks[array]:
            raise CliError(f"{array}_{index}: no task {index} in array {array} (or not yours to see)")
        ids.append(tasks[array][index])
    return ids


def live_array_tasks(api: Api, array_job_id: int) -> list[int]:
    """The ids of an array's tasks still PENDING or RUNNING, in index order (scancel ARRAYID)."""
    tasks = api.jobs({"array_job": array_job_id, "state": list(LIVE_STATES)})
    return [t["id"] for t in sorted(tasks, key=lambda t: t["array_task_id"])]


def live_jobs_matching(
    api: Api, *, job_ids: list[int], name: str | None, user: str | None, states: list[str]
) -> list[int]:
    """scancel's filters (-n, -u, -t): the ids of the PENDING or RUNNING jobs that match them all,
    among `job_ids` when given; without -u, one's own jobs only (scancel would try everyone's that
    match and be refused on each)."""
    wanted = [state for state in states if state in LIVE_STATES] if states else list(LIVE_STATES)
    if states and len(wanted) < len(set(states)):
        raise CliError("-t: only PENDING or RUNNING jobs can be cancelled", exit_code=2)
    params: dict[str, Any] = {"state": wanted}
    if name:
        params["name"] = name
    if user:
        params["owner"] = user
    else:
        params["mine"] = "true"
    if not job_ids:
        return sorted(job["id"] for job in api.jobs(params))
    found = {job["id"] for job in api.jobs_by_id(job_ids, params)}
    return [job_id for job_id in job_ids if job_id in found]


def change(api: Api, action: str, job_ids: list[int], out: TextIO) -> int:
    """Cancel, hold or release each job; carry on past one that fails (as scancel does) and exit 1
    if any did. Prints each job's state (and reason while it is pending) afterwards."""
    return _each_job(job_ids, lambda job_id: api.change(job_id, action), _state_line, out)


def update(
    api: Api, job_ids: list[int], *, time_limit: str | None, array_limit: int | None, out: TextIO
) -> int:
    """Change each job's time limit, or its array's limit on tasks at once (scontrol update TimeLimit=,
    ArrayTaskThrottle=), and print what it is now; carry on past one refused and exit 1 if any was."""
    body: dict[str, Any] = {}
    if time_limit:
        body["time_limit_s"] = parse_time_limit_s(time_limit, option="--time", leave_out="give a limit")
    if array_limit is not None:
        body["array_task_limit"] = array_limit
    if not body:
        raise CliError("give --time TIME or --array-limit N", exit_code=2)
    return _each_job(job_ids, lambda job_id: api.update(job_id, body), _limits_line, out)


def _each_job(
    job_ids: list[int],
    act: Callable[[int], dict[str, Any]],
    line: Callable[[dict[str, Any]], str],
    out: TextIO,
) -> int:
    """`act` on each job, printing `line` of its answer; one refused goes to stderr and the others
    still follow (as scancel and scontrol do): 1 if any was refused, else 0."""
    failed = 0
    for job_id in job_ids:
        try:
            job = act(job_id)
        except CliError as exc:
            failed += 1
            said = str(exc)  # the service's refusals often name the job ("job 19 is already COMPLETED")
            sys.stderr.write(said if said.startswith(f"job {job_id} ") else f"job {job_id}: {said}")
            sys.stderr.write("\n")
            continue
        out.write(f"job {job_id}: {line(job)}\n")
    return 1 if failed else 0


def _state_line(job: dict[str, Any]) -> str:
    reason = f" ({job['pending_reason']})" if job["state"] == "PENDING" else ""
    return f"{job['state']}{reason}"


def _limits_line(job: dict[str, Any]) -> str:
    limit = job.get("time_limit_s")
    line = f"time limit {clock(limit) if limit else 'none'}"
    if job.get("array_job") is not None:
        at_once = job.get("array_task_limit")
        line += f", array {job['array_job']}: "
        line += f"at most {at_once} tasks at once" if at_once else "no limit"
    return line
