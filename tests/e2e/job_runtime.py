"""Where end-to-end jobs run: a real Unix account and a node's software for it (python, torchrun).

As root (CI), the agents run jobs as their owners' accounts, so the tests create a throwaway account
with useradd and submit as a web user of that name; catalog workloads run as a second one
(`--job-user`: agents refuse to run users' jobs as it). Not as root, the agents are in single-user mode
and jobs run as the runner itself.

A lab installs Python and the agent where every account can read them; a test box may not (a venv
built from an interpreter under /root). Then the node's "software" is a directory of wrappers on the
jobs' PATH that run a system interpreter of the same version with the venv's packages, and the agents
get `--workload-python` for the shipped workloads. Where even that cannot work, the tests skip saying why.
"""

from __future__ import annotations

import getpass
import os
import secrets
import shutil
import stat
import subprocess
import sys
import sysconfig
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
SYSTEM_PYTHONS = ("/usr/bin/python3", "/usr/local/bin/python3")
JOB_PATH_TAIL = "/usr/local/bin:/usr/bin:/bin"


@dataclass
class JobRuntime:
    """The account e2e jobs run as and the agent options that make the node's software reachable."""

    account: str
    bin_dir: Path
    agent_args: list[str] = field(default_factory=list)
    created_account: bool = False

    def make_shared_dir(self, prefix: str) -> Path:
        """A working directory owned by the job account (a shared filesystem's project directory)."""
        path = Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))
        if self.created_account:
            shutil.chown(path, self.account, self.account)
        return path

    def give(self, path: Path) -> None:
        if self.created_account:
            shutil.chown(path, self.account, self.account)


def reachable_by_others(path: Path) -> bool:
    """Whether any account can search every directory above `path` and read it."""
    path = path.resolve()
    if not all(os.stat(p).st_mode & stat.S_IXOTH for p in path.parents):
        return False
    return bool(os.stat(path).st_mode & stat.S_IROTH)


def _same_version_system_python() -> str | None:
    for candidate in SYSTEM_PYTHONS:
        if not os.access(candidate, os.X_OK) or not reachable_by_others(Path(candidate)):
            continue
        out = subprocess.run(
            [candidate, "-c", "import sys; print(sys.version_info[:2])"], capture_output=True, text=True
        )
        if out.stdout.strip() == str(sys.version_info[:2]):
            return candidate
    return None


def _write_wrapper(path: Path, body: str) -> None:
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(0o755)


def _software_dir(interpreter: str, *, with_packages: bool) -> Path:
    """python3 / python / torchrun wrappers, readable by every account."""
    bin_dir = Path(tempfile.mkdtemp(prefix="attune-e2e-bin-", dir="/tmp"))
    bin_dir.chmod(0o755)
    packages = sysconfig.get_paths()["purelib"]
    env = f'PYTHONPATH="{packages}${{PYTHONPATH:+:$PYTHONPATH}}" ' if with_packages else ""
    _write_wrapper(bin_dir / "python3", f'{env}exec "{interpreter}" "$@"')
    _write_wrapper(bin_dir / "python", f'exec "{bin_dir}/python3" "$@"')
    _write_wrapper(bin_dir / "torchrun", f'exec "{bin_dir}/python3" -m torch.distributed.run "$@"')
    return bin_dir


def job_runtime() -> Iterator[JobRuntime]:
    """Generator for a session fixture: the account, the software directory, the agent options."""
    if not reachable_by_others(REPO_ROOT / "agent" / "workload.py"):
        pytest.skip(f"{REPO_ROOT} is not readable by other accounts: jobs could not run the agent's code")
    root = os.geteuid() == 0
    interpreter = str(Path(sys.executable).resolve())
    foreign = root and not reachable_by_others(Path(interpreter))
    if foreign:
        system = _same_version_system_python()
        if system is None:
            pytest.skip(f"{interpreter} is not reachable by other accounts and no system python matches it")
        if not reachable_by_others(Path(sysconfig.get_paths()["purelib"]) / "django"):
            pytest.skip("the virtualenv's packages are not readable by other accounts")
        interpreter = system
    bin_dir = _software_dir(interpreter, with_packages=foreign)
    agent_args = ["--job-path", f"{bin_dir}:{JOB_PATH_TAIL}", "--address", "127.0.0.1"]
    if foreign:
        agent_args += ["--workload-python", interpreter]
    name = getpass.getuser()
    created: list[str] = []
    if root:
        if shutil.which("useradd") is None:
            pytest.skip("running jobs as their owners needs useradd, which is not installed")
        suffix = secrets.token_hex(3)
        name, catalog = f"attune_e2e_{suffix}", f"attune_e2c_{suffix}"
        for account in (name, catalog):
            subprocess.run(["useradd", "-m", "-s", "/bin/bash", account], check=True, capture_output=True)
            created.append(account)
        agent_args += ["--job-user", catalog]
    try:
        yield JobRuntime(account=name, bin_dir=bin_dir, agent_args=agent_args, created_account=bool(created))
    finally:
        shutil.rmtree(bin_dir, ignore_errors=True)
        for account in created:
            subprocess.run(["userdel", "-r", account], capture_output=True)
