"""What each command does with the service's answers, printed the way squeue and scontrol users read."""

from __future__ import annotations

import getpass
import json
import os
import sys
import time
from typing import Any, TextIO

from cli.api import Api, CliError, error_lines
from cli.array_rows import array_run_id, gather_array_runs
from cli.config import program, save_login
from cli.durations import parse_deadline, parse_duration_s, parse_mem_gb, parse_rate, parse_time_limit_s
from cli.job_names import default_job_name
from cli.options import option_fields, with_option_names
from cli.output import choices_text, estimates_as_of_line, instant, table, when
from cli.waiting import wait


def login(api: Api, *, username: str | None, token: str | None = None, out: TextIO) -> int:
    """Save a token: one made on the web page (account/token/), given or pasted, so that LDAP and SSO
    users' passwords never pass through here; or the one the service gives a local account's password."""
    if username:
        password = os.environ.get("ATTUNE_PASSWORD") or getpass.getpass(f"Password for {username}: ")
        token = api.token(username, password)
        who = f"as {username}"
    else:
        where = f"{api.server}/account/token/"
        if not token:
            sys.stderr.write(f"Make or copy your API token at {where} (signed in).\n")
            token = getpass.getpass("Paste the token: ").strip()
        if not token:
            raise CliError("no token given", exit_code=2)
        # Checked before it is saved, with a request that needs a token.
        try:
            Api(api.server, token).request("GET", "/api/v1/jobs/", params={"limit": 1})
        except CliError as exc:
            raise CliError(f"{exc}\nnot saved: copy the token again from {where}") from None
        who = "with your API token"
    path = save_login(server=api.server, token=token)
    out.write(f"Logged in to {api.server} {who}; token saved in {path}\n")
    return 0


def _read_script(path: str) -> str:
    try:
        if path == "-":
            return sys.stdin.read()
        with open(path, encoding="utf-8") as script:
            return script.read()
    except (OSError, UnicodeDecodeError) as exc:
        raise CliError(
            f"cannot read the script {path!r} ({exc}); to submit without a script give "
            "--workload NAME or --command 'CMD'",
            exit_code=2,
        ) from None


def _what_runs(args: Any) -> dict[str, Any]:
    """The script, command or workload, and the name when it came positionally (the older form)."""
    if args.workload and args.command:
        raise CliError("give either --workload NAME or --command 'CMD', not both", exit_code=2)
    if args.workload or args.command:
        if args.target and args.name:
            raise CliError(f"two names: {args.target!r} and -J {args.name!r}", exit_code=2)
        # Without a name, the workload's, or the command's program (as srun names a job after its
        # executable).
        name = args.target or args.name or default_job_name(args.workload, args.command)
        if not name:
            raise CliError("give the job a name: -J NAME", exit_code=2)
        what = {"workload": args.workload} if args.workload else {"command": args.command}
        return {"name": name, **what}
    if not args.target:
        raise CliError("give a script, or --workload NAME or --command 'CMD'", exit_code=2)
    # Its file name names the job when neither -J nor --job-name does (as sbatch's default).
    script_name = "stdin" if args.target == "-" else os.path.basename(args.target)
    return {"script": _read_script(args.target), "script_name": script_name}


def _converted(args: Any) -> dict[str, Any]:
    """The options typed in the user's units, in the API's."""
    body: dict[str, Any] = {}
    targets = [
        flag
        for flag, given in (
            ("--deadline", args.deadline),
            ("--max-latency", args.max_latency),
            ("--min-rate", args.min_rate),
        )
        if given
    ]
    if len(targets) > 1:
        raise CliError(
            f"give one QoS target: --deadline, --max-latency or --min-rate, not {' and '.join(targets)}",
            exit_code=2,
        )
    try:
        if args.deadline:
            body["qos_deadline_at"] = parse_deadline(args.deadline).isoformat()
        if args.max_latency:
            body["qos_max_latency_s"] = parse_duration_s(args.max_latency, option="--max-latency")
        if args.min_rate:
            body["qos_min_rate_iters_per_s"] = parse_rate(args.min_rate, option="--min-rate")
        if args.time_limit:
            body["time_limit_s"] = parse_time_limit_s(args.time_limit, option="--time")
        if args.checkpoint_every:
            body["checkpoint_every_s"] = parse_duration_s(args.checkpoint_every, option="--checkpoint-every")
        if args.mem_per_gpu:
            body["mem_gb_per_gpu"] = parse_mem_gb(args.mem_per_gpu)
    except ValueError as exc:
        raise CliError(str(exc), exit_code=2) from None
    return body


