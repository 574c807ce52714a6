"""More than one host: two web servers and two rounds workers on one PostgreSQL and Redis, each agent
talking to its own web server, jobs submitted through both. Every job completes exactly once (its
events), and no GPU is ever held by two overlapping leases (the Allocation rows).

One machine plays both hosts: the second web server and worker are separate processes on their own
port and Celery node name, sharing nothing with the first but the database and Redis, as on two
hosts. Beat runs once, in the first worker (docs/deploy.md, "Outgrowing one host").
"""

from __future__ import annotations

import os
import signal
import subprocess
import time

import httpx
import pytest

from tests.e2e.processes import celery_worker_argv
from tests.faults.agents import iters_for
from tests.faults.processes import PYTHON, REPO_ROOT, free_port, kill_group, wait_until
from tests.faults.stack import Stack, summary

pytestmark = [pytest.mark.faults, pytest.mark.timeout(240)]

JOBS = 16  # on 2 nodes x 4 GPUs: two waves or more


def second_worker_argv(node_name: str) -> list[str]:
    """The rounds' worker of the second host: the default queue, without beat (-B) and its schedule."""
    argv = celery_worker_argv(schedule=REPO_ROOT, node_name=node_name)
    at = argv.index("-s")
    del argv[at : at + 2]
    argv.remove("-B")
    return argv


@pytest.fixture
def two_hosts(private_services, faults_root, faults_job_runtime, request):
    """Host A: web, rounds worker with beat, forecasts worker, agent node1. Host B: web, rounds worker
    (no beat), agent node2. Yields (stack, web B's URL, worker B's log path)."""
    root = faults_root / request.node.name
    root.mkdir()
    root.chmod(0o711)
    s = Stack(private_services, root, agent_args=faults_job_runtime.agent_args)
    port_b = free_port()
    url_b = f"http://127.0.0.1:{port_b}"
    web_b = worker_b = None
    try:
        s.start_web(wait=False)
        s.start_worker(wait=False)
        s.start_forecasts_worker()
        with (root / "web-b.log").open("a") as log:
            web_b = subprocess.Popen(
                [PYTHON, "-m", "gunicorn", "-c", "config/gunicorn.conf.py"],
                cwd=REPO_ROOT,
                env={**s.env, "ATTUNE_BIND": f"127.0.0.1:{port_b}", "WEB_CONCURRENCY": "2"},
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        with (root / "worker-b.log").open("a") as log:
            worker_b = subprocess.Popen(
                second_worker_argv(f"hostb-{os.getpid()}@%h"),
                cwd=REPO_ROOT,
                env=s.env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        s.wait_web()
        s.wait_worker()
        s.wait_forecasts_worker()
        wait_until(
            lambda: (
                httpx.get(f"{url_b}/healthz", timeout=2).status_code == 200
                if web_b.poll() is None
                else pytest.fail((root / "web-b.log").read_text()[-3000:])
            ),
            timeout_s=60,
            what="the second web server",
        )
        wait_until(
            lambda: "ready." in (root / "worker-b.log").read_text(),
            timeout_s=60,
            what="the second rounds worker",
        )
        node2 = s.agents[1]
        node2.args[node2.args.index("--server") + 1] = url_b  # node2's agent talks to host B
        for agent in s.agents:
            agent.start()
        s.wait_registered()
        yield s, url_b, root / "worker-b.log"
    finally:
        s.stop_all()
        kill_group(web_b, signal.SIGKILL)
        kill_group(worker_b, signal.SIGKILL)


def test_two_web_servers_and_two_rounds_workers_complete_every_job_once(two_hosts):
    stack, url_b, worker_b_log = two_hosts
    t0 = time.monotonic()
    api_b = httpx.Client(base_url=url_b, headers=stack.api.headers, timeout=30)
    ids: list[int] = []
    try:
        for i in range(JOBS):
            api = stack.api if i % 2 == 0 else api_b  # half through each web server
            body = {"name": f"two-hosts-{i}", "workload": "res18", "num_gpus": 1}
            body["total_iters"] = iters_for("res18", seconds=4)
            response = api.post("/api/v1/jobs/", json=body)
            assert response.status_code == 201, response.text
            ids.append(response.json()["id"])
    finally:
        api_b.close()
    figures = stack.finish_and_check(ids, timeout_s=150)

    # Each job completed exactly once: one COMPLETED event, whichever worker ran the round.
    completed = dict(
        stack.sql(
            "SELECT job_id, COUNT(*) FROM scheduler_app_jobevent WHERE job_id = ANY(%s) "
            "AND to_state = 'COMPLETED' GROUP BY job_id",
            [ids],
        )
    )
    assert completed == {job: 1 for job in ids}, completed
    # No GPU held twice at once, over the whole history (Allocation and AllocationGpu rows).
    assert stack.overlapping_gpu_holds() == []
    # Both agents ran jobs, and both workers ran rounds (the round lock kept them one at a time).
    nodes = dict(
        stack.sql(
            "SELECT s.name, COUNT(DISTINCT a.job_id) FROM scheduler_app_allocation a "
            "JOIN cluster_app_server s ON s.id = a.server_id WHERE a.job_id = ANY(%s) GROUP BY s.name",
            [ids],
        )
    )
    assert set(nodes) == {"node1", "node2"}, nodes
    round_task = "scheduler_app.tasks.scheduling_round_task"
    rounds_a = stack.worker_log().count(round_task)
    rounds_b = worker_b_log.read_text().count(round_task)
    assert rounds_a > 0 and rounds_b > 0, f"round tasks: host A {rounds_a}, host B {rounds_b}"
    print(
        summary(
            "two hosts",
            figures,
            f"jobs per node {nodes}; round tasks on host A's worker {rounds_a}, on host B's {rounds_b}",
            f"{time.monotonic() - t0:.0f} s",
        )
    )
