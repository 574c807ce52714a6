"""The command line and the agent as a lab installs them: wheels built from this repository, each in a
fresh virtual environment outside it (the CLI's without Django), an `attune-agent` node against a live
service, and a user's `attune` typed in a project directory: submit, watch, log, cancel.

The wheels are built as `make dist` builds them (packaging/), from a copy of the sources in a temporary
directory so that the checkout is left as it was; pip fetches their dependencies from the package index
(its cache makes a second run fast).
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from io import StringIO
from pathlib import Path

import pytest
from django.core.management import call_command

from scheduler_app.models import Job, JobState
from tests.e2e.processes import stop_tree, wait_until
from tests.factories import UserFactory

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(420)]

REPO_ROOT = Path(__file__).resolve().parents[2]
PASSWORD = "correct horse battery staple"
# What a program started on a node or a laptop must not inherit from this test process.
SERVICE_ENV = ("DJANGO_SETTINGS_MODULE", "DATABASE_URL", "PYTHONPATH", "VIRTUAL_ENV")
# pip's words when the index cannot be reached at all (not a dependency that does not resolve).
OFFLINE_SIGNS = ("NewConnectionError", "Temporary failure in name resolution", "Network is unreachable")


def build_wheels(into: Path) -> dict[str, Path]:
    """Both wheels, built as `make dist` does (pip wheel --no-build-isolation), from a copy of the
    sources: packaging/<name>/pyproject.toml takes ../../<package>."""
    src = into / "src"
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "build", "*.egg-info")
    for part in ("packaging", "cli", "agent"):
        shutil.copytree(REPO_ROOT / part, src / part, ignore=ignore)
    wheels = into / "wheels"
    subprocess.run(
        [
            *(sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation"),
            *("--wheel-dir", str(wheels), str(src / "packaging" / "cli"), str(src / "packaging" / "agent")),
        ],
        check=True,
        capture_output=True,
        text=True,
    )
    return {name: next(wheels.glob(f"attune_{name}-*.whl")) for name in ("cli", "agent")}


def make_venv(path: Path, wheel: Path) -> Path:
    """A fresh virtual environment with `wheel` and its dependencies (from the index); its bin/."""
    env = {k: v for k, v in os.environ.items() if k not in SERVICE_ENV}
    subprocess.run([sys.executable, "-m", "venv", str(path)], check=True, capture_output=True, env=env)
    result = subprocess.run(
        [
            str(path / "bin" / "python"),
            "-m",
            "pip",
            "install",
            "-q",
            "--disable-pip-version-check",
            str(wheel),
        ],
        capture_output=True,
        text=True,
        env=env,
    )
    output = result.stdout + result.stderr
    if result.returncode != 0 and any(sign in output for sign in OFFLINE_SIGNS):
        pytest.skip(f"pip cannot reach the package index for the wheels' dependencies: {output[-300:]}")
    assert result.returncode == 0, output
    return path / "bin"


@pytest.fixture(scope="module")
def installed() -> Iterator[dict[str, Path]]:
    """The bin/ directories of the two environments (cli, agent), under a directory others can read."""
    root = Path(tempfile.mkdtemp(prefix="attune-installed-", dir="/tmp"))
    root.chmod(0o755)
    try:
        wheels = build_wheels(root)
        with ThreadPoolExecutor(2) as pool:  # two pip installs side by side
            bins = dict(
                zip(
                    ("cli", "agent"),
                    pool.map(lambda name: make_venv(root / f"{name}-venv", wheels[name]), ("cli", "agent")),
                    strict=True,
                )
            )
        yield bins
    finally:
        shutil.rmtree(root, ignore_errors=True)


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in SERVICE_ENV and not k.startswith("ATTUNE_")}
    return {**env, **extra}


def test_the_installed_programs_explain_themselves_and_the_cli_runs_without_django(installed, tmp_path):
    env = clean_env()
    for program in (installed["cli"] / "attune", installed["agent"] / "attune-agent"):
        result = subprocess.run(
            [str(program), "--help"], cwd=tmp_path, env=env, capture_output=True, text=True
        )
        assert result.returncode == 0, result.stderr
        assert result.stdout.startswith(f"usage: {program.name} "), result.stdout[:200]
    result = subprocess.run(
        [str(installed["cli"] / "attune"), "submit", "--help"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
    )
    assert "attune submit train.sh" in result.stdout and "python -m cli" not in result.stdout
    # Django, the service and the repository are nowhere in the CLI's environment: its `cli` is the wheel's.
    probe = (
        "import importlib.util as u, cli\n"
        "print(u.find_spec('django'), u.find_spec('scheduler_app'), u.find_spec('agent'), cli.__file__)"
    )
    result = subprocess.run(
        [str(installed["cli"] / "python"), "-c", probe], cwd=tmp_path, env=env, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr
    django, service, agent, cli_file = result.stdout.split()
    assert (django, service, agent) == ("None", "None", "None")
    assert cli_file.startswith(str(installed["cli"].parent)) and "site-packages" in cli_file
    # The agent's environment has its unit and token file, and the unit stops the agent alone.
    share = installed["agent"].parent / "share" / "attune-agent"
    unit = (share / "attune-agent.service").read_text()
    assert "KillMode=process" in unit and "EnvironmentFile=/etc/attune/agent.env" in unit
    assert re.search(r"^ExecStart=\S+/bin/attune-agent --server \$\{ATTUNE_SERVER\}", unit, re.M)
    assert "ATTUNE_AGENT_TOKEN=" in (share / "attune-agent.env").read_text()
    for program, version in (("attune", "attune 0.1.0"), ("attune-agent", "attune-agent 1.0.0")):
        result = subprocess.run(
            [str(installed["cli" if program == "attune" else "agent"] / program), "--version"],
            env=env,
            capture_output=True,
            text=True,
        )
        assert result.stdout.strip() == version


def test_systemd_accepts_the_agents_unit_as_installed(installed, tmp_path):
    """systemd's own checker on the unit, its ExecStart pointed at the environment just installed."""
    if shutil.which("systemd-analyze") is None:
        pytest.skip("systemd-analyze is not installed")
    share = installed["agent"].parent / "share" / "attune-agent"
    unit = (share / "attune-agent.service").read_text()
    assert "/opt/attune-agent/bin/attune-agent" in unit
    path = tmp_path / "attune-agent.service"
    path.write_text(unit.replace("/opt/attune-agent/bin", str(installed["agent"])))
    result = subprocess.run(["systemd-analyze", "verify", str(path)], capture_output=True, text=True)
    assert result.returncode == 0 and not result.stderr.strip(), result.stderr
    # A unit it refuses is refused: the check is not vacuous.
    path.write_text(unit)
    result = subprocess.run(["systemd-analyze", "verify", str(path)], capture_output=True, text=True)
    assert "is not executable" in result.stderr


