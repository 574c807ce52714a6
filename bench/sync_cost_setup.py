"""The sync bench's set-up: one server running 8 jobs, its client (test or as served) and its agent."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

from bench.live_common import servers_create

SYNC = "/api/v1/agent/sync"


def setup():
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
