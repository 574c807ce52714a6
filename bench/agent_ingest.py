"""Agent ingestion under load: N emulated node agents on a real gunicorn, against GET /healthz.

Run: `python -m bench.agent_ingest [--agents 32] [--seconds 20]`. Creates a fresh PostgreSQL database,
starts gunicorn (config.wsgi, DEBUG off) on a free loopback port, issues N agent tokens (the
node_token command), registers the N agents over HTTP, submits 4 jobs per server (1, 1, 2 and 4 GPUs)
and runs one scheduling round so that real leases exist; each agent polls once for its start
commands and reports `started`. Then two timed phases at the same concurrency (N client threads,
closed loop, no think time): the baseline, GET /healthz (one `SELECT 1`), and the agents, each
looping a heartbeat (with `--with-poll` also a poll) and a batch of progress reports with increasing
seq (every `--retry-every`-th batch is sent twice, a retry after a lost ack). Prints requests/s and
p50/p99 latency per kind and their ratios to the baseline, then checks that stored reports == unique
(lease, seq) sent and that progress and attained service count each report once. Gunicorn is stopped
and the database dropped at the end, also on error.
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from io import StringIO
from pathlib import Path

import httpx

from bench.common import print_table
from bench.live_common import bench_database, django_setup, logger, logging_setup, percentile

REPO_ROOT = Path(__file__).resolve().parent.parent
JOB_GPUS = (1, 1, 2, 4)  # jobs submitted per server: fill its 8 GPUs with 4 leases of mixed size
GPUS_PER_SERVER, CPUS_PER_SERVER, MEM_GB_PER_SERVER = 8, 24, 500.0
MAX_ATTEMPTS = 3  # an agent resends a batch that failed (no answer, 5xx) this many times at most
REQUEST_TIMEOUT_S = 30.0


# ---------------------------------------------------------------------------------------------------
# The service under test
# ---------------------------------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def gunicorn(database_url: str, *, workers: int, conn_max_age: int) -> Iterator[str]:
    """Start gunicorn (config.wsgi) on a free loopback port; yield its base URL; stop it at the end."""
    port = _free_port()
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "config.settings",
        "DATABASE_URL": database_url,
        "DEBUG": "0",
        "DB_CONN_MAX_AGE": str(conn_max_age),
        # Registration asks for an early round: run it inline rather than queue it on the shared Redis.
        "ATTUNE_INLINE_ROUNDS": "1",
        "LOG_LEVEL": "WARNING",
        "PYTHONUNBUFFERED": "1",
    }
    argv = [
        sys.executable, "-m", "gunicorn", "config.wsgi",
        "--bind", f"127.0.0.1:{port}", "--workers", str(workers),
        "--log-level", "warning", "--timeout", "60", "--graceful-timeout", "5",
    ]  # fmt: skip
    log = tempfile.NamedTemporaryFile(prefix="attune-bench-gunicorn-", suffix=".log", delete=False)  # noqa: SIM115
    proc = subprocess.Popen(argv, cwd=REPO_ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    base_url = f"http://127.0.0.1:{port}"
    failed = False
    try:
        deadline = time.monotonic() + 60
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"gunicorn exited with {proc.returncode}")
            try:
                if httpx.get(f"{base_url}/healthz", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("gunicorn did not answer /healthz within 60 s")
            time.sleep(0.2)
        logger.info("gunicorn pid %s: %d sync workers on %s", proc.pid, workers, base_url)
        yield base_url
    except BaseException:
        failed = True
        raise
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5)
        log.close()
        text = Path(log.name).read_text(errors="replace")
        if failed or "Traceback" in text:
            logger.warning("gunicorn log %s (last lines):\n%s", log.name, text[-4000:])
        else:
            Path(log.name).unlink()
        logger.info("gunicorn stopped")


# ---------------------------------------------------------------------------------------------------
# Emulated agents
# ---------------------------------------------------------------------------------------------------


@dataclass
class Lease:
    lease_id: str
    job_id: int
    gpus: int
    seq: int = 0  # last seq sent


@dataclass
class Stats:
    """What one client thread measured; merged over threads at the end."""

    latencies: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    errors: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    sent: set[tuple[str, int]] = field(default_factory=set)
    acked: set[tuple[str, int]] = field(default_factory=set)
    new_reports: int = 0
    beats_ok: int = 0

    def merge(self, other: Stats) -> None:
        for kind, values in other.latencies.items():
            self.latencies[kind].extend(values)
        for kind, n in other.errors.items():
            self.errors[kind] += n
        self.sent |= other.sent
        self.acked |= other.acked
        self.new_reports += other.new_reports
        self.beats_ok += other.beats_ok


def _iso(t: datetime) -> str:
    return t.isoformat().replace("+00:00", "Z")


class EmulatedAgent:
    """One node agent speaking the protocol of docs/agent-protocol.md over its own HTTP client."""

    def __init__(self, index: int, token: str, base_url: str, t0: datetime) -> None:
        self.name = f"bench{index:03d}"
        self.gpu_uuids = [f"GPU-bench-{index:03d}-{g}" for g in range(GPUS_PER_SERVER)]
        self.t0 = t0  # the agent's clock: report `at` = t0 + seq s, heartbeat `sampled_at` = t0 + beat s
        self.beat = 0
        self.leases: list[Lease] = []
        self.stats = Stats()
        self.client = httpx.Client(
            base_url=base_url, headers={"Authorization": f"Bearer {token}"}, timeout=REQUEST_TIMEOUT_S
        )

    def close(self) -> None:
        self.client.close()

    def _post(self, kind: str, path: str, body: dict) -> dict | None:
        start = time.perf_counter()
        try:
            response = self.client.post(path, json=body)
        except httpx.HTTPError as exc:
            self.stats.errors[kind] += 1
            logger.debug("%s %s: %s", self.name, path, exc)
            return None
        self.stats.latencies[kind].append(time.perf_counter() - start)
        if response.status_code != 200:
            self.stats.errors[kind] += 1
            logger.warning("%s %s: HTTP %s %s", self.name, path, response.status_code, response.text[:200])
            return None
        return response.json()

    def register(self) -> None:
        body = {
            "agent_version": "bench",
            "hostname": self.name,
            "num_cpus": CPUS_PER_SERVER,
            "mem_gb": MEM_GB_PER_SERVER,
            "gpus": [
                {"index": i, "uuid": u, "model": "Tesla V100-SXM2-32GB", "memory_mb": 32768}
                for i, u in enumerate(self.gpu_uuids)
            ],
            "cgroup_mode": "none",
        }
        if self._post("register", "/api/v1/agent/register", body) is None:
            raise RuntimeError(f"{self.name}: registration failed")

    def poll_and_start(self) -> None:
        """Learn the leases to run from one poll and report each `started` (seq 1), as the agent does."""
        answer = self._post("poll", "/api/v1/agent/poll", {"running": []})
        if answer is None:
            raise RuntimeError(f"{self.name}: poll failed")
        self.leases = [
            Lease(c["lease_id"], c["job_id"], len(c["gpu_uuids"]))
            for c in answer["commands"]
            if c["kind"] == "start"
        ]
        batch = []
        for lease in self.leases:
            lease.seq = 1
            data = {"pid": 1000 + lease.job_id, "isolation": "bench", "cpus": []}
            batch.append(self._report(lease, "started", data))
        if batch and not self._send_reports("started", batch):
            raise RuntimeError(f"{self.name}: started reports were not acknowledged")

    def _report(self, lease: Lease, kind: str, data: dict) -> dict:
        at = self.t0 + timedelta(seconds=lease.seq)
        return {"lease_id": lease.lease_id, "seq": lease.seq, "kind": kind, "at": _iso(at), "data": data}

    def _send_reports(self, kind: str, batch: list[dict]) -> bool:
        pairs = {(r["lease_id"], r["seq"]) for r in batch}
        new = pairs - self.stats.sent
        self.stats.sent |= pairs
        for _ in range(MAX_ATTEMPTS):
            answer = self._post(kind, "/api/v1/agent/reports", {"reports": batch})
            if answer is None:
                continue
            acked = {(lease_id, seq) for lease_id, seq in answer["acked"]}
            if answer["rejected"] or acked != pairs:
                logger.warning("%s: batch not fully acked: %s", self.name, answer["rejected"][:3])
                self.stats.errors[kind] += 1
            self.stats.acked |= acked
            self.stats.new_reports += len(new & acked)
            return True
        return False

    def heartbeat(self) -> None:
        self.beat += 1
        body = {
            "sampled_at": _iso(self.t0 + timedelta(seconds=self.beat)),
            "cpu_util_pct": 40.0,
            "mem_used_gb": 120.0,
            "gpus": [{"uuid": u, "util_pct": 95.0, "mem_used_mb": 20480} for u in self.gpu_uuids],
        }
        if self._post("heartbeat", "/api/v1/agent/heartbeat", body) is not None:
            self.stats.beats_ok += 1

    def poll(self) -> None:
        """Poll with every lease running: the answer must hold no command (nothing changed)."""
        answer = self._post(
            "poll", "/api/v1/agent/poll", {"running": [lease.lease_id for lease in self.leases]}
        )
        if answer is not None and answer["commands"]:
            logger.warning("%s: unexpected commands %s", self.name, answer["commands"][:2])
            self.stats.errors["poll"] += 1

    def run(
        self, *, deadline: float, reports_per_lease: int, retry_every: int, max_loops: int, poll: bool
    ) -> Stats:
        """Heartbeat (+ poll) + one batch of progress reports per loop until the deadline (or `max_loops`)."""
        loops = 0
        while time.monotonic() < deadline and loops < max_loops:
            loops += 1
            self.heartbeat()
            if poll:
                self.poll()
            batch = []
            for lease in self.leases:
                for _ in range(reports_per_lease):
                    lease.seq += 1
                    data = {"done_iters": 10 * lease.seq, "iters_per_s": 3.0}
                    batch.append(self._report(lease, "progress", data))
            if not batch:
                continue
            self._send_reports("reports", batch)
            if retry_every and loops % retry_every == 0:
                self._send_reports("reports (retried)", batch)  # as if the first ack had been lost
        return self.stats


def healthz_loop(base_url: str, *, deadline: float, max_loops: int) -> Stats:
    """The baseline client: GET /healthz back to back until the deadline."""
    stats = Stats()
    with httpx.Client(base_url=base_url, timeout=REQUEST_TIMEOUT_S) as client:
        for _ in range(max_loops):
            if time.monotonic() >= deadline:
                break
            start = time.perf_counter()
            try:
                ok = client.get("/healthz").status_code == 200
            except httpx.HTTPError:
                ok = False
            if ok:
                stats.latencies["healthz"].append(time.perf_counter() - start)
            else:
                stats.errors["healthz"] += 1
    return stats


def run_phase(fns: list[Callable[[float], Stats]], seconds: float) -> tuple[Stats, float]:
    """Run the closed-loop clients `fns(deadline)` concurrently; merged stats and the phase's wall time."""
    total = Stats()
    start = time.monotonic()
    deadline = start + seconds
    with ThreadPoolExecutor(max_workers=len(fns)) as pool:
        for stats in pool.map(lambda fn: fn(deadline), fns):
            total.merge(stats)
    return total, time.monotonic() - start


