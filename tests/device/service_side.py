"""The service's side of the GPU-machine check (README.md), run here against a database of its own.

`command NODE_TOKEN PYTHON OUT.json`: register the node as the agent's recorded registration would,
submit an own-command job that checks CUDA with PYTHON, run a round and write the start command the
node's sync gets. `replay NODE_TOKEN REQUESTS.jsonl`: send the agent's recorded syncs (their GPUs
renamed to the registered ones) and print the job's state and events.
Environment: DJANGO_SETTINGS_MODULE=config.settings, DATABASE_URL, REDIS_URL, ATTUNE_INLINE_ROUNDS=1.
"""

from __future__ import annotations

import json
import sys
from datetime import UTC, datetime
from pathlib import Path

import django

django.setup()

from django.contrib.auth import get_user_model  # noqa: E402 - after django.setup()
from django.test import Client  # noqa: E402

from scheduler_app.models import Job  # noqa: E402
from scheduler_app.services.rounds import scheduling_round_run  # noqa: E402

CUDA_CHECK = (
    "import os, torch; print('CUDA_VISIBLE_DEVICES', os.environ.get('CUDA_VISIBLE_DEVICES')); "
    "print('cuda', torch.cuda.is_available(), torch.cuda.device_count(), torch.cuda.get_device_name(0)); "
    "x = torch.randn(4096, 4096, device='cuda'); print('matmul ok', bool((x @ x).sum().isfinite()))"
)
REGISTRATION = {
    "agent_version": "1.0.0",
    "hostname": "gpunode",
    "address": "",
    "num_cpus": 16,
    "mem_gb": 125.9,
    "storage_mbps": 0.0,
    "gpus": [
        {
            "index": 0,
            "uuid": "GPU-00000000-0000-0000-0000-000000000000",
            "model": "NVIDIA H200",
            "memory_mb": 143771,
        }
    ],
    "cgroup_mode": "affinity+rlimit",
    "time_scale": 1.0,
    "features": ["resize"],
}


def _now() -> str:
    return datetime.now(UTC).isoformat().replace("+00:00", "Z")


def _agent(token: str) -> Client:
    agent = Client(HTTP_AUTHORIZATION=f"Bearer {token}")
    agent.post("/api/v1/agent/register", data=json.dumps(REGISTRATION), content_type="application/json")
    return agent


def _sync(agent: Client, reports: list[dict]) -> dict:
    body = {
        "sample": {"sampled_at": _now(), "cpu_util_pct": 0.0, "mem_used_gb": 1.0, "gpus": []},
        "running": [],
        "reports": reports,
        "sizes": {},
    }
    return agent.post("/api/v1/agent/sync", data=json.dumps(body), content_type="application/json").json()


def command(token: str, python: str, out: Path) -> None:
    agent = _agent(token)
    user, _ = get_user_model().objects.get_or_create(username="devuser")
    web = Client()
    web.force_login(user)
    job = {
        "name": "gpu-check",
        "command": f'{python} -c "{CUDA_CHECK}"',
        "num_gpus": 1,
        "total_iters": 1,
        "time_limit_s": 600,
        "chdir": "/tmp",
    }
    print("submitted:", web.post("/api/v1/jobs/", job, content_type="application/json").status_code)
    scheduling_round_run(trigger="manual")
    commands = _sync(agent, [])["commands"]
    out.write_text(json.dumps(commands))
    print(f"{len(commands)} command(s) written to {out}")


def replay(token: str, requests: Path) -> None:
    agent, uuid = _agent(token), REGISTRATION["gpus"][0]["uuid"]
    reports: dict[tuple[str, int], dict] = {}
    for line in requests.read_text().splitlines():
        for report in json.loads(line)["body"].get("reports", []):
            if "gpu_uuids" in report.get("data", {}):
                report["data"]["gpu_uuids"] = [uuid]
            reports.setdefault((report["lease_id"], report["seq"]), report)
    answer = _sync(agent, [reports[key] for key in sorted(reports)])
    print("acked:", answer.get("acked"), "rejected:", answer.get("rejected"))
    job = Job.objects.order_by("-pk").first()
    print(job.state, job.exit_code, list(job.events.order_by("pk").values_list("kind", flat=True)))


if __name__ == "__main__":
    if sys.argv[1] == "command":
        command(sys.argv[2], sys.argv[3], Path(sys.argv[4]))
    else:
        replay(sys.argv[2], Path(sys.argv[3]))