def test_an_installed_agent_runs_the_jobs_a_user_submits_watches_and_cancels_with_the_installed_cli(
    installed, worker, live_server, job_runtime, tmp_path
):
    started = time.monotonic()
    out = StringIO()
    call_command(
        "node_token", "pkg1", "--gpus", "2", "--cpus", "4", "--mem-gb", "16", stdout=out, stderr=StringIO()
    )
    agent_dir = Path(tempfile.mkdtemp(prefix="attune-installed-agent-", dir="/tmp"))
    agent_dir.chmod(0o711)  # jobs of another account reach their lease files below it
    log_path = tmp_path / "agent.log"
    with log_path.open("w") as log:
        agent = subprocess.Popen(
            [
                str(installed["agent"] / "attune-agent"),
                "--server",
                live_server.url,
                "--name",
                "pkg1",
                "--fake-gpus",
                "2",
                "--fake-cpus",
                "4",
                "--fake-mem-gb",
                "16",
                "--time-scale",
                "0.02",
                "--spool-dir",
                str(agent_dir / "spool"),
                "--work-dir",
                str(agent_dir / "work"),
                "--isolation",
                "affinity+rlimit",
                *job_runtime.agent_args,
            ],
            cwd=agent_dir,
            env=clean_env(ATTUNE_AGENT_TOKEN=out.getvalue().strip()),
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    # A researcher in a project directory of their own, far from the repository.
    project = job_runtime.make_shared_dir("attune-project-")
    user = UserFactory(username=job_runtime.account)  # own commands run as the owner's Unix account
    user.set_password(PASSWORD)
    user.save()
    cli_env = clean_env(
        ATTUNE_PASSWORD=PASSWORD, ATTUNE_TOKEN_FILE=str(tmp_path / "token"), HOME=str(tmp_path)
    )

    def attune(*argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        result = subprocess.run(
            [str(installed["cli"] / "attune"), *argv],
            cwd=project,
            env=cli_env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        if check:
            assert result.returncode == 0, (
                f"attune {argv}: {result.stdout}{result.stderr}\n{log_path.read_text()[-2000:]}"
            )
        return result

    try:
        assert (
            "Logged in"
            in attune("--server", live_server.url, "login", "--username", job_runtime.account).stdout
        )
        wait_until(
            lambda: re.search(r"^pkg1\s+IDLE\b", attune("nodes").stdout, re.M) is not None,
            timeout_s=60,
            what=f"the installed agent to register\n{log_path.read_text()[-2000:]}",
        )

        # sbatch --wait: the job runs on the agent's node, in this directory, and its output comes back.
        done = attune(
            "submit", "-J", "hello", "--command", 'echo "hello from $SLURM_JOB_ID in $PWD"', "--gpus", "1",
            "-t", "5m", "--wait", "--poll-s", "0.5",
        )  # fmt: skip
        job_id = int(re.search(r"^Submitted job (\d+)$", done.stdout, re.M).group(1))
        assert re.search(rf"job {job_id}: COMPLETED", done.stdout), done.stdout
        assert attune("log", str(job_id)).stdout == f"hello from {job_id} in {project}\n"
        shown = attune("show", str(job_id)).stdout
        assert re.search(r"^State +COMPLETED$", shown, re.M) and re.search(r"^Exit code +0$", shown, re.M)
        assert re.search(rf"^Working directory +{re.escape(str(project))}$", shown, re.M), shown
        assert re.search(r"^Nodes +pkg1$", shown, re.M), shown

        # A long one: watched until it runs, cancelled, and `wait` reports how it ended.
        long = attune("submit", "-J", "long", "--command", "sleep 600", "--gpus", "1", "-t", "30m").stdout
        long_id = int(re.search(r"^Submitted job (\d+)$", long, re.M).group(1))
        wait_until(
            lambda: re.search(r"^State +RUNNING$", attune("show", str(long_id)).stdout, re.M) is not None,
            timeout_s=60,
            what="the long job to start",
        )
        queue = attune("queue").stdout
        assert re.search(rf"^{long_id}\s+long\s+{job_runtime.account}\s+RUNNING\s+1\b", queue, re.M), queue
        assert attune("cancel", str(long_id)).stdout == f"job {long_id}: CANCELLED\n"
        waited = attune("wait", str(long_id), "--poll-s", "0.5", check=False)
        assert waited.returncode == 1 and f"job {long_id}: CANCELLED" in waited.stdout
        acct = attune("acct", "--jobs").stdout
        assert re.search(rf"^{job_id}\s+hello\s+COMPLETED\s+0\b", acct, re.M), acct
        assert re.search(rf"^{long_id}\s+long\s+CANCELLED\b", acct, re.M), acct
        assert Job.objects.get(pk=long_id).state == JobState.CANCELLED
        # The agent stops the job's processes: its lease ends.
        wait_until(
            lambda: not Job.objects.get(pk=long_id).allocations.filter(ended_at__isnull=True).exists(),
            timeout_s=30,
            what="the cancelled job's lease to end",
        )
        assert agent.poll() is None, log_path.read_text()[-3000:]
    finally:
        stop_tree(agent, signal.SIGTERM, wait_s=15)
        shutil.rmtree(agent_dir, ignore_errors=True)
        shutil.rmtree(project, ignore_errors=True)
    print(f"installed-packages e2e: {time.monotonic() - started:.1f} s after the install")