# ---------------------------------------------------------------------------------------------------
# Setup and verification (Django in this process, on the same database)
# ---------------------------------------------------------------------------------------------------


def issue_tokens(count: int) -> list[str]:
    """`manage.py node_token benchNNN` for each server: creates it and prints a fresh token."""
    from django.core.management import call_command

    tokens = []
    for i in range(count):
        out = StringIO()
        call_command("node_token", f"bench{i:03d}", stdout=out, stderr=StringIO())
        tokens.append(out.getvalue().strip())
    return tokens


def submit_and_schedule(num_servers: int) -> int:
    """Submit JOB_GPUS per server (catalog models, endless work) and run one round; returns leases."""
    from django.contrib.auth import get_user_model

    from profiles_app.models import Workload
    from profiles_app.services import workload_catalog_load
    from scheduler_app.models import Allocation
    from scheduler_app.services.jobs import JobRequest, job_submit
    from scheduler_app.services.rounds import scheduling_round_run

    workload_catalog_load()
    workloads = list(Workload.objects.order_by("name"))
    owner = get_user_model().objects.create_user("bench", password=None)
    n = 0
    for _ in range(num_servers):
        for gpus in JOB_GPUS:
            job_submit(
                owner=owner,
                request=JobRequest(
                    name=f"bench-{n}",
                    num_gpus=gpus,
                    total_iters=10**9,
                    workload=workloads[n % len(workloads)],
                ),
            )
            n += 1
    sround = scheduling_round_run(trigger="bench")
    if sround is None:
        raise RuntimeError("the scheduling round was skipped (another round held the lock)")
    leases = Allocation.objects.filter(ended_at__isnull=True).count()
    logger.info("%d jobs submitted; round placed %d jobs on %d leases", n, sround.num_placed, leases)
    return leases