def submit_body(args: Any) -> dict[str, Any]:
    """The job as POST /api/v1/jobs/ takes it, from the submit command's arguments: only the options
    given, since the service fills the rest from the script's directives (given options win)."""
    body = _what_runs(args)
    if "workload" not in body:
        body["submit_dir"] = os.getcwd()  # sbatch's default working directory
    if args.name and "name" not in body:
        body["name"] = args.name
    body.update(_converted(args))
    given = {
        "num_gpus": args.gpus,
        "nodes": args.nodes,
        "total_iters": args.iters,
        "cpus_per_gpu": args.cpus_per_gpu,
        "mem_gb_per_gpu": args.mem_gb_per_gpu,
        "team": args.team,
        "priority": args.priority,
        "depends_on": args.after,
        "hold": args.hold or None,
        "array": args.array,
        "output": args.output,
        "error": args.error,
        "chdir": os.path.abspath(args.chdir) if args.chdir else None,
    }
    body.update({key: value for key, value in given.items() if value not in (None, [])})
    return body


def submit(api: Api, args: Any, out: TextIO) -> int:
    body = submit_body(args)
    try:
        job = api.submit(body)
    except CliError as exc:
        exc = _with_workload_choices(api, with_option_names(exc), body.get("workload"))
        if "script" not in body:
            raise exc from None
        # The service names the script's bad line ("script: line 4: ..."); name the file as compilers do.
        lines = str(exc).splitlines()
        shown = "<stdin>" if args.target == "-" else args.target
        raise CliError(
            "\n".join(
                f"{shown}: {line[len('script: ') :]}" if line.startswith("script: ") else line
                for line in lines
            ),
            exit_code=exc.exit_code,
        ) from None
    submitted = job.get("array_job_ids") or [job["id"]]
    if args.json:
        out.write(json.dumps(job, indent=2) + "\n")
    elif len(submitted) > 1 or job.get("array_job") is not None:
        first, last = submitted[0], submitted[-1]
        out.write(f"Submitted array job {job['id']}: {len(submitted)} tasks, jobs {first} to {last}\n")
    else:
        out.write(f"Submitted job {job['id']}\n")
        _print_admission(job.get("admission") or {}, out)
        if args.wait and _forecast_pending(job):
            _print_admission(_admission_when_ready(api, job["id"], poll_s=args.poll_s), out)
    return wait(api, submitted, poll_s=args.poll_s, out=out) if args.wait else 0


# A deep queue's admission forecast follows the submission's answer (the service's forecasts worker).
FORECAST_PENDING_PREFIX = "forecast pending"
ADMISSION_WAIT_S = 60.0


def _forecast_pending(job: dict[str, Any]) -> bool:
    return str((job.get("admission") or {}).get("detail", "")).startswith(FORECAST_PENDING_PREFIX)


def _admission_when_ready(api: Api, job_id: int, *, poll_s: float) -> dict[str, Any]:
    """The job's admission answer once the service has computed it (moments after the submission
    with a deep queue); what it says after ADMISSION_WAIT_S otherwise."""
    deadline = time.monotonic() + ADMISSION_WAIT_S
    job = api.job(job_id)
    while _forecast_pending(job) and time.monotonic() < deadline:
        time.sleep(min(poll_s, 1.0))
        job = api.job(job_id)
    return job.get("admission") or {}


def _with_workload_choices(api: Api, exc: CliError, workload: str | None) -> CliError:
    """A refusal of an unknown workload, restated with the catalog's names (the service's own words
    for every other field). Left as it was when the catalog cannot be read (an older service)."""
    if workload is None or "workload" not in exc.fields:
        return exc
    try:
        names = [w["name"] for w in api.workloads()]
    except CliError:
        return exc
    if workload in names:  # refused for another reason: the service says which
        return exc
    known = f"choose one of {choices_text(names)}" if names else "the catalog is empty"
    lines = [f"unknown workload {workload!r}: {known} ({program()} workloads lists them)"]
    lines += error_lines(option_fields({k: v for k, v in exc.fields.items() if k != "workload"}))
    return CliError("\n".join(lines), exit_code=exc.exit_code, fields=exc.fields)


def _print_admission(admission: dict[str, Any], out: TextIO) -> None:
    """The forecast made at submission: start, finish, QoS verdict, and why one is unknown."""
    if admission:
        out.write(
            f"  predicted start {when(admission.get('predicted_start_at'))}, "
            f"finish {when(admission.get('predicted_finish_at'))}\n"
        )
        if admission.get("attainable") is not None:
            deadline = admission.get("deadline_at")
            verdict = (
                "attainable"
                if admission["attainable"]
                else "AT RISK: the job is accepted, but predicted to "
                + ("finish after it" if deadline else "run slower on average")
            )
            target = when(deadline) if deadline else "(minimum rate)"
            out.write(f"  QoS target {target}: {verdict}\n")
        if admission.get("detail"):
            out.write(f"  note: {admission['detail']}\n")


QUEUE_HEADER = ["JOBID", "NAME", "USER", "STATE", "GPUS", "REASON", "POS", "START", "END", "QOS"]
# queue --long's extra columns: moves, preemptions (and requeues), GPU-hours lost to restarts.
QUEUE_LONG_HEADER = ["MOVES", "PREEMPT", "LOST_GPU_H"]
LIVE_STATES = ("PENDING", "RUNNING")


