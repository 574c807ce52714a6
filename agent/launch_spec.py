"""What one launch of a lease is: its identity, resources and command, and where its files live."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from agent.accounts import Account
from agent.host import BYTES_PER_GB
from agent.lease_resources import RESOURCES_FILE_NAME


@dataclass(frozen=True, slots=True)
class LaunchSpec:
    """Everything needed to start one lease. `cpus` are the agent's logical core ids (0..num_cpus-1).

    `account` is who the job runs as (None: the agent's own identity, no switch). `workdir` "" is the
    job directory; `stdout_path`/`stderr_path` "" mean the shim's log and "merged into stdout", relative
    ones are relative to the working directory. With `script`, the job is `bash <script file>` and
    `argv` is not used. Layout of `lease_dir`: the shim's log, status and the job's environment, root's
    alone; `job/` (the job's own, 0700: progress file, script). `job_subdir` is False only for leases
    started by an agent from before that layout (their progress file is in `lease_dir` itself).
    """

    lease_id: str
    job_id: int | None
    argv: tuple[str, ...]
    env: dict[str, str]
    gpu_uuids: tuple[str, ...]
    cpus: tuple[int, ...]
    mem_gb: float
    resume_iters: int
    lease_dir: Path
    checkpoint_path: Path
    time_scale: float = 1.0
    account: Account | None = None
    workdir: str = ""
    script: str | None = None
    stdout_path: str = ""
    stderr_path: str = ""
    job_subdir: bool = True

    @property
    def log_path(self) -> Path:
        return self.lease_dir / "output.log"

    @property
    def status_path(self) -> Path:
        return self.lease_dir / "exit-status.json"

    @property
    def renewal_path(self) -> Path:
        """The lease's last renewal (agent/fence.py), which its shim enforces."""
        return self.lease_dir / "renewal.json"

    @property
    def env_path(self) -> Path:
        return self.lease_dir / "job-env.json"

    @property
    def resources_path(self) -> Path:
        """What the job holds now (agent/lease_resources.py), rewritten when the lease is resized."""
        return self.lease_dir / RESOURCES_FILE_NAME

    @property
    def job_dir(self) -> Path:
        return self.lease_dir / "job" if self.job_subdir else self.lease_dir

    @property
    def progress_path(self) -> Path:
        return self.job_dir / "progress.json"

    @property
    def script_path(self) -> Path:
        return self.job_dir / "batch-script"

    @property
    def cwd(self) -> Path:
        return self.job_dir / self.workdir if self.workdir else self.job_dir  # an absolute workdir wins

    @property
    def stdout_file(self) -> Path | None:
        return self.cwd / self.stdout_path if self.stdout_path else None

    @property
    def stderr_file(self) -> Path | None:
        """The job's separate stderr file; None when stderr goes with stdout."""
        path = self.cwd / self.stderr_path if self.stderr_path else None
        return None if path == self.stdout_file else path

    @property
    def job_output_files(self) -> tuple[Path, ...]:
        """Files the job itself opened for its output (owned by its account)."""
        return tuple(p for p in (self.stdout_file, self.stderr_file) if p is not None)

    @property
    def job_uid(self) -> int:
        return self.account.uid if self.account is not None else os.geteuid()

    @property
    def mem_cap_bytes(self) -> int:
        return int(self.mem_gb * BYTES_PER_GB)
