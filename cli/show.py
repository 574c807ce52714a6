"""One job in full, as `scontrol show job` prints it, and its output (`log`)."""

from __future__ import annotations

import json
import posixpath
from datetime import UTC, datetime
from typing import Any, TextIO

from cli.api import Api, CliError
from cli.commands import LIVE_STATES, job_name_text
from cli.output import as_of, clock, instant, when
from cli.waiting import end_reason


def restarts_text(restarts: dict[str, Any] | None) -> str:
    """show's Restarts line: how often the job was moved, preempted, requeued or resized in place, and
    the GPU time lost to restarts (start-ups after the first and work done again)."""
    if not restarts:
        return "-"
    if not restarts["restarts"] and not restarts["resizes"]:
        return "none"
    text = (
        f"moved {restarts['moves']}x, preempted {restarts['preemptions']}x, requeued {restarts['requeues']}x"
    )
    if restarts["resizes"]:
        text += f", resized in place {restarts['resizes']}x"
    return text + f"; {restarts['gpu_s_lost'] / 3600:.2f} GPU-hours lost to restarts"


def qos_target_text(job: dict[str, Any]) -> str:
    """A job's QoS target in words: a deadline, a latency or a minimum rate; "-" without one."""
    if job.get("qos_deadline_at"):
        return f"finish by {when(job['qos_deadline_at'])}"
    if job.get("qos_max_latency_s"):
        return f"finish within {job['qos_max_latency_s']:g} s of submission"
    if job.get("qos_min_rate_iters_per_s"):
        return f"at least {job['qos_min_rate_iters_per_s']:g} iterations/s while running"
    return "-"


def _progress(job: dict[str, Any]) -> str:
    if job.get("total_iters") is None:  # an own command without --iters: its time limit is its length
        return f"{job['done_iters']} iterations"
    return f"{job['done_iters']} of {job['total_iters']} iterations"


def elapsed_s(job: dict[str, Any], *, now: datetime | None = None) -> float | None:
    """From its first start to its end (or now, while it runs), as sacct's Elapsed; None if it never ran."""
    if not job.get("started_at"):
        return None
    end = instant(job["finished_at"]) if job.get("finished_at") else now or datetime.now(UTC)
    return max(0.0, (end - instant(job["started_at"])).total_seconds())


def _where(job: dict[str, Any], path: str) -> str:
    """An output file as the node sees it: relative paths are in the working directory."""
    work_dir = job.get("work_dir") or ""
    return posixpath.join(work_dir, path) if work_dir and not path.startswith("/") else path


def _files(job: dict[str, Any]) -> list[tuple[str, str]]:
    """Working directory, output and error lines; what another user's job does not show, said so."""
    if job.get("details_hidden"):
        hidden = "(another user's job: shown to its owner and staff)"
        return [("Working directory", hidden), ("Output", hidden)]
    if job.get("workload") and not job.get("command") and not job.get("script"):
        return [("Working directory", "-"), ("Output", "the service's log (`log`)")]
    stdout = job.get("stdout_file") or ""
    stderr = job.get("stderr_file") or ""
    on_nodes = " (one file per node)" if len(job.get("nodes") or []) > 1 else ""
    return [
        ("Working directory", job.get("work_dir") or "(the account's home on the node)"),
        ("Output", (_where(job, stdout) + on_nodes) if stdout else "-"),
        ("Error", _where(job, stderr) if stderr else "(with the output)"),
    ]


