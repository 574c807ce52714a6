"""The whole service as real processes on private PostgreSQL and Redis instances, for fault tests.

`PrivateServices` (one per session, private_services.py) runs a PostgreSQL cluster (initdb in a temp
dir, as the `postgres` account) and a Redis server on free ports, and migrates a template database
once: the catalog, two servers with agent tokens and a staff user with an API token. `Stack` (one per
test) clones a fresh database from it and runs gunicorn (the web tier), a Celery worker with beat
(rounds), one of the `forecasts` queue and node agents with fake GPUs (agents.py) as subprocesses, each
of which a test can stop, kill or restart (stack_processes.py). The test reads the outcome straight
from the private database with psycopg2 (here); nothing here touches the shared PostgreSQL or Redis of
the machine.
"""

from __future__ import annotations

import contextlib
import re
import time
from collections import defaultdict
from collections.abc import Iterable
from typing import Any

import psycopg2

from tests.faults.processes import wait_until
from tests.faults.stack_processes import StackProcesses

# What the rounds' single-flight advisory lock looks like in pg_locks (scheduler_app/services/round_lock.py).
ROUND_LOCK_KEY = int.from_bytes(b"Attune01", "big") & 0x7FFF_FFFF_FFFF_FFFF
ACCESS_LINE = re.compile(r'"(?P<request>[A-Z]+ [^"]*)" (?P<status>\d{3})\b')


