"""`acct --jobs`: one's jobs one per line, as sacct lists them (state, exit code, elapsed, GPUs, nodes)."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any, TextIO

from cli.api import Api, CliError
from cli.commands import job_name_text
from cli.durations import parse_duration_s, parse_moment
from cli.output import clock, instant, table, when
from cli.show import elapsed_s

HEADER = ["JOBID", "NAME", "STATE", "EXIT", "ELAPSED", "GPUS", "NODES", "SUBMITTED", "END", "USER"]


def since_time(text: str, *, now: datetime | None = None) -> datetime:
    """--since: a date and time (2026-05-01, 2026-05-01T09:00, today, 09:00: the last one; local
    time), or how long ago (7d, 12h)."""
    try:
        return parse_moment(text, now=now, ahead=False)
    except ValueError:
        pass
    try:
        ago = parse_duration_s(text, option="--since", leave_out="leave --since out")
    except ValueError:
        raise CliError(
            f"--since takes a date (2026-05-01, 2026-05-01T09:00, today) or how long ago (7d, 12h): {text!r}",
            exit_code=2,
        ) from None
    return (now or datetime.now(UTC)) - timedelta(seconds=ago)


def acct_jobs(api: Api, args: Any, out: TextIO) -> int:
    """Your jobs (another user's with -u: staff see everyone's), oldest first, with --state and --since."""
    params: dict[str, Any] = {"owner": args.user} if args.user else {"mine": "true"}
    states = [state for group in args.state or [] for state in group]
    if states:
        params["state"] = states
    jobs = api.jobs(params)
    if args.since:
        since = since_time(args.since)
        jobs = [j for j in jobs if instant(j.get("finished_at") or j["submitted_at"]) >= since]
    jobs.sort(key=lambda j: j["id"])
    if args.json:
        out.write(json.dumps(jobs, indent=2) + "\n")
        return 0
    rows = [HEADER]
    for job in jobs:
        elapsed = elapsed_s(job)
        code = job.get("exit_code")
        rows.append(
            [
                str(job["id"]),
                job_name_text(job),
                job["state"],
                "-" if code is None else str(code),
                "-" if elapsed is None else clock(elapsed),
                str(job["num_gpus"]),
                ",".join(job.get("nodes") or []) or "-",
                when(job["submitted_at"]),
                when(job.get("finished_at")),
                job["owner"],
            ]
        )
    table(rows, out)
    return 0
