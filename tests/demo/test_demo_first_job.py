"""`make demo` as root, then the README's first own command as the demo's admin: it runs to COMPLETED."""

from __future__ import annotations

import os
import pwd
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

import pytest

from agent.agent import AgentConfig
from agent.cli import exit_watchdog_s

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
README_PORT = "9100"

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(os.geteuid() != 0, reason="the demo's own-command set-up as root needs root"),
    pytest.mark.skipif(shutil.which("useradd") is None, reason="no useradd to create the demo's account"),
]


def readme_block(containing: str) -> list[str]:
    """The commands of README.md's first ```sh block that contains `containing`."""
    for block in re.findall(r"```sh\n(.*?)```", README.read_text(), re.S):
        if containing in block:
            return [line.split("  #")[0].strip() for line in block.splitlines() if line.strip()]
    raise AssertionError(f"README.md has no sh block with {containing!r}")


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def demo_env(tmp: Path) -> dict[str, str]:
    """As `make demo` runs it (DEBUG=1, embedded: SQLite, rounds in process), on a database of its own."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ATTUNE_", "DJANGO_"))}
    env.update(DEBUG="1", DATABASE_URL=f"sqlite:///{tmp / 'demo.sqlite3'}", ATTUNE_INLINE_ROUNDS="1")
    return env


def wait_for_line(path: Path, text: str, proc: subprocess.Popen, timeout_s: float) -> str:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        out = path.read_text(errors="replace")
        if text in out:
            return out
        assert proc.poll() is None, f"the demo exited ({proc.returncode}):\n{out[-3000:]}"
        time.sleep(0.5)
    raise AssertionError(f"no {text!r} after {timeout_s:.0f} s:\n{path.read_text()[-3000:]}")


@pytest.fixture
def agent_dir():
    """The agents' spools and work directories where every account can reach its jobs' files (pytest's
    tmp_path lies in a directory only root may enter), as var/agent/ in a checkout others can read."""
    base = Path(tempfile.mkdtemp(prefix="attune-demo-test-", dir="/tmp"))
    base.chmod(0o711)
    yield base / "agent"
    shutil.rmtree(base, ignore_errors=True)


@pytest.fixture
def demo(tmp_path: Path, agent_dir: Path):
    """`make demo PORT=...`'s two commands on a free port; yields (port, its output file, its process)."""
    env = demo_env(tmp_path)
    migrate = [sys.executable, "manage.py", "migrate", "--noinput", "--verbosity", "0"]
    subprocess.run(migrate, cwd=ROOT, env=env, check=True, timeout=300)
    port = free_port()
    out = tmp_path / "demo.out"
    argv = [sys.executable, "manage.py", "demo", "--addr", f"127.0.0.1:{port}", "--round-s", "2"]
    argv += ["--agent-dir", str(agent_dir), "--submit-every-s", "3600"]
    with out.open("w") as log:
        proc = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        yield port, out, proc
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()


def test_the_readmes_first_own_command_runs_to_completed_as_root(demo, tmp_path: Path):
    port, out, proc = demo
    text = wait_for_line(out, "demo ready", proc, timeout_s=120)
    # It says which account own commands run as, and that account exists with its home.
    said = re.search(r"own commands and scripts of the demo users run as (\S+) .*by default in (\S+);", text)
    assert said, text
    account = pwd.getpwnam(said.group(1))
    assert account.pw_uid >= 1000 and Path(said.group(2)).is_dir()
    # Quiet: "demo ready" is the last line (the start-up banner before it), and no traceback.
    assert text.rstrip().splitlines()[-1].startswith("demo ready"), text[-2000:]

    commands = readme_block("attune submit")
    assert commands[0].startswith(".venv/bin/attune --server http://127.0.0.1:9100 login")
    # The attune of this interpreter's environment (make venv installs it), else the module itself.
    attune = Path(sys.executable).parent / "attune"
    attune_command = str(attune) if attune.is_file() else f"{sys.executable} -m cli"
    env = {**os.environ, "HOME": str(tmp_path / "home"), "ATTUNE_PASSWORD": "admin"}
    env.pop("ATTUNE_SERVER", None)
    (tmp_path / "home").mkdir()
    ran = []
    for command in commands:
        # This environment's for .venv's (the test may run from another one), the free port for 9100.
        line = command.replace(".venv/bin/attune", attune_command).replace(README_PORT, str(port))
        done = subprocess.run(
            ["bash", "-c", line], cwd=ROOT, env=env, capture_output=True, text=True, timeout=180
        )
        ran.append(f"$ {command}\n{done.stdout}{done.stderr}")
        assert done.returncode == 0, "\n".join(ran) + "\n" + out.read_text()[-3000:]
    transcript = "\n".join(ran)
    assert "COMPLETED" in transcript, transcript
    job_id = re.search(r"job (\d+)", transcript).group(1)
    log = subprocess.run(
        [sys.executable, "-m", "cli", "log", job_id], cwd=ROOT, env=env, capture_output=True, text=True
    )
    assert f"hello from {account.pw_name} in /tmp" in log.stdout, log.stdout + log.stderr
    assert "Traceback" not in out.read_text(), out.read_text()[-3000:]


