"""A node agent with fake GPUs as a subprocess of a fault test, and how many iterations its jobs take."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
from typing import TYPE_CHECKING, Any

from tests.faults.private_services import CPUS_PER_NODE, GPUS_PER_NODE, MEM_GB_PER_NODE, SCRUBBED_ENV
from tests.faults.processes import PYTHON, REPO_ROOT, kill_group

if TYPE_CHECKING:
    from tests.faults.stack_processes import StackProcesses

TIME_SCALE = 0.02


class Agent:
    """`python -m agent` with fake GPUs, in a session of its own. Its jobs' shims start sessions of
    their own too, so `kill()` kills the agent alone (a crashed agent on a node that keeps running)."""

    def __init__(self, stack: StackProcesses, name: str, token: str) -> None:
        self.name, self.token = name, token
        self.dir = stack.dir / name
        self.dir.mkdir()
        self.spool_dir = self.dir / "spool"
        self.work_dir = self.dir / "work"
        self.log_path = self.dir / "agent.log"
        self.args = [
            PYTHON,
            "-m",
            "agent",
            "--server",
            stack.url,
            "--name",
            name,
            "--fake-gpus",
            str(GPUS_PER_NODE),
            "--fake-cpus",
            str(CPUS_PER_NODE),
            "--fake-mem-gb",
            str(MEM_GB_PER_NODE),
            "--time-scale",
            str(TIME_SCALE),
            "--spool-dir",
            str(self.spool_dir),
            "--work-dir",
            str(self.work_dir),
            "--isolation",
            "affinity+rlimit",
            *stack.agent_args,
        ]
        self.proc: subprocess.Popen | None = None
        self.starts = 0

    def start(self) -> None:
        assert self.proc is None or self.proc.poll() is not None, f"{self.name} is running"
        env = {k: v for k, v in os.environ.items() if k not in (*SCRUBBED_ENV, "DJANGO_SETTINGS_MODULE")}
        env["ATTUNE_AGENT_TOKEN"] = self.token
        with self.log_path.open("a") as log:
            self.proc = subprocess.Popen(
                self.args,
                cwd=REPO_ROOT,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.starts += 1

    def kill(self) -> None:
        """SIGKILL the agent process alone; its shims and jobs live on."""
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait(timeout=10)

    def stop(self) -> None:
        kill_group(self.proc, signal.SIGKILL)

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def log_tail(self, chars: int = 3000) -> str:
        return self.log_path.read_text(errors="replace")[-chars:] if self.log_path.exists() else ""

    # -- the spool (agent/spool.py): what the agent sent and what is still unacknowledged ----------

    def spool(self) -> dict[str, Any]:
        """{'last_seq': {lease: n}, 'pending': {(lease, seq)}, 'live': {lease}} read from the agent's
        SQLite spool.

        A report gets the lease's next seq (`lease_seq.last_seq`) when it is written and leaves the
        `reports` table once the service acknowledged (or rejected) it: with nothing pending and no
        live lease (`leases` holds a record from launch until the `exited` report is written), the
        agent sent and had acknowledged exactly the seqs 1..last_seq of each lease, and writes no more.
        """
        path = self.spool_dir / "spool.sqlite3"
        db = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=5)
        try:
            last = dict(db.execute("SELECT lease_id, last_seq FROM lease_seq").fetchall())
            pending = set(db.execute("SELECT lease_id, seq FROM reports").fetchall())
            live = {row[0] for row in db.execute("SELECT lease_id FROM leases")}
        finally:
            db.close()
        return {"last_seq": last, "pending": pending, "live": live}


def iters_for(model: str, seconds: float) -> int:
    """Iterations that take about `seconds` at the GPU-proportional share on our fake nodes."""
    from profiles_app.catalog import profile_for

    return max(10, int(seconds / (profile_for(model).iter_time_s * TIME_SCALE)))