def verify(agents: list[EmulatedAgent], stats: Stats) -> list[str]:
    """Check that every report and heartbeat counted exactly once; returns the failures (none = OK)."""
    from cluster_app.models import UsageSample
    from scheduler_app.models import AgentReport, Job

    failures = []
    stored = AgentReport.objects.count()
    unacked = len(stats.sent - stats.acked)
    line = (
        f"stored AgentReport rows {stored} == unique (lease, seq) sent {len(stats.sent)}"
        f" (acked {len(stats.acked)}, never acked {unacked})"
    )
    exact = stored == len(stats.sent) if unacked == 0 else len(stats.acked) <= stored <= len(stats.sent)
    print(line + (": OK" if exact else ": MISMATCH"))
    if not exact:
        failures.append(line)

    # Progress keeps the maximum; attained service credits GPUs x agent time since the lease's last
    # applied report, so a report applied twice would not show here, but one applied out of order or
    # lost would. Reports of one lease go out in seq order, one batch at a time.
    last_acked: dict[str, int] = defaultdict(lambda: 1)
    for lease_id, seq in stats.acked:
        last_acked[lease_id] = max(last_acked[lease_id], seq)
    expected_service: dict[int, float] = defaultdict(float)
    expected_iters: dict[int, int] = defaultdict(int)
    for agent in agents:
        for lease in agent.leases:
            last = last_acked[lease.lease_id]
            expected_service[lease.job_id] += lease.gpus * (last - 1)
            expected_iters[lease.job_id] = max(expected_iters[lease.job_id], 10 * last if last > 1 else 0)
    rows = dict(Job.objects.filter(pk__in=expected_service).values_list("pk", "attained_service_gpu_s"))
    iters = dict(Job.objects.filter(pk__in=expected_service).values_list("pk", "done_iters"))
    bad = [
        j
        for j in expected_service
        if abs(rows[j] - expected_service[j]) > 1e-6 * max(1.0, expected_service[j])
        or iters[j] != expected_iters[j]
    ]
    line = f"progress and attained service of {len(expected_service)} jobs match the reports sent"
    print(line + (": OK" if not bad or unacked else f": MISMATCH for jobs {bad[:10]}"))
    if bad and not unacked:
        failures.append(line)

    samples = UsageSample.objects.count()
    beats = sum(agent.beat for agent in agents)
    line = f"usage samples stored {samples} == heartbeats sent {beats} (answered {stats.beats_ok})"
    ok = samples == beats if stats.beats_ok == beats else stats.beats_ok <= samples <= beats
    print(line + (": OK" if ok else ": MISMATCH"))
    if not ok:
        failures.append(line)
    return failures


