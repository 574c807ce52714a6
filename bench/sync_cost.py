"""What one agent sync costs the web tier: CPU per call and statements, against /healthz in the same run.

Run: `python -m bench.sync_cost [--syncs 200] [--exits 100] [--db NAME] [--redis-url URL] [--profile
KIND] [--served]`; `--served`: every agent call as the image serves it (config/agent_calls.py's path
first, Django's request signals), not through the test client. Creates a fresh PostgreSQL database with
one server (8 GPUs) running 8 one-GPU jobs placed by a real round, then calls `POST /api/v1/agent/sync`
through Django's full request handler in this process (middleware, authentication, validation, the
service, the answer; no network, so the figure is the web process's own CPU, not the bench's or the
socket's) with a usage sample of 8 GPUs, the 8 running leases and 0, 1 or 8 progress reports, and `GET
/healthz` as the baseline; then the syncs with progress left to the worker's applier
(ATTUNE_PROGRESS_APPLY_S, the default with workers) and the applier's own CPU per report, applying what
they left pending; then a job's end call by call on a second server (JobEnds): the exit's sync, the
woken sync that delivers the next job's `start` and the sync with its `started` report, and the
applier's CPU per job end. `--db` and `--redis-url` keep a run off another's database and Redis. CPU
time (`time.process_time`) is this process only; the database server's share is read from its backend
process (`pg_backend_pid()`: PostgreSQL must run on this machine), its run time in /proc/PID/schedstat
(exact; psutil's user + system time, sampled in ticks, where Linux's is missing), as a mean per call.
Printed per kind: CPU ms p50 / p90, PostgreSQL CPU ms per call, statements per call, and the ratio to
/healthz; with `--profile KIND`, cProfile's view of that kind's calls. CPU time moves much less than
wall time with the machine's load, so the figure holds on a shared machine; the fleet's capacity is
roughly two cores' worth of these, less the agents and the rounds (bench/agent_fleet.py measures that).
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import sys
import time
from datetime import UTC, datetime, timedelta

from bench.common import print_table
from bench.live_common import bench_database, django_setup, logger, logging_setup, percentile, servers_create

SYNC = "/api/v1/agent/sync"


def _setup():
    """One 8-GPU server running 8 one-GPU jobs (placed by a round, started by its agent); its client."""
    from django.contrib.auth import get_user_model
    from django.test import Client

    from cluster_app.services import agent_credential_issue
    from profiles_app.models import Workload
    from profiles_app.services.workloads import workload_catalog_load
    from scheduler_app.models import Allocation
    from scheduler_app.services.jobs import JobRequest, job_submit
    from scheduler_app.services.rounds import scheduling_round_run

    (server,) = servers_create(1, uuid_tag="sync")
    workload_catalog_load()
    workload = Workload.objects.order_by("name").first()
    owner = get_user_model().objects.create_user("bench", password=None)
    for i in range(8):
        # Admission off: the round that places them is run just below.
        job_submit(
            admission=False,
            owner=owner,
            request=JobRequest(name=f"sync-{i}", num_gpus=1, total_iters=10**9, workload=workload),
        )
    scheduling_round_run()
    leases = [
        str(a) for a in Allocation.objects.filter(ended_at__isnull=True).values_list("lease_id", flat=True)
    ]
    if len(leases) != 8:
        raise RuntimeError(f"the round placed {len(leases)} leases, not 8")
    client = Client(HTTP_AUTHORIZATION=f"Bearer {agent_credential_issue(server=server)}")
    gpus = [{"uuid": f"GPU-sync-000-{g}", "util_pct": 50.0, "mem_used_mb": 1000.0} for g in range(8)]
    return client, leases, gpus


class ServedClient:
    """A test client's `post` and `get` as the image serves an agent's call (`--served`): a WSGI environ
    through `config/agent_calls.py`'s path first (Django's handler for what it hands back), with Django's
    request signals (each request's connection check included), the answer read and closed as the
    server does."""

    def __init__(self, client) -> None:
        from django.core.wsgi import get_wsgi_application
        from django.test import RequestFactory

        from config.agent_calls import AgentCallsFirst

        self.defaults = client.defaults
        self._factory = RequestFactory(**client.defaults)
        self._app = AgentCallsFirst(get_wsgi_application())

    def _served(self, request):
        from django.http import HttpResponse

        started = []
        iterable = self._app(request.environ, lambda status, headers: started.append((status, headers)))
        content = b"".join(iterable)
        iterable.close()
        status, _ = started[0]
        response = HttpResponse(content, status=int(status.split()[0]))
        response.json = lambda: json.loads(content)
        return response

    def post(self, path: str, data: str, content_type: str):
        return self._served(self._factory.post(path, data=data, content_type=content_type))

    def get(self, path: str):
        return self._served(self._factory.get(path))


class Agent:
    """The calls of one emulated agent: its leases, their report sequence numbers and a clock."""

    def __init__(self, client, leases: list[str], gpus: list[dict]) -> None:
        self.client, self.leases, self.gpus = client, leases, gpus
        self.seq = 1
        self.at = datetime.now(UTC)

    def body(self, reports_per_call: int) -> str:
        # The agent's clock: now, never twice the same instant (a report dated later is clamped).
        self.at = max(datetime.now(UTC), self.at + timedelta(milliseconds=1))
        reports = []
        if self.seq == 1:
            reports = [{"lease_id": lease, "seq": 1, "kind": "started", "at": self.at.isoformat(), "data": {}}
                       for lease in self.leases]  # fmt: skip
            self.seq = 2
        else:
            for lease in self.leases[:reports_per_call]:
                done = 100 * self.seq
                data = {"done_iters": done, "iters_per_s": 10.0}
                reports.append(
                    {
                        "lease_id": lease,
                        "seq": self.seq,
                        "kind": "progress",
                        "at": self.at.isoformat(),
                        "data": data,
                    }
                )
            self.seq += 1 if reports else 0
        sample = {
            "sampled_at": self.at.isoformat(),
            "cpu_util_pct": 40.0,
            "mem_used_gb": 100.0,
            "gpus": self.gpus,
        }
        return json.dumps({"sample": sample, "running": self.leases, "reports": reports})

    def sync(self, reports_per_call: int) -> dict:
        response = self.client.post(SYNC, data=self.body(reports_per_call), content_type="application/json")
        if response.status_code != 200:
            raise RuntimeError(f"sync answered {response.status_code}: {response.content[:500]!r}")
        answer = response.json()
        if answer["rejected"]:
            raise RuntimeError(f"reports rejected: {answer['rejected'][:2]}")
        return answer


def _backend_cpu_clock():
    """A function giving the database backend's CPU seconds so far (PostgreSQL on this machine): its
    exact run time from /proc/PID/schedstat where Linux has it, else psutil's user + system time, which
    the kernel samples in ticks (at a few hundred calls, identical code read 0.43 and 0.78 ms a sync)."""
    import psutil
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        pid = cursor.fetchone()[0]
    schedstat = f"/proc/{pid}/schedstat"
    try:
        with open(schedstat) as f:
            int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        backend = psutil.Process(pid)
        return lambda: sum(backend.cpu_times()[:2])

    def run_time_s() -> float:
        with open(schedstat) as f:
            return int(f.read().split()[0]) / 1e9

    return run_time_s


def _measure(call, count: int) -> tuple[list[float], float, int]:
    """CPU ms of each of `count` calls (after 10 unmeasured), the database backend's mean CPU ms per
    call, and the statements per call."""
    from django.db import connection

    for _ in range(10):
        call()
    statements = []

    def counted(execute, sql, params, many, context):
        statements.append(sql)
        return execute(sql, params, many, context)

    # Not CaptureQueriesContext: each request clears the connection's query log when it starts.
    with connection.execute_wrapper(counted):
        call()
    backend_cpu_s = _backend_cpu_clock()

    cpu_ms = []
    backend_before = backend_cpu_s()
    for _ in range(count):
        start = time.process_time()
        call()
        cpu_ms.append((time.process_time() - start) * 1000)
    return cpu_ms, (backend_cpu_s() - backend_before) * 1000 / count, len(statements)


def _applier_row(pending: int, base: float) -> list:
    """One run of the applier over `pending` stored reports: CPU ms per report (this process and the
    database backend's), as the worker would spend it."""
    from scheduler_app.services.report_ingest import agent_reports_apply_run

    backend_cpu_s = _backend_cpu_clock()
    db_before = backend_cpu_s()
    start = time.process_time()
    applied = agent_reports_apply_run()
    cpu_ms = (time.process_time() - start) * 1000 / max(1, applied)
    db_ms = (backend_cpu_s() - db_before) * 1000 / max(1, applied)
    if applied != pending:
        raise RuntimeError(f"the applier applied {applied} of {pending} pending reports")
    label = f"applier, per report ({applied})"
    return [label, f"{cpu_ms:.3f}", "", f"{db_ms:.3f}", "", f"{cpu_ms / base:.2f}x"]


class JobEnds:
    """Jobs run to their end on a second server of 8 GPUs, one after another, as its agent sees them
    under churn. Each cycle: a lease's `exited` in a sync of its own (`running` without it, as the
    agent sends it), the round that places the next job on the GPU it freed (not measured), the woken
    sync that carries that job's `start`, the agent's sync with its `started` report, then three
    progress reports at the profile's predicted speed and the applier (not measured), so that every
    job that ends has measured speeds to learn from."""

    def __init__(self, jobs: int, *, served: bool = False) -> None:
        from django.contrib.auth import get_user_model
        from django.test import Client

        from cluster_app.services import GpuSpec, agent_credential_issue, server_create
        from profiles_app.models import Workload
        from scheduler_app.services.jobs import JobRequest, job_submit

        gpus = [GpuSpec(index=g, uuid=f"GPU-ends-000-{g}", model="V100") for g in range(8)]
        self.server = server_create(name="ends01", num_cpus=24, mem_gb=500.0, gpus=gpus, gpu_model="V100")
        self.client = Client(HTTP_AUTHORIZATION=f"Bearer {agent_credential_issue(server=self.server)}")
        if served:
            self.client = ServedClient(self.client)
        self.gpus = [{"uuid": f"GPU-ends-000-{g}", "util_pct": 50.0, "mem_used_mb": 1000.0} for g in range(8)]
        owner = get_user_model().objects.get(username="bench")
        workloads = list(Workload.objects.order_by("name")[:4])
        for i in range(jobs):
            request = JobRequest(name=f"end-{i}", num_gpus=1, total_iters=300, workload=workloads[i % 4])
            job_submit(owner=owner, request=request, admission=False)  # placed by the caller's round
        self.at = datetime.now(UTC)
        self.running: list[str] = []  # the leases the agent runs, oldest first
        self.seq: dict[str, int] = {}  # lease -> its last report's sequence number
        self.placed: list[str] = []  # leases whose start the last delivery carried

    def _sync(self, reports: list[dict], running: list[str]) -> dict:
        self.at = max(datetime.now(UTC), self.at + timedelta(milliseconds=1))
        sample = {
            "sampled_at": self.at.isoformat(),
            "cpu_util_pct": 40.0,
            "mem_used_gb": 100.0,
            "gpus": self.gpus,
        }
        for report in reports:
            report["at"] = self.at.isoformat()
            self.seq[report["lease_id"]] = report["seq"] = self.seq.get(report["lease_id"], 0) + 1
        body = json.dumps({"sample": sample, "running": running, "reports": reports})
        response = self.client.post(SYNC, data=body, content_type="application/json")
        if response.status_code != 200 or response.json()["rejected"]:
            raise RuntimeError(f"sync answered {response.status_code}: {response.content[:500]!r}")
        return response.json()

    def fill(self) -> None:
        """The first round: its 8 leases delivered, started and measured (none of it measured)."""
        self.place()
        self.deliver(expected=8)
        self.started()

    def exit(self, *, with_progress: bool = False) -> None:
        """The oldest lease exits 0 with all its work done: the call measured as an exit; `with_progress`:
        with the other leases' progress since the last sync, as an agent's exit sync carries it."""
        lease = self.running.pop(0)
        data = {"exit_code": 0, "done_iters": 300}
        reports = [{"lease_id": lease, "kind": "exited", "data": data}]
        if with_progress:
            reports += [
                {"lease_id": other, "kind": "progress", "data": {"done_iters": 290}} for other in self.running
            ]
        self._sync(reports, self.running)

    def place(self) -> None:
        from scheduler_app.services.rounds import scheduling_round_run

        scheduling_round_run()

    def deliver(self, expected: int = 1) -> None:
        """The woken sync after the round: no report, the `start` of what the round placed."""
        commands = self._sync([], self.running)["commands"]
        self.placed = [c["lease_id"] for c in commands if c["kind"] == "start"]
        if len(self.placed) != expected or len(commands) != expected:
            raise RuntimeError(f"expected {expected} start commands, got {commands}")

    def started(self) -> None:
        """The agent's sync right after it launched them: their `started` reports."""
        self.running += self.placed
        self._sync(
            [{"lease_id": lease, "kind": "started", "data": {}} for lease in self.placed], self.running
        )

    def measure(self) -> None:
        """Three progress reports of the new leases at the profile's speed, then the applier."""
        from profiles_app.selectors import workload_iter_time_s
        from scheduler_app.models import Allocation
        from scheduler_app.services.report_ingest import agent_reports_apply_run

        leases = Allocation.objects.filter(lease_id__in=self.placed).select_related("job__workload")
        speeds = {
            str(a.lease_id): a.speedup / workload_iter_time_s(a.job.workload, a.job.num_gpus) for a in leases
        }
        for done in (100, 200, 290):
            reports = [
                {"lease_id": lease, "kind": "progress", "data": {"done_iters": done, "iters_per_s": ips}}
                for lease, ips in speeds.items()
            ]
            self._sync(reports, self.running)
        agent_reports_apply_run()


class Profile:
    """cProfile around the measured calls of one kind (`--profile KIND`), printed at the end: where a
    call's CPU goes, by function."""

    def __init__(self, kind: str | None) -> None:
        import cProfile

        self.kind = kind
        # On the process's CPU clock: a call's wait on PostgreSQL is not the web tier's CPU, and on the
        # wall clock it hid where the CPU goes (half of a sync's wall time is the wait).
        self.profiler = cProfile.Profile(time.process_time) if kind else None

    def around(self, kind: str, call):
        if self.profiler is None or kind != self.kind:
            return call

        def profiled():
            self.profiler.enable()
            try:
                return call()
            finally:
                self.profiler.disable()

        return profiled

    def print(self, lines: int = 40) -> None:
        if self.profiler is None:
            return
        import pstats

        stats = pstats.Stats(self.profiler).strip_dirs()
        print(f"\nprofile of `{self.kind}` calls, by own time:")
        stats.sort_stats("tottime").print_stats(lines)
        print(f"profile of `{self.kind}` calls, by cumulative time:")
        stats.sort_stats("cumulative").print_stats(lines)


PROFILE_KINDS = ("sync0", "sync4", "exit", "deliver", "started")


def _job_end_rows(
    count: int, base: float, profile: Profile | None = None, served: bool = False
) -> list[list]:
    """A job's end, call by call: its exit's sync with the end followed up within it (no workers, or
    ATTUNE_PROGRESS_APPLY_S 0), then with the follow-ups left to the applier (the default with
    workers); with the latter, the woken sync that delivers the next job's start and the sync with its
    `started` report; the applier's CPU per job end. A job's end asks for an early round: the request
    (Redis, the bench's --redis-url) is counted in the exit; its task, at most one per debounce, waits
    on that Redis for a worker this bench does not run. The rounds run here, outside the measured calls."""
    from django.conf import settings

    from scheduler_app.models import JobEndPending
    from scheduler_app.services.job_end import job_end_followups_run

    ends = JobEnds(3 * (count + 10) + 8, served=served)
    ends.fill()
    ends.measure()
    backend_cpu_s = _backend_cpu_clock()

    def timed(call, cpu_ms: list[float], db_s: list[float]) -> None:
        db_before = backend_cpu_s()
        start = time.process_time()
        call()
        cpu_ms.append((time.process_time() - start) * 1000)
        db_s.append(backend_cpu_s() - db_before)

    def row(label: str, cpu_ms: list[float], db_s: list[float]) -> list:
        cpu_ms, db_s = cpu_ms[5:], db_s[5:]  # the first few warm the code path up
        p50, db_ms = percentile(cpu_ms, 50), sum(db_s) * 1000 / len(db_s)
        return [
            label,
            f"{p50:.2f}",
            f"{percentile(cpu_ms, 90):.2f}",
            f"{db_ms:.2f}",
            "",
            f"{p50 / base:.1f}x",
        ]

    profile = profile or Profile(None)
    rows = []
    for label, apply_s, with_progress in (
        ("exit, job end followed up in the sync", 0.0, False),
        ("exit, 7 leases' progress, applier", 2.0, True),
        ("exit, follow-ups left to the applier", 2.0, False),
    ):
        conf = {"inline_rounds": False, "progress_apply_s": apply_s}
        settings.ATTUNE_SCHEDULER = {**settings.ATTUNE_SCHEDULER, **conf}
        samples: dict[str, tuple[list[float], list[float]]] = {
            k: ([], []) for k in ("exit", "deliver", "started")
        }
        for _ in range(count + 5):
            # Profiled only with the follow-ups left to the applier, as the service runs with workers.
            exit_call = functools.partial(ends.exit, with_progress=with_progress)
            profiled = "exit" if apply_s and not with_progress else ""
            timed(profile.around(profiled, exit_call), *samples["exit"])
            ends.place()
            timed(profile.around("deliver" if apply_s else "", ends.deliver), *samples["deliver"])
            timed(profile.around("started" if apply_s else "", ends.started), *samples["started"])
            ends.measure()
        rows.append(row(label, *samples["exit"]))
    rows.append(row("start delivered (woken sync, 1 start)", *samples["deliver"]))
    rows.append(row("sync, its `started` report", *samples["started"]))
    pending = JobEndPending.objects.count()
    db_before = backend_cpu_s()
    start = time.process_time()
    done = job_end_followups_run()
    cpu_ms = (time.process_time() - start) * 1000 / max(1, done)
    db_ms = (backend_cpu_s() - db_before) * 1000 / max(1, done)
    if done != pending:
        raise RuntimeError(f"the applier followed up {done} of {pending} job ends")
    rows.append(
        [f"applier, per job end ({done})", f"{cpu_ms:.3f}", "", f"{db_ms:.3f}", "", f"{cpu_ms / base:.2f}x"]
    )
    return rows


def _parts_rows(agent: Agent, count: int) -> list[list]:
    """An interval sync with 4 progress reports (left to the applier) part by part, each timed alone,
    then the view without the middleware and the whole call, interleaved: `count` of each, medians of
    this process's CPU, the database backend's mean CPU per call. Where a sync's CPU goes without
    cProfile's own cost, which inflates the frameworks' many small functions several times over.
    The whole call three ways: the test client (Django's handler without its request signals), and as
    the image serves it from a WSGI environ, with Django's request signals (each request's connection
    health check, a `SELECT 1`, included): through Django's WSGI handler, and through the agents' path
    (config/agent_calls.py) that the image runs first. Each whole call includes the bench's own work
    (the body's JSON, the request built), timed alone in a row of its own."""
    from django.core.wsgi import get_wsgi_application
    from django.test import RequestFactory

    from cluster_app.agent_wake import wait_ticket, wake_generation
    from cluster_app.selectors import agent_credential_find
    from config.agent_calls import AgentCallsFirst
    from infra.prepared_sql import prepared_statements
    from scheduler_app.api.agent_checks import reports_check_fast, sync_body_check
    from scheduler_app.api.agent_views import REPORT_CHECKER, SYNC_CHECKER, AgentSyncView
    from scheduler_app.api.serializers.agents import AgentHeartbeatSerializer
    from scheduler_app.selectors import agent_commands
    from scheduler_app.services.agent_sync import PROGRESS_LOCK_WAIT_MS, SyncRequest
    from scheduler_app.services.agents import agent_heartbeat
    from scheduler_app.services.report_apply import LeaseReport
    from scheduler_app.services.report_ingest import agent_reports_ingest

    authorization = agent.client.defaults["HTTP_AUTHORIZATION"]
    token = authorization.split()[1]
    factory = RequestFactory(HTTP_AUTHORIZATION=authorization)
    view = AgentSyncView.as_view()
    backend_cpu_s = _backend_cpu_clock()
    cpu: dict[str, list[float]] = {}
    db: dict[str, float] = {}

    def timed(label: str, call, *args, **kwargs):
        db_before = backend_cpu_s()
        start = time.process_time()
        result = call(*args, **kwargs)
        cpu.setdefault(label, []).append((time.process_time() - start) * 1000)
        db[label] = db.get(label, 0.0) + backend_cpu_s() - db_before
        return result

    def checked(data: dict) -> SyncRequest:
        body = sync_body_check(data, SYNC_CHECKER)
        reports, _ = reports_check_fast(body["reports"], checker=REPORT_CHECKER)
        usage = AgentHeartbeatSerializer.usage_of(body["sample"])
        valid = [LeaseReport(**report) for report in reports]
        return SyncRequest(usage=usage, running=body["running"], sizes=body["sizes"], reports=valid)

    def by_parts() -> None:
        sync = timed("the checks and the request's objects", checked, json.loads(agent.body(4)))
        with prepared_statements():
            server = timed("the credential and its server", lambda: agent_credential_find(token=token).server)
            server = timed("the heartbeat", agent_heartbeat, server=server, usage=sync.usage)
            timed("the reports stored", agent_reports_ingest, server=server, reports=sync.reports,
                  lock_wait_ms=PROGRESS_LOCK_WAIT_MS)  # fmt: skip
            timed("the wake generation (Redis)", wake_generation, server.pk)
            timed("the commands", agent_commands, server=server, running=sync.running, sizes=sync.sizes)
            timed("the wait ticket", wait_ticket, server.pk)

    def view_alone() -> None:
        request = factory.post(SYNC, data=agent.body(4), content_type="application/json")
        response = view(request)
        response.render()
        if response.status_code != 200:
            raise RuntimeError(f"sync answered {response.status_code}: {response.content[:500]!r}")

    django_wsgi = get_wsgi_application()
    agents_first = AgentCallsFirst(django_wsgi)

    def built() -> None:
        """What the bench itself spends on each whole call below: the body and the request (no service)."""
        factory.post(SYNC, data=agent.body(4), content_type="application/json")

    def served(app) -> None:
        """One sync as the WSGI server hands it to `app`, its answer read and closed as the server does."""
        environ = factory.post(SYNC, data=agent.body(4), content_type="application/json").environ
        status = []
        iterable = app(environ, lambda line, headers: status.append(line))
        answer = b"".join(iterable)
        iterable.close()
        if status != ["200 OK"]:
            raise RuntimeError(f"sync answered {status}: {answer[:500]!r}")

    parts = [
        "the checks and the request's objects",
        "the credential and its server",
        "the heartbeat",
        "the reports stored",
        "the wake generation (Redis)",
        "the commands",
        "the wait ticket",
    ]
    for round_ in range(count + 20):
        if round_ == 20:  # the first calls warm up the code paths and the prepared statements
            cpu.clear()
            db.clear()
        by_parts()
        timed("the view alone (DRF, no middleware)", view_alone)
        timed("the whole call (Django's handler)", lambda: agent.sync(4))
        timed("the bench's own: a body and its request built", built)
        timed("served: Django's WSGI handler", served, django_wsgi)
        timed("served: the agents' path first", served, agents_first)

    def row(label: str) -> list:
        return [label, f"{statistics.median(cpu[label]):.3f}", f"{db[label] * 1000 / count:.3f}"]

    rows = [row(label) for label in parts]
    total = sum(statistics.median(cpu[label]) for label in parts)
    rows.append(["the parts together", f"{total:.3f}", f"{sum(db[p] for p in parts) * 1000 / count:.3f}"])
    rows += [row("the view alone (DRF, no middleware)"), row("the whole call (Django's handler)")]
    rows += [row("the bench's own: a body and its request built")]
    rows += [row("served: Django's WSGI handler"), row("served: the agents' path first")]
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--syncs", type=int, default=200, help="measured calls per kind")
    parser.add_argument("--exits", type=int, default=100, help="measured exits (job ends) per kind")
    parser.add_argument("--keep", action="store_true", help="keep the database afterwards")
    parser.add_argument("--db", default="attune_bench_sync", help="the bench's database (created afresh)")
    parser.add_argument(
        "--redis-url",
        default="redis://127.0.0.1:6379/14",
        help="Redis for the few keys a sync sets (an exit's apply request); nothing is flushed",
    )
    parser.add_argument(
        "--profile",
        choices=PROFILE_KINDS,
        default=None,
        help="cProfile one kind of call (sync0, sync4: a sync with 0 or 4 progress reports left to the"
        " applier; exit, deliver, started: a job's end's calls) and print where its CPU goes (that kind's"
        " figures then carry the profiler's own overhead)",
    )
    parser.add_argument(
        "--parts",
        action="store_true",
        help="instead of the kinds: an interval sync with 4 reports part by part, each timed alone, with"
        " the view without the middleware and the whole call (--syncs of each)",
    )
    parser.add_argument(
        "--served",
        action="store_true",
        help="every agent call as the image serves it: a WSGI environ through the agents' path"
        " (config/agent_calls.py) first, with Django's request signals, instead of the test client",
    )
    args = parser.parse_args(argv)
    logging_setup()
    profile = Profile(args.profile)
    with bench_database(args.db, keep=args.keep) as url:
        # Agents' wakes on, as the service runs with workers: a sync reads its server's wake generation
        # and signs a wait ticket, an exit wakes the agents of its job's next leases (Redis).
        django_setup(url, ATTUNE_AGENT_WAKE="1", REDIS_URL=args.redis_url)
        client, leases, gpus = _setup()
        if args.served:
            client = ServedClient(client)
        agent = Agent(client, leases, gpus)
        agent.sync(0)  # the leases' `started` reports
        if args.parts:
            from django.conf import settings

            settings.ATTUNE_SCHEDULER = {**settings.ATTUNE_SCHEDULER, "inline_rounds": False,
                                         "progress_apply_s": 2.0}  # fmt: skip
            print_table(
                ["part of a sync, 4 reports", "cpu ms p50", "postgres cpu ms"], _parts_rows(agent, args.syncs)
            )
            return 0
        rows = []
        healthz, healthz_db, healthz_q = _measure(lambda: client.get("/healthz"), args.syncs)
        base = percentile(healthz, 50)
        rows.append(["GET /healthz", f"{base:.2f}", f"{percentile(healthz, 90):.2f}", f"{healthz_db:.2f}",
                     healthz_q, "1.0x"])  # fmt: skip
        for reports in (0, 1, 8):
            cpu, db_ms, statements = _measure(lambda n=reports: agent.sync(n), args.syncs)
            p50 = percentile(cpu, 50)
            p90 = percentile(cpu, 90)
            rows.append([f"sync, {reports} reports", f"{p50:.2f}", f"{p90:.2f}", f"{db_ms:.2f}", statements,
                         f"{p50 / base:.1f}x"])  # fmt: skip
        # The same syncs with progress left to the worker's applier (the default with workers), then
        # the applier's own cost per report, applying all that these syncs left pending.
        from django.conf import settings

        from scheduler_app.models import AgentReportPending

        deferred = {"inline_rounds": False, "progress_apply_s": 2.0}
        settings.ATTUNE_SCHEDULER = {**settings.ATTUNE_SCHEDULER, **deferred}
        for reports in (1, 8):
            cpu, db_ms, statements = _measure(lambda n=reports: agent.sync(n), args.syncs)
            p50 = percentile(cpu, 50)
            rows.append([f"sync, {reports} reports, applier", f"{p50:.2f}", f"{percentile(cpu, 90):.2f}",
                         f"{db_ms:.2f}", statements, f"{p50 / base:.1f}x"])  # fmt: skip
        rows.append(_applier_row(AgentReportPending.objects.count(), base))
        if args.profile in ("sync0", "sync4"):
            reports = 0 if args.profile == "sync0" else 4
            _measure(profile.around(args.profile, lambda: agent.sync(reports)), args.syncs)
        rows += _job_end_rows(args.exits, base, profile, served=args.served)
        logger.info("%d calls per kind measured", args.syncs)
        print_table(["call", "cpu ms p50", "cpu ms p90", "postgres cpu ms", "statements", "x healthz"], rows)
        profile.print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