class Stack(StackProcesses):
    """The stack's processes (StackProcesses) and what came of a test: the web tier's answers, what the
    database and the agents' spools say, and the checks every fault test shares."""

    # -- the web tier's answers (gunicorn's access log) ----------------------------------------

    def access_log(self) -> list[tuple[int, str]]:
        """(status, request line) of every answer of the web tier so far (gunicorn's access log)."""
        path = self.dir / "access.log"
        out = []
        for line in path.read_text(errors="replace").splitlines() if path.exists() else []:
            # gunicorn's format and uvicorn's alike: ... "METHOD /path?query HTTP/1.1" STATUS ...
            match = ACCESS_LINE.search(line)
            if match:
                out.append((int(match["status"]), match["request"].split("?")[0]))
        return out

    def access_log_statuses(self) -> dict[int, int]:
        """How many requests the web tier answered with each status."""
        counts: dict[int, int] = defaultdict(int)
        for status, _ in self.access_log():
            counts[status] += 1
        return dict(counts)

    def errors_since(self, start: int) -> dict[str, int]:
        """The 5xx answers after the first `start` access log lines: request -> count."""
        counts: dict[str, int] = defaultdict(int)
        for status, request in self.access_log()[start:]:
            if status >= 500:
                counts[f"{status} {request}"] += 1
        return dict(counts)

    # -- what the database says ----------------------------------------------------------------

    def job_states(self, ids: Iterable[int]) -> dict[int, str]:
        return dict(self.sql("SELECT id, state FROM scheduler_app_job WHERE id = ANY(%s)", [list(ids)]))

    def all_completed(self, ids: list[int]) -> bool:
        states = self.job_states(ids)
        bad = {i: s for i, s in states.items() if s in ("FAILED", "CANCELLED", "OUT_OF_MEMORY", "TIMEOUT")}
        assert not bad, f"jobs ended badly: {bad}; {self.job_table(bad)}"
        return len(states) == len(ids) and set(states.values()) == {"COMPLETED"}

    def job_table(self, ids: Iterable[int]) -> list[tuple]:
        return self.sql(
            "SELECT id, name, state, pending_reason, done_iters, total_iters, exit_code "
            "FROM scheduler_app_job WHERE id = ANY(%s) ORDER BY id",
            [list(ids)],
        )

    def last_round_id(self) -> int:
        return self.scalar("SELECT COALESCE(MAX(id), 0) FROM scheduler_app_schedulinground")

    def wait_round_since(self, db_time: Any, *, timeout_s: float, what: str) -> int:
        """Wait for a round started at `db_time` (the database's clock) or later; returns how many."""
        return wait_until(
            lambda: self.scalar(
                "SELECT COUNT(*) FROM scheduler_app_schedulinground WHERE started_at >= %s", [db_time]
            ),
            timeout_s=timeout_s,
            what=what,
            interval_s=0.1,
            diagnose=self.describe,
        )

    def round_lock_holder(self) -> int | None:
        """The backend pid holding the rounds' advisory lock (a round's transaction is open), or None."""
        rows = self.sql(
            "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND granted AND database = "
            "(SELECT oid FROM pg_database WHERE datname = current_database()) "
            "AND ((classid::bigint << 32) | objid::bigint) = %s",
            [ROUND_LOCK_KEY],
        )
        return rows[0][0] if rows else None

    def double_booked_gpus(self) -> list[tuple]:
        """GPUs in more than one unreleased AllocationGpu row (the partial unique index forbids it)."""
        return self.sql(
            "SELECT gpu_id, COUNT(*) FROM scheduler_app_allocationgpu WHERE released_at IS NULL "
            "GROUP BY gpu_id HAVING COUNT(*) > 1"
        )

    def overlapping_gpu_holds(self) -> list[tuple]:
        """Across the whole history: two holds of one GPU whose time intervals overlap."""
        return self.sql(
            "SELECT a.gpu_id, a.id, b.id FROM scheduler_app_allocationgpu a "
            "JOIN scheduler_app_allocation aa ON aa.id = a.allocation_id "
            "JOIN scheduler_app_allocationgpu b ON b.gpu_id = a.gpu_id AND b.id > a.id "
            "JOIN scheduler_app_allocation ba ON ba.id = b.allocation_id "
            "WHERE ba.started_at < COALESCE(a.released_at, 'infinity') "
            "AND aa.started_at < COALESCE(b.released_at, 'infinity')"
        )

    def jobs_with_too_many_leases(self) -> list[tuple]:
        """Jobs with more active allocations than servers they may span (their node count, else 1)."""
        return self.sql(
            "SELECT j.id, COUNT(a.id), COALESCE(j.num_nodes, 1) FROM scheduler_app_job j "
            "JOIN scheduler_app_allocation a ON a.job_id = j.id AND a.ended_at IS NULL "
            "GROUP BY j.id HAVING COUNT(a.id) > COALESCE(j.num_nodes, 1)"
        )

    def running_without_lease(self) -> list[int]:
        return [
            r[0]
            for r in self.sql(
                "SELECT j.id FROM scheduler_app_job j WHERE j.state = 'RUNNING' AND NOT EXISTS "
                "(SELECT 1 FROM scheduler_app_allocation a WHERE a.job_id = j.id AND a.ended_at IS NULL)"
            )
        ]

    def gpu_index_exists(self) -> bool:
        return bool(
            self.sql(
                "SELECT 1 FROM pg_indexes WHERE indexname = 'gpu_in_one_active_allocation' "
                "AND indexdef LIKE '%%UNIQUE%%' AND indexdef LIKE '%%released_at IS NULL%%'"
            )
        )

    def half_applied_rounds(self) -> list[tuple]:
        """Rounds whose row is not whole: a round's row, decisions and counts commit together (one
        transaction), so a round killed midway leaves nothing, never a row without its decisions."""
        return self.sql(
            "SELECT r.id, r.duration_ms, r.num_placed + r.num_pending + r.num_infeasible, COUNT(d.id) "
            "FROM scheduler_app_schedulinground r "
            "LEFT JOIN scheduler_app_rounddecision d ON d.round_id = r.id GROUP BY r.id "
            "HAVING r.duration_ms <= 0 OR COUNT(d.id) <> r.num_placed + r.num_pending + r.num_infeasible"
        )

    def check_invariants(self) -> dict[str, int]:
        """What must hold at any moment, whatever was killed: returns the figures it checked.

        No GPU in two unreleased holds (the partial unique index forbids it: checked that it exists and
        that the rows agree), no two holds of a GPU overlapping in time over the whole history, no job
        with more active leases than servers it may span, no job RUNNING without an active lease, no
        half-applied round.
        """
        assert self.gpu_index_exists(), "the unique index gpu_in_one_active_allocation is missing"
        figures = {
            "gpus": self.scalar("SELECT COUNT(*) FROM cluster_app_gpu"),
            "gpus_held": self.scalar(
                "SELECT COUNT(*) FROM scheduler_app_allocationgpu WHERE released_at IS NULL"
            ),
            "gpu_holds": self.scalar("SELECT COUNT(*) FROM scheduler_app_allocationgpu"),
            "leases": self.scalar("SELECT COUNT(*) FROM scheduler_app_allocation"),
            "active_leases": self.scalar(
                "SELECT COUNT(*) FROM scheduler_app_allocation WHERE ended_at IS NULL"
            ),
            "rounds": self.scalar("SELECT COUNT(*) FROM scheduler_app_schedulinground"),
        }
        problems = {
            "GPUs in two unreleased holds (gpu, holds)": self.double_booked_gpus(),
            "GPU holds overlapping in time (gpu, hold, hold)": self.overlapping_gpu_holds(),
            "jobs with too many active leases (job, leases, nodes)": self.jobs_with_too_many_leases(),
            "jobs RUNNING without an active lease": self.running_without_lease(),
            "half-applied rounds (round, duration, counted, decisions)": self.half_applied_rounds(),
        }
        bad = {k: v for k, v in problems.items() if v}
        assert not bad, f"invariants broken: {bad} (figures: {figures})"
        return figures

    def stored_reports(self) -> dict[str, list[int]]:
        """Per lease: the seqs of its stored AgentReport rows (duplicates kept, to be seen)."""
        out: dict[str, list[int]] = defaultdict(list)
        for lease, seq in self.sql("SELECT lease_id::text, seq FROM scheduler_app_agentreport ORDER BY 1, 2"):
            out[lease].append(seq)
        return dict(out)

    def lease_ids(self) -> dict[str, tuple[int, str]]:
        """Every allocation's lease id -> (job id, server name)."""
        return {
            lease: (job, server)
            for lease, job, server in self.sql(
                "SELECT a.lease_id::text, a.job_id, s.name FROM scheduler_app_allocation a "
                "JOIN cluster_app_server s ON s.id = a.server_id"
            )
        }

    def describe(self, ids: Iterable[int] = ()) -> str:
        """A diagnosis for an assertion message: jobs, leases, processes and the logs' last lines."""
        ids = list(ids)
        lines = [f"jobs (id, name, state, reason, done, total, exit): {self.job_table(ids)}" if ids else ""]
        with contextlib.suppress(psycopg2.Error):
            lines.append(
                "active leases (job, server, lease): "
                + repr(
                    self.sql(
                        "SELECT a.job_id, s.name, a.lease_id::text FROM scheduler_app_allocation a JOIN "
                        "cluster_app_server s ON s.id = a.server_id WHERE a.ended_at IS NULL ORDER BY 1"
                    )
                )
            )
            lines.append(f"servers: {self.sql('SELECT name, state FROM cluster_app_server ORDER BY 1')}")
        alive = {
            name: proc is not None and proc.poll() is None
            for name, proc in (
                ("web", self.web),
                ("worker", self.worker),
                ("forecasts worker", self.forecasts_worker),
            )
        }
        lines.append(", ".join(f"{name} alive: {up}" for name, up in alive.items()))
        lines.append(f"web log:\n{self.tail('web.log', 1500)}")
        lines.append(f"worker log:\n{self.worker_log()[-2500:]}")
        lines.append(f"forecasts worker log:\n{self.tail('forecasts-worker.log', 1500)}")
        for agent in self.agents:
            lines.append(f"{agent.name} (alive: {agent.alive()}) log:\n{agent.log_tail(2000)}")
        return "\n".join(lines)

    def wait_spools_drained(self, timeout_s: float = 30) -> None:
        """Every agent runs no lease and had every report it wrote acknowledged. A job can complete
        while a lease of it still stops (it finished through another lease, or the last progress came
        in the grace period): that lease's `exited` report comes after, so an empty `reports` table
        alone is not the end."""

        def drained() -> bool:
            spools = [a.spool() for a in self.agents]
            return all(not s["pending"] and not s["live"] for s in spools)

        wait_until(
            drained,
            timeout_s=timeout_s,
            what="the agents' spools to be drained (no lease running, every report acknowledged)",
            diagnose=self.describe,
        )

    def wait_running(self, ids: list[int], at_least: int, timeout_s: float = 40) -> int:
        """Wait until `at_least` of the jobs are RUNNING and have reported progress; returns how many."""

        def running() -> int:
            n = self.scalar(
                "SELECT COUNT(*) FROM scheduler_app_job WHERE id = ANY(%s) AND state = 'RUNNING' "
                "AND done_iters > 0",
                [ids],
            )
            return n if n >= at_least else 0

        return wait_until(
            running,
            timeout_s=timeout_s,
            what=f"{at_least} jobs running with progress",
            diagnose=lambda: self.describe(ids),
        )

    def recent_statuses(self, n: int) -> list[int]:
        """The statuses of the web tier's last `n` answers."""
        return [status for status, _ in self.access_log()[-n:]]

    def finish_and_check(self, ids: list[int], *, timeout_s: float = 90) -> dict[str, Any]:
        """Every job completes with exactly its iterations, every agent's spool is drained and each
        report stored once, the database invariants hold, and the web tier answers again (its last
        answers are not 5xx). Returns the figures for the test's summary."""
        wait_until(
            lambda: self.all_completed(ids),
            timeout_s=timeout_s,
            what=f"all {len(ids)} jobs to complete",
            interval_s=0.5,
            diagnose=lambda: self.describe(ids),
        )
        self.check_progress_exact(ids)
        self.wait_spools_drained()
        figures: dict[str, Any] = dict(self.check_reports_exactly_once())
        figures.update(self.check_invariants())
        # Agents sync every second: after the jobs ended, their calls must be answered again.
        time.sleep(2)
        recent = self.recent_statuses(10)
        assert recent and all(s < 500 for s in recent), f"the web tier still fails: last statuses {recent}"
        figures["jobs"] = len(ids)
        figures["web"] = self.access_log_statuses()
        figures["deadlocks"] = self.pg_log_count("deadlock detected")
        self.check_workers_alive()
        return figures

    def check_reports_exactly_once(self) -> dict[str, int]:
        """Every agent's spool is empty (all acknowledged), and per lease the stored reports are exactly
        the seqs 1..last_seq the agent's spool handed out: none lost, none stored twice.
        Returns figures to print."""
        stored = self.stored_reports()
        leases = self.lease_ids()
        sent_total = stored_total = 0
        problems: list[str] = []
        for agent in self.agents:
            spool = agent.spool()
            if spool["pending"]:
                problems.append(f"{agent.name}: {len(spool['pending'])} reports never acknowledged")
            for lease, last in spool["last_seq"].items():
                if lease not in leases:
                    continue  # a profiling run's reports (none here): not AgentReport rows
                seqs = stored.get(lease, [])
                sent_total += last
                stored_total += len(seqs)
                if seqs != list(range(1, last + 1)):
                    problems.append(
                        f"{agent.name} lease {lease} (job {leases[lease][0]}): sent seqs 1..{last}, "
                        f"stored {seqs}"
                    )
        unknown = set(stored) - {lease for a in self.agents for lease in a.spool()["last_seq"]}
        if unknown:
            problems.append(f"stored reports of leases no agent's spool knows: {sorted(unknown)}")
        assert not problems, "reports not stored exactly once:\n  " + "\n  ".join(problems)
        return {"sent": sent_total, "stored": stored_total, "leases": len(stored)}

    def check_progress_exact(self, ids: list[int]) -> None:
        rows = self.sql("SELECT id, done_iters, total_iters FROM scheduler_app_job WHERE id = ANY(%s)", [ids])
        wrong = [r for r in rows if r[1] != r[2]]
        assert not wrong, f"jobs whose progress is not exactly their total (id, done, total): {wrong}"

    def started_reports_per_lease(self) -> dict[str, int]:
        return dict(
            self.sql(
                "SELECT lease_id::text, COUNT(*) FROM scheduler_app_agentreport WHERE kind = 'started' "
                "GROUP BY 1"
            )
        )

    def leases_per_job(self, ids: list[int]) -> dict[int, int]:
        return dict(
            self.sql(
                "SELECT job_id, COUNT(*) FROM scheduler_app_allocation WHERE job_id = ANY(%s) GROUP BY 1",
                [ids],
            )
        )

    def log_tails(self, ids: list[int]) -> dict[int, str]:
        out: dict[int, str] = defaultdict(str)
        for job, tail in self.sql(
            "SELECT job_id, log_tail FROM scheduler_app_allocation WHERE job_id = ANY(%s) ORDER BY id", [ids]
        ):
            out[job] += tail + "\n"
        return dict(out)


def summary(tag: str, figures: dict[str, Any], *extra: str) -> str:
    """One line of what a test checked (printed, and put in its assertion messages)."""
    parts = [
        f"jobs: {figures['jobs']}/{figures['jobs']} COMPLETED with done == total",
        f"reports: {figures['sent']} sent = {figures['stored']} stored once over {figures['leases']} "
        "leases, spools drained",
        f"GPUs: {figures['gpus']}, 0 double-booked over {figures['gpu_holds']} holds, "
        f"{figures['active_leases']} active leases, 0 jobs RUNNING without one",
        f"rounds: {figures['rounds']}",
        f"web statuses: {figures['web']}",
        f"PostgreSQL deadlocks: {figures['deadlocks']}",
        *extra,
    ]
    return f"[{tag}] " + "; ".join(parts)
