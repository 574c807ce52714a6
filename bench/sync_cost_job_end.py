"""The sync bench's job end, call by call: an exit's sync, the start delivered, its `started` report."""

from __future__ import annotations

import functools
import json
import time
from datetime import UTC, datetime, timedelta

from bench.live_common import percentile
from bench.sync_cost_measure import Profile, backend_cpu_clock, backlog_row
from bench.sync_cost_setup import SYNC, ServedClient


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


def job_end_rows(count: int, base: float, profile: Profile | None = None, served: bool = False) -> list[list]:
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
    backend_cpu_s = backend_cpu_clock()

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
    rows.append(backlog_row(job_end_followups_run, JobEndPending.objects.count(), base, "job end"))
    return rows