def test_a_taken_port_stops_the_demo_before_any_agent_starts(tmp_path: Path):
    env = demo_env(tmp_path)
    subprocess.run(
        [sys.executable, "manage.py", "migrate", "--noinput", "--verbosity", "0"],
        cwd=ROOT,
        env=env,
        check=True,
    )
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        argv = [sys.executable, "manage.py", "demo", "--addr", f"127.0.0.1:{port}"]
        argv += ["--agent-dir", str(tmp_path / "agent")]
        done = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode != 0
    assert f"cannot listen on 127.0.0.1:{port}" in done.stderr and "PORT=" in done.stderr
    assert not (tmp_path / "agent").exists()  # no agent was started


def agent_pids(agent_dir: Path) -> set[int]:
    """The running agents whose spools lie under `agent_dir` (from /proc/*/cmdline)."""
    found = set()
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                cmdline = (proc / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if b"agent" in cmdline and any(str(agent_dir).encode() in part for part in cmdline):
                found.add(int(proc.name))
    return found


def test_agents_never_outlive_their_demo(demo, tmp_path: Path, agent_dir: Path):
    """A second demo whose agents cannot start (the first one's hold their spools) stops and says why,
    leaving nothing running; the first demo killed outright (SIGKILL, no clean-up) takes its agents."""
    _port, out, proc = demo
    wait_for_line(out, "demo ready", proc, timeout_s=120)
    first_agents = agent_pids(agent_dir)
    assert len(first_agents) == 3, first_agents

    argv = [sys.executable, "manage.py", "demo", "--addr", f"127.0.0.1:{free_port()}"]
    argv += ["--agent-dir", str(agent_dir), "--submit-every-s", "3600"]
    try:
        second = subprocess.run(
            argv, cwd=ROOT, env=demo_env(tmp_path), capture_output=True, text=True, timeout=120
        )
    except subprocess.TimeoutExpired as exc:
        raise AssertionError(f"the second demo ran on:\n{(exc.stderr or b'')[-3000:].decode()}") from exc
    assert second.returncode != 0
    assert re.search(r"demo: agent gpu0\d exited", second.stderr), second.stderr[-3000:]
    assert "another agent is using the spool" in second.stderr
    assert "the demo stopped with it" in second.stderr
    assert agent_pids(agent_dir) == first_agents  # the second demo's agents are gone, the first's run

    proc.kill()
    proc.wait(timeout=10)
    # A clean stop takes a second or two; a stuck one ends at the agent's exit watchdog, whose stack
    # dump is the only trace of what held it (CI shows it in the warnings summary).
    deadline = time.monotonic() + exit_watchdog_s(AgentConfig(server_url="", token="")) + 10
    while agent_pids(agent_dir) and time.monotonic() < deadline:
        time.sleep(0.5)
    logs = {path.parent.name: path.read_text() for path in agent_dir.glob("*/agent.log")}
    assert not agent_pids(agent_dir), f"agents outlived their demo:\n{logs}"
    for name, text in logs.items():
        if "Timeout (" in text:
            warnings.warn(f"agent {name} stopped only at its exit watchdog:\n{text[-6000:]}", stacklevel=1)