def show(api: Api, job_id: int, *, as_json: bool, out: TextIO) -> int:
    job = api.job(job_id)
    if as_json:
        out.write(json.dumps(job, indent=2) + "\n")
        return 0
    what = job["workload"] or (f"command: {job['command']}" if job.get("command") else "script")
    exit_code = job.get("exit_code")
    elapsed = elapsed_s(job)
    limit = job.get("time_limit_s")
    facts = [
        ("Job", f"{job['id']} {job_name_text(job)} ({what})"),
        ("Owner", job["owner"] + (f", team {job['team']}" if job.get("team") else "")),
        ("State", job["state"] + (f" ({job['pending_reason']})" if job["state"] == "PENDING" else "")),
    ]
    if end_reason(job):
        facts.append(("Reason", end_reason(job)))
    facts += [
        ("Exit code", "-" if exit_code is None else str(exit_code)),
        (
            "GPUs",
            str(job["num_gpus"])
            + (f" on {job['num_nodes']} nodes" if (job.get("num_nodes") or 1) > 1 else ""),
        ),
        ("Nodes", ",".join(job.get("nodes") or []) or "-"),
        ("Progress", _progress(job)),
        ("QoS", qos_target_text(job)),
        ("After jobs", ", ".join(map(str, job.get("depends_on") or [])) or "-"),
    ]
    if job.get("array_job") is not None:
        array, index, at_once = job["array_job"], job["array_task_id"], job.get("array_task_limit")
        facts.append(
            (
                "Array",
                f"{array}_{index}: task {index} of array {array}"
                + (f", at most {at_once} tasks at once" if at_once else ""),
            )
        )
    facts += [
        ("Submitted", when(job["submitted_at"])),
        ("Started", when(job.get("started_at"))),
        ("Finished", when(job.get("finished_at"))),
        ("Elapsed", "-" if elapsed is None else clock(elapsed)),
        ("Time limit", clock(limit) if limit else "none"),
        *_files(job),
        ("Restarts", restarts_text(job.get("restarts"))),
    ]
    # The current estimate (the one the queue and the pages show), then what was predicted at submission.
    if job["state"] == "PENDING":
        facts.append(("Estimated start", when(job.get("estimated_start_at"))))
    if job["state"] in LIVE_STATES:
        detail = f" ({job['estimate_detail']})" if job.get("estimate_detail") else ""
        facts.append(("Estimated finish", when(job.get("estimated_finish_at")) + detail))
        if job.get("estimate_as_of"):  # as of when it holds (scontrol's LastSchedEval)
            facts.append(("Estimate as of", as_of(job["estimate_as_of"])))
    facts += _admission_facts(job.get("admission") or {})
    for lease in job.get("allocations") or []:
        if lease.get("ended_at") is None:
            gpus = ",".join(map(str, lease["gpu_indices"]))
            facts.append(
                ("Lease", f"{lease['server']} GPUs {gpus}, {lease['num_cpus']} cores, {lease['mem_gb']:g} GB")
            )
    width = max(len(label) for label, _ in facts)
    for label, value in facts:
        out.write(f"{label.ljust(width)}  {value}\n")
    return 0


def _admission_facts(admission: dict[str, Any]) -> list[tuple[str, str]]:
    """What was predicted at submission, and the verdicts on it."""
    if not admission:
        return []
    facts = [
        (
            "Predicted at submission",
            f"start {when(admission.get('predicted_start_at'))}, "
            f"finish {when(admission.get('predicted_finish_at'))}",
        )
    ]
    if admission.get("attainable") is False:
        risk = (
            f"AT RISK: predicted to finish after {when(admission.get('deadline_at'))}"
            if admission.get("deadline_at")
            else "AT RISK: predicted to run below its minimum rate on average"
        )
        facts.append(("QoS target", risk))
    if admission.get("met_min_rate") is not None:
        verdict = "met" if admission["met_min_rate"] else "MISSED"
        facts.append(
            ("Measured rate", f"{admission['measured_iters_per_s']:.3g} iterations/s: minimum rate {verdict}")
        )
    return facts


def log(api: Api, job_id: int, out: TextIO) -> int:
    """The last lines of the job's output; another user's job says whose it is instead of nothing."""
    job = api.job(job_id)
    if job.get("details_hidden"):
        raise CliError(f"job {job_id} is {job['owner']}'s: its output is shown to its owner and staff only")
    for line in job.get("log_tail") or []:
        out.write(line + "\n")
    return 0
