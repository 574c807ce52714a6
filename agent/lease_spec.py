"""A `start` command checked and turned into the launch of a lease: what a node refuses to run, and why."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from agent.accounts import Account, JobIdentity
from agent.launch_spec import LaunchSpec
from agent.lease_profiles import SAFE_LEASE_ID
from agent.lease_state import StartError


def launch_spec_of(
    lease_id: str,
    command: dict[str, Any],
    cpus: tuple[int, ...],
    *,
    node_gpu_uuids: Sequence[str],
    work_dir: Path,
    time_scale: float,
    identity: JobIdentity,
) -> LaunchSpec:
    """The launch of a `start` command on `cpus`, every field checked: StartError (or AccountError) says
    what the service sent that this node cannot run."""
    if not SAFE_LEASE_ID.match(lease_id):
        raise StartError(f"unsafe lease id {lease_id!r}")
    script = command.get("script")
    if script is not None and not isinstance(script, str):
        raise StartError(f"script must be a string, not {type(script).__name__}")
    argv = command.get("argv") or []
    if not isinstance(argv, list) or not all(isinstance(a, str) for a in argv) or not (argv or script):
        raise StartError(f"argv must be a non-empty list of strings, not {command.get('argv')!r}")
    gpu_uuids = tuple(command.get("gpu_uuids") or [])
    unknown = [u for u in gpu_uuids if u not in node_gpu_uuids]
    if unknown:
        raise StartError(f"this node has no GPU {', '.join(unknown)}")
    mem_gb = float(command.get("mem_gb") or 0)
    if mem_gb <= 0:
        raise StartError(f"mem_gb must be positive, not {command.get('mem_gb')!r}")
    run_as = command.get("run_as") or None
    if run_as is not None and not isinstance(run_as, str):
        raise StartError(f"run_as must be an account name, not {run_as!r}")
    account = identity.account_for(run_as)  # AccountError: no such account, root, not ours
    job_id = command.get("job_id")
    lease_dir = work_dir / "leases" / lease_id
    # Per job, not per lease: a preempted job resumes from it on its next lease on this node. A
    # directory of its own, the account's alone, so that no other job can read the checkpoint.
    checkpoint_dir = f"job-{int(job_id)}" if job_id is not None else f"lease-{lease_id}"
    env = {str(k): str(v) for k, v in (command.get("env") or {}).items()}
    return LaunchSpec(
        lease_id=lease_id,
        job_id=int(job_id) if job_id is not None else None,
        argv=tuple(argv) if script is None else (),
        env=env,
        gpu_uuids=gpu_uuids,
        cpus=cpus,
        mem_gb=mem_gb,
        resume_iters=int(command.get("resume_iters") or 0),
        lease_dir=lease_dir,
        checkpoint_path=work_dir / "checkpoints" / checkpoint_dir / "checkpoint.json",
        time_scale=time_scale,
        account=account,
        workdir=_workdir(command.get("workdir"), run_as, account),
        script=script,
        stdout_path=_output_path(command, "stdout_path"),
        stderr_path=_output_path(command, "stderr_path"),
    )


def _workdir(workdir: Any, run_as: str | None, account: Account) -> str:
    """The job's working directory: as asked (relative to the home), else the account's home; for a
    catalog workload (run_as null) "" (its directory in the lease)."""
    if workdir is not None and not isinstance(workdir, str):
        raise StartError(f"workdir must be a string, not {workdir!r}")
    if not workdir:
        return account.home if run_as else ""
    return str(Path(account.home) / workdir) if run_as else workdir


def _output_path(command: dict[str, Any], key: str) -> str:
    value = command.get(key) or ""
    if not isinstance(value, str) or "\0" in value:
        raise StartError(f"{key} must be a path, not {value!r}")
    return value