# ---------------------------------------------------------------------------------------------------
# Main
# ---------------------------------------------------------------------------------------------------


def _row(label: str, latencies: list[float], errors: int, wall_s: float, base: list[float]) -> list:
    p50, p99 = percentile(latencies, 50) * 1e3, percentile(latencies, 99) * 1e3
    b50, b99 = percentile(base, 50) * 1e3, percentile(base, 99) * 1e3
    return [label, len(latencies), errors, len(latencies) / wall_s, p50, p99, p50 / b50, p99 / b99]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--agents", type=int, default=32, help="emulated agents = servers = client threads")
    parser.add_argument("--seconds", type=float, default=20.0, help="length of each timed phase")
    parser.add_argument("--workers", type=int, default=3, help="gunicorn sync workers (the image runs 3)")
    parser.add_argument(
        "--reports-per-lease", type=int, default=2, help="progress reports per lease per batch"
    )
    parser.add_argument("--retry-every", type=int, default=5, help="send every k-th batch twice (0: never)")
    parser.add_argument("--max-loops", type=int, default=5000, help="cap on loops per client and phase")
    parser.add_argument(
        "--conn-max-age", type=int, default=0, help="DB_CONN_MAX_AGE of the service (0, as shipped)"
    )
    parser.add_argument("--with-poll", action="store_true", help="also poll once per loop (as agents do)")
    parser.add_argument("--db", default="attune_bench_ingest", help="database to create and drop")
    parser.add_argument("--keep-db", action="store_true", help="do not drop the database at the end")
    args = parser.parse_args()
    logging_setup()
    if not 1 <= args.agents <= 256 or not 0 < args.seconds <= 120:
        parser.error("--agents must be 1..256 and --seconds 0..120")

    failures: list[str] = []
    with bench_database(args.db, keep=args.keep_db) as url:
        django_setup(url)
        tokens = issue_tokens(args.agents)
        with gunicorn(url, workers=args.workers, conn_max_age=args.conn_max_age) as base_url:
            t0 = datetime.now(UTC).replace(microsecond=0)
            agents = [EmulatedAgent(i, token, base_url, t0) for i, token in enumerate(tokens)]
            try:
                for agent in agents:
                    agent.register()
                submit_and_schedule(args.agents)
                for agent in agents:
                    agent.poll_and_start()
                leases = sum(len(a.leases) for a in agents)
                per_batch = leases * args.reports_per_lease / max(1, len(agents))
                logger.info(
                    "%d agents run %d leases; about %.0f reports per batch", len(agents), leases, per_batch
                )

                logger.info("baseline: %d clients GET /healthz for %.0f s", args.agents, args.seconds)
                base, base_wall = run_phase(
                    [lambda d: healthz_loop(base_url, deadline=d, max_loops=args.max_loops)] * args.agents,
                    args.seconds,
                )
                logger.info("agents: %d agents heartbeat + report for %.0f s", args.agents, args.seconds)
                setup = Stats()
                for agent in agents:
                    setup.merge(agent.stats)
                    agent.stats = Stats()
                load, load_wall = run_phase(
                    [
                        lambda d, a=agent: a.run(
                            deadline=d,
                            reports_per_lease=args.reports_per_lease,
                            retry_every=args.retry_every,
                            max_loops=args.max_loops,
                            poll=args.with_poll,
                        )
                        for agent in agents
                    ],
                    args.seconds,
                )
            finally:
                for agent in agents:
                    agent.close()
        load_wall = max(load_wall, 1e-9)
        base_lat = base.latencies["healthz"]
        rows = [_row("GET /healthz (baseline)", base_lat, base.errors["healthz"], base_wall, base_lat)]
        agent_lat: list[float] = []
        agent_errors = 0
        for kind in ("heartbeat", "poll", "reports", "reports (retried)"):
            if kind == "poll" and not args.with_poll:
                continue
            agent_lat += load.latencies[kind]
            agent_errors += load.errors[kind]
            rows.append(_row(kind, load.latencies[kind], load.errors[kind], load_wall, base_lat))
        rows.append(_row("all agent requests", agent_lat, agent_errors, load_wall, base_lat))
        print(
            f"\n{args.agents} agents, {leases} leases, {args.workers} gunicorn sync workers,"
            f" {args.agents} concurrent clients on loopback, {args.seconds:.0f} s per phase"
        )
        print_table(
            ["requests", "n", "errors", "req/s", "p50 ms", "p99 ms", "x base p50", "x base p99"], rows
        )
        base_rps = len(base_lat) / base_wall
        agent_rps = len(agent_lat) / load_wall
        print(
            f"reports stored: {load.new_reports} in {load_wall:.1f} s = {load.new_reports / load_wall:.0f}"
            f" reports/s; agent requests {agent_rps:.0f}/s = x{agent_rps / base_rps:.2f} the /healthz rate"
            f" ({base_rps:.0f}/s); {len(load.latencies['reports (retried)'])} batches sent twice"
        )
        # Verification reads the database after gunicorn has stopped: every request has finished.
        everything = Stats()
        everything.merge(setup)
        everything.merge(load)
        failures = verify(agents, everything)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