def job_name_text(job: dict[str, Any]) -> str:
    """The job's name, with its task index for a task of an array: sweep[3]."""
    task = job.get("array_task_id")
    return job["name"][:24] + (f"[{task}]" if task is not None else "")


JOB_STATES = (
    "PENDING",
    "RUNNING",
    "COMPLETED",
    "FAILED",
    "CANCELLED",
    "PREEMPTED",
    "TIMEOUT",
    "NODE_FAIL",
    "OUT_OF_MEMORY",
)
# squeue's short codes (squeue -t PD,R), as Slurm users type them.
SQUEUE_STATE_CODES = {
    "PD": "PENDING",
    "R": "RUNNING",
    "CD": "COMPLETED",
    "F": "FAILED",
    "CA": "CANCELLED",
    "PR": "PREEMPTED",
    "TO": "TIMEOUT",
    "NF": "NODE_FAIL",
    "OOM": "OUT_OF_MEMORY",
}


def parse_job_states(text: str) -> list[str]:
    """Job states as squeue -t takes them: comma-separated, any case, full names or codes (PD, R), or
    `all`. ValueError listing the states otherwise."""
    states = []
    for typed in filter(None, (t.strip() for t in text.split(","))):
        if typed.upper() == "ALL":  # squeue -t all: every state
            states.extend(JOB_STATES)
            continue
        state = SQUEUE_STATE_CODES.get(typed.upper(), typed.upper())
        if state not in JOB_STATES:
            names, codes = ", ".join(JOB_STATES), ", ".join(SQUEUE_STATE_CODES)
            raise ValueError(f"unknown state {typed!r}: choose one of {names} (or squeue's {codes}, or all)")
        states.append(state)
    if not states:
        raise ValueError("give a state, e.g. PENDING or PD")
    return states


def queue(api: Api, args: Any, out: TextIO) -> int:
    # --state may be repeated and each may hold several (squeue -t PD,R).
    wanted = [state for group in args.state or [] for state in group]
    params: dict[str, Any] = {"state": wanted or ([] if args.all else list(LIVE_STATES))}
    if args.name:
        params["name"] = args.name
    if args.team:
        params["team"] = args.team
    if args.user:
        params["owner"] = args.user
    if args.array:
        params["array_job"] = args.array
    jobs = api.jobs(params)
    if args.json:
        out.write(json.dumps(jobs, indent=2) + "\n")
        return 0
    # squeue's order: running first, then pending by queue position, then the rest, newest last.
    rank = {"RUNNING": 0, "PENDING": 1}
    jobs.sort(key=lambda j: (rank.get(j["state"], 2), j.get("queue_position") or 0, j["id"]))
    long = args.long
    rows = [QUEUE_HEADER + (QUEUE_LONG_HEADER if long else [])]
    # squeue's lines: an array's pending tasks that wait for the same reason share one (-r: not).
    runs = [[job] for job in jobs] if args.tasks or args.array else gather_array_runs(jobs)
    for run in runs:
        job = run[0]
        pending = job["state"] == "PENDING"
        start = job.get("estimated_start_at") if pending else job.get("started_at")
        last = run[-1]  # a shared line ends when its last task is estimated to
        rows.append(
            [
                array_run_id(run) if len(run) > 1 else str(job["id"]),
                job["name"][:24] if len(run) > 1 else job_name_text(job),
                job["owner"],
                job["state"],
                str(job["num_gpus"]),
                job["pending_reason"] if pending else "",
                str(job.get("queue_position") or "") if pending else "",
                when(start),
                when(
                    last.get("estimated_finish_at") if job["state"] in LIVE_STATES else job.get("finished_at")
                ),
                qos_cell(job),
            ]
            + (restart_cells(job) if long else [])
        )
    table(rows, out)
    # As of when the estimates hold, on stderr: a terminal shows it, a script reading the table does not.
    sys.stderr.write(estimates_as_of_line(jobs))
    return 0


def restart_cells(job: dict[str, Any]) -> list[str]:
    """queue --long's columns: moves, preemptions (requeues after a lost server or agent with them) and
    GPU-hours lost to restarts; "-" from a service that does not report restarts."""
    r = job.get("restarts")
    if not r:
        return ["-"] * len(QUEUE_LONG_HEADER)
    return [str(r["moves"]), str(r["preemptions"] + r["requeues"]), f"{r['gpu_s_lost'] / 3600:.2f}"]


def qos_cell(job: dict[str, Any]) -> str:
    """The queue's QOS column: the deadline (its own, or submission + maximum latency), marked `!` when
    the job's current estimate ends after it (or, finished, it ended after it); a minimum rate as
    `>=N it/s`; blank without a target."""
    cells = []
    deadline = job.get("deadline_at")
    if deadline:
        end = job.get("estimated_finish_at") if job["state"] in LIVE_STATES else job.get("finished_at")
        late = end is not None and instant(end) > instant(deadline)
        cells.append(when(deadline) + ("!" if late else ""))
    if job.get("qos_min_rate_iters_per_s"):
        cells.append(f">={job['qos_min_rate_iters_per_s']:g} it/s")
    return ", ".join(cells)
