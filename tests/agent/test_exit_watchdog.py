"""The agent's exit watchdog: a stop stuck past its bound dumps every thread's stack and ends the process."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from agent.agent import STOP_POLL_S, AgentConfig
from agent.cli import EXIT_WATCHDOG_MARGIN_S, exit_watchdog_s

ROOT = Path(__file__).resolve().parents[2]

# A process whose main thread waits forever on a lock that a helper thread holds (what a shutdown
# stuck behind the supervisor's lock looks like), with the watchdog armed as the agent's SIGTERM does.
STUCK = textwrap.dedent(
    """
    import threading, time
    from agent import cli
    from agent.agent import AgentConfig

    cli.EXIT_WATCHDOG_MARGIN_S = 0.5
    held = threading.Lock()

    def holds_the_lock_forever():
        held.acquire()
        time.sleep(3600)

    threading.Thread(target=holds_the_lock_forever, daemon=True).start()
    time.sleep(0.2)
    cli.arm_exit_watchdog(AgentConfig(server_url="", token="", exit_grace_s=0.5, http_timeout_s=0.5))
    print("armed", flush=True)
    held.acquire()
    print("never here", flush=True)
    """
)


def test_a_stuck_stop_ends_the_process_with_every_threads_stack():
    started_s = time.monotonic()
    done = subprocess.run([sys.executable, "-c", STUCK], cwd=ROOT, capture_output=True, text=True, timeout=60)
    took_s = time.monotonic() - started_s
    assert done.stdout == "armed\n"
    assert done.returncode == 1
    assert took_s < 30
    assert "Timeout (0:00:01.500000)!" in done.stderr, done.stderr
    assert "holds_the_lock_forever" in done.stderr  # the helper thread's stack
    assert "<module>" in done.stderr  # the main thread's, stuck on the lock


def test_the_bound_covers_a_clean_shutdown():
    """A clean shutdown waits the leases' grace, then one HTTP call: the watchdog leaves both room."""
    config = AgentConfig(server_url="", token="")
    bound_s = exit_watchdog_s(config)
    assert bound_s == config.exit_grace_s + config.http_timeout_s + EXIT_WATCHDOG_MARGIN_S
    assert bound_s > config.exit_grace_s + config.http_timeout_s + 2 * 5.0 + 5.0  # two joins, stop_all's wait


def test_a_real_agent_stops_on_sigterm_and_says_how_long_it_may_take(tmp_path: Path):
    """The agent's own signal handler: the stop first, then the watchdog armed and the line that says
    so; an agent with no service to reach (its registration retrying) exits 0 at once."""
    argv = [sys.executable, "-m", "agent", "--server", "http://127.0.0.1:1", "--name", "watchdog-test"]
    argv += ["--fake-gpus", "1", "--spool-dir", str(tmp_path / "spool"), "--work-dir", str(tmp_path / "work")]
    env = {**os.environ, "ATTUNE_AGENT_TOKEN": "not-a-real-token"}
    log_path = tmp_path / "agent.log"
    with log_path.open("w") as log:
        proc = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 60
        while "register failed" not in log_path.read_text() and time.monotonic() < deadline:
            assert proc.poll() is None, log_path.read_text()
            time.sleep(0.1)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=20) == 0, log_path.read_text()
    finally:
        proc.kill()
    text = log_path.read_text()
    bound_s = exit_watchdog_s(AgentConfig(server_url="", token=""))
    assert f"SIGTERM received: stopping (not stopped in {bound_s:.0f} s" in text
    assert "Timeout (" not in text  # the watchdog did not fire


# The agent's handler run while the interrupted frame holds the stop event's Condition lock: where
# Event.wait is between its bytecodes, or where an outer handler's Event.set() was re-entered. The
# handler that called Event.set() blocked there for ever (the lock is a plain Lock of this thread).
HANDLER_UNDER_THE_EVENTS_LOCK = textwrap.dedent(
    """
    import faulthandler, signal, sys
    from pathlib import Path
    from agent.agent import Agent, AgentConfig
    from agent.cli import stop_on_signal
    from agent.gpus import FakeGpuBackend
    from agent.host import HostInventory, StaticHostBackend

    work = Path(sys.argv[1])
    config = AgentConfig(server_url="http://127.0.0.1:1", token="t", name="n", spool_dir=work / "spool",
                         work_dir=work / "work", job_user=None)
    agent = Agent(config, gpu_backend=FakeGpuBackend(1, "n"),
                  host_backend=StaticHostBackend(HostInventory(num_cpus=2, mem_gb=4.0)))
    signal.signal(signal.SIGTERM, stop_on_signal(agent, config))
    with agent.stop_event._cond:
        for _ in range(3):
            signal.raise_signal(signal.SIGTERM)  # the handler runs here, the lock held
        print("handled", agent.stop_asked, flush=True)
    faulthandler.cancel_dump_traceback_later()
    """
)


def test_the_signal_handler_takes_no_lock_that_the_interrupted_frame_may_hold(tmp_path: Path):
    done = subprocess.run(
        [sys.executable, "-c", HANDLER_UNDER_THE_EVENTS_LOCK, str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.stdout == "handled True\n", done.stderr
    assert done.returncode == 0, done.stderr


def test_real_agents_stop_on_bursts_of_signals(tmp_path: Path):
    """Three SIGTERMs within a millisecond, to each of eight real agents: all exit 0 promptly, none at
    the watchdog."""
    env = {**os.environ, "ATTUNE_AGENT_TOKEN": "not-a-real-token"}
    agents: list[tuple[subprocess.Popen, Path]] = []
    try:
        for index in range(8):
            work = tmp_path / f"agent{index}"
            argv = [
                sys.executable,
                "-m",
                "agent",
                "--server",
                "http://127.0.0.1:1",
                "--name",
                f"burst{index}",
            ]
            argv += ["--fake-gpus", "1", "--spool-dir", str(work / "spool"), "--work-dir", str(work / "work")]
            work.mkdir()
            with (work / "agent.log").open("w") as log:
                agents.append(
                    (subprocess.Popen(argv, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT), work)
                )
        deadline = time.monotonic() + 60
        for proc, work in agents:
            while "register failed" not in (work / "agent.log").read_text() and time.monotonic() < deadline:
                assert proc.poll() is None, (work / "agent.log").read_text()
                time.sleep(0.05)
        for proc, _ in agents:
            for _ in range(3):
                os.kill(proc.pid, signal.SIGTERM)
        for proc, work in agents:
            text = (work / "agent.log").read_text
            assert proc.wait(timeout=10 + 4 * STOP_POLL_S) == 0, text()
            assert "SIGTERM received: stopping" in text()
            assert "Timeout (" not in text()
    finally:
        for proc, _ in agents:
            proc.kill()
