"""End to end: a real Celery worker, real agent processes and real (synthetic) training jobs.

PostgreSQL and Redis only. Jobs are submitted through the REST API, scheduled by Celery rounds
(tune + FIFO), started by agents as real processes pinned to their cores, and followed to the end.
"""

from __future__ import annotations

import itertools
import sqlite3
import subprocess
import sys
from collections import defaultdict

import httpx
import pytest
from django.utils import timezone
from rest_framework.authtoken.models import Token

from cluster_app.models import NodeState, Server
from profiles_app.catalog import profile_for
from profiles_app.services.workloads import workload_catalog_load
from scheduler_app.models import AgentReport, Allocation, AllocationGpu, Job, JobEvent, JobState
from tests.e2e.processes import wait_until
from tests.factories import UserFactory
from tests.standalone import standalone_env

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(420)]

TIME_SCALE = 0.02
IMAGE_MODELS = {"res18", "alexnet", "mobilenet", "shufflenet", "res50"}
# Ten jobs of mixed catalog models (model, GPUs), 12 GPUs in all on 3 servers x 4 GPUs.
MIXED_JOBS = [
    ("res18", 1),
    ("alexnet", 1),
    ("mobilenet", 1),
    ("shufflenet", 2),
    ("m5", 1),
    ("deepspeech", 1),
    ("lstm", 1),
    ("gnmt", 2),
    ("transformer", 1),
    ("res50", 1),
]


def iters_for(model: str, seconds_at_proportional: float) -> int:
    """Iterations that take about `seconds_at_proportional` at the GPU-proportional share."""
    return max(10, int(seconds_at_proportional / (profile_for(model).iter_time_s * TIME_SCALE)))


def submit_all(
    live_server, jobs: list[tuple[str, int]], seconds: float, image_seconds: float | None = None
) -> list[int]:
    workload_catalog_load()
    user = UserFactory(username="e2e-user")
    token = Token.objects.create(user=user)
    ids = []
    with httpx.Client(base_url=live_server.url, headers={"Authorization": f"Token {token.key}"}) as client:
        for i, (model, gpus) in enumerate(jobs):
            response = client.post(
                "/api/v1/jobs/",
                json={
                    "name": f"{model}-{i}",
                    "workload": model,
                    "num_gpus": gpus,
                    "total_iters": iters_for(
                        model, image_seconds if model in IMAGE_MODELS and image_seconds else seconds
                    ),
                },
            )
            assert response.status_code == 201, response.text
            ids.append(response.json()["id"])
    return ids


def all_done(job_ids: list[int]) -> bool:
    states = set(Job.objects.filter(id__in=job_ids).values_list("state", flat=True))
    failed = states & {JobState.FAILED, JobState.CANCELLED, JobState.OUT_OF_MEMORY, JobState.TIMEOUT}
    assert not failed, list(Job.objects.filter(id__in=job_ids).values("id", "name", "state", "exit_code"))
    return states == {JobState.COMPLETED}


def assert_no_gpu_double_booked() -> None:
    """Across the whole history: the holds of each GPU never overlap in time."""
    now = timezone.now()
    holds = defaultdict(list)
    for gpu_id, start, released in AllocationGpu.objects.values_list(
        "gpu_id", "allocation__started_at", "released_at"
    ):
        holds[gpu_id].append((start, released or now))
    assert holds, "no GPU was ever allocated"
    for gpu_id, intervals in holds.items():
        intervals.sort()
        for (_, end), (next_start, _) in itertools.pairwise(intervals):
            assert next_start >= end, f"GPU {gpu_id} held twice at {next_start}"
    assert not AllocationGpu.objects.filter(released_at__isnull=True).exists()


def test_ten_mixed_jobs_complete_on_three_agents(start_agents, live_server):
    agents = start_agents(3)
    wait_until(
        lambda: Server.objects.filter(gpus__isnull=False).distinct().count() == 3,
        timeout_s=60,
        what="three agents to register",
    )
    # Image jobs run longer, so that the cluster has spare cores for them once the others are done.
    job_ids = submit_all(live_server, MIXED_JOBS, seconds=5, image_seconds=20)
    # An evaluation step after two of them (afterok): GPUs are free for it long before they end.
    token = Token.objects.get(user__username="e2e-user")
    response = httpx.post(
        f"{live_server.url}/api/v1/jobs/",
        headers={"Authorization": f"Token {token.key}"},
        json={
            "name": "evaluate",
            "workload": "m5",
            "num_gpus": 1,
            "total_iters": iters_for("m5", 2),
            "depends_on": [job_ids[0], job_ids[6]],
        },
    )
    assert response.status_code == 201, response.text
    evaluate = response.json()["id"]
    job_ids.append(evaluate)

    wait_until(lambda: all_done(job_ids), timeout_s=300, what="all eleven jobs to complete", interval_s=1)
    deps_finished = max(
        Job.objects.filter(id__in=job_ids[:1] + job_ids[6:7]).values_list("finished_at", flat=True)
    )
    assert Job.objects.get(pk=evaluate).started_at >= deps_finished

    assert_no_gpu_double_booked()
    for job in Job.objects.filter(id__in=job_ids):
        assert job.done_iters >= job.total_iters, job.name
        assert JobEvent.objects.filter(job=job, to_state=JobState.COMPLETED).exists()
        assert (
            JobEvent.objects.filter(job=job, kind="process_started").exists()
            or AgentReport.objects.filter(allocation__job=job, kind="started").exists()
        )
    # Synergy's point: image models get more than the GPU-proportional 3 cores per GPU when there is room.
    # A lease resized in place keeps its row (its last size): the sizes it had are in its `resized` events.
    for job in Job.objects.filter(id__in=job_ids, workload__name__in=IMAGE_MODELS - {"res50"}):
        sizes = [a.num_cpus / a.gpu_holds.count() for a in Allocation.objects.filter(job=job)]
        for event in JobEvent.objects.filter(job=job, kind="resized"):
            sizes += [event.data["from"]["cpus"] / job.num_gpus, event.data["to"]["cpus"] / job.num_gpus]
        assert max(sizes) > 3, f"{job.name} never got more than 3 cores per GPU"
    # The processes really were pinned as decided (the agent reports its isolation and cores).
    started = AgentReport.objects.filter(kind="started")
    assert started.count() >= len(job_ids)
    assert {r.data.get("isolation") for r in started} == {"affinity+rlimit"}
    for agent in agents:
        assert agent.proc.poll() is None, agent.log_text()[-2000:]


def spool_pending(db_path) -> set[tuple[str, int]]:
    with sqlite3.connect(db_path) as db:
        return {(lease, seq) for lease, seq in db.execute("SELECT lease_id, seq FROM reports")}


def spool_drained(db_path) -> bool:
    """No report waits for its acknowledgement and no lease is live. An empty `reports` table alone
    is not the end: a restarted agent writes the `exited` reports of the leases it finds dead in its
    `leases` table after it started, so right after the start both tables must be read."""
    with sqlite3.connect(db_path) as db:
        reports = db.execute("SELECT COUNT(*) FROM reports").fetchone()[0]
        leases = db.execute("SELECT COUNT(*) FROM leases").fetchone()[0]
    return reports == 0 and leases == 0


def test_killed_agent_jobs_requeue_and_complete_elsewhere(start_agents, live_server):
    agents = start_agents(3)
    wait_until(
        lambda: Server.objects.filter(gpus__isnull=False).distinct().count() == 3,
        timeout_s=60,
        what="three agents to register",
    )
    job_ids = submit_all(
        live_server,
        [("res18", 1), ("lstm", 1), ("m5", 2), ("gnmt", 1), ("alexnet", 1), ("transformer", 2)],
        seconds=25,
    )

    def victim_server() -> Server | None:
        for server in Server.objects.all():
            running = Allocation.objects.filter(server=server, ended_at__isnull=True)
            if (
                running.exists()
                and AgentReport.objects.filter(allocation__in=running, kind="progress").exists()
            ):
                return server
        return None

    wait_until(lambda: victim_server() is not None, timeout_s=120, what="a node with jobs making progress")
    server = victim_server()
    victim = next(a for a in agents if a.name == server.name)
    victim_jobs = set(
        Allocation.objects.filter(server=server, ended_at__isnull=True).values_list("job_id", flat=True)
    )
    victim.kill()
    stored_before = {(str(r.lease_id), r.seq) for r in AgentReport.objects.filter(allocation__server=server)}

    wait_until(
        lambda: Server.objects.get(pk=server.pk).state == NodeState.DOWN,
        timeout_s=60,
        what=f"{server.name} to be marked DOWN",
    )
    wait_until(lambda: all_done(job_ids), timeout_s=300, what="all jobs to complete", interval_s=1)

    for job_id in victim_jobs:
        assert JobEvent.objects.filter(job_id=job_id, to_state=JobState.NODE_FAIL).exists()
        last = Allocation.objects.filter(job_id=job_id).order_by("-started_at").first()
        assert last.server_id != server.pk, "a requeued job completed on the dead node"
    assert_no_gpu_double_booked()

    # Every report the dead agent sent was stored once: per lease, the stored seqs are 1..n with no gap,
    # and what is still in its spool (never acknowledged) comes after.
    pending = spool_pending(victim.spool_db / "spool.sqlite3")
    by_lease = defaultdict(set)
    for lease, seq in stored_before:
        by_lease[lease].add(seq)
    assert by_lease, "the dead agent had reported nothing"
    for lease, seqs in by_lease.items():
        assert seqs == set(range(1, max(seqs) + 1)), f"lease {lease}: gap in stored reports {sorted(seqs)}"
        assert all(seq > max(seqs) or (lease, seq) in stored_before for (lz, seq) in pending if lz == lease)

    # The node comes back: its spool is delivered, nothing is counted twice, and no finished job changes.
    done_iters = dict(Job.objects.filter(id__in=job_ids).values_list("id", "done_iters"))
    victim.start()
    wait_until(
        lambda: spool_drained(victim.spool_db / "spool.sqlite3"),
        timeout_s=60,
        what="the restarted agent to deliver its spool and close its dead leases",
    )
    wait_until(
        lambda: Server.objects.get(pk=server.pk).state != NodeState.DOWN,
        timeout_s=30,
        what=f"{server.name} to come back",
    )
    after = [(str(r.lease_id), r.seq) for r in AgentReport.objects.filter(allocation__server=server)]
    assert len(after) == len(set(after)), "a report was stored twice"
    assert set(after) >= stored_before | pending
    assert set(Job.objects.filter(id__in=job_ids).values_list("state", flat=True)) == {JobState.COMPLETED}
    assert dict(Job.objects.filter(id__in=job_ids).values_list("id", "done_iters")) == done_iters


def test_an_array_from_the_command_line_runs_each_task_with_its_index(start_agents, live_server, job_runtime):
    """The cli as a real process: an array of own commands, `--wait` until all completed; each
    task's process saw its index under Attune's and Slurm's names."""
    start_agents(1)
    wait_until(lambda: Server.objects.filter(gpus__isnull=False).exists(), timeout_s=60, what="the agent")
    user = UserFactory(username=job_runtime.account)  # own commands run as the owner's Unix account
    env = {**standalone_env(), "ATTUNE_TOKEN": Token.objects.create(user=user).key}
    command = 'echo "task=$ATTUNE_ARRAY_TASK_ID slurm=$SLURM_ARRAY_TASK_ID of $SLURM_ARRAY_JOB_ID"'
    argv = ["submit", "sweep", "--command", command, "--gpus", "1", "--iters", "1", "--array", "0-2"]
    result = subprocess.run(
        [sys.executable, "-m", "cli", "--server", live_server.url, *argv, "--wait", "--poll-s", "0.5"],
        # As sbatch's, the job's working directory (and its output's) is where the command line ran.
        cwd=job_runtime.make_shared_dir("attune-sweep-"),
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    tasks = list(Job.objects.filter(name="sweep").order_by("array_task_id"))
    assert [t.state for t in tasks] == [JobState.COMPLETED] * 3
    for task in tasks:
        log = "\n".join(a.log_tail for a in task.allocations.all())
        assert f"task={task.array_task_id} slurm={task.array_task_id} of {tasks[0].pk}" in log, log
        assert f"job {task.pk}: COMPLETED" in result.stdout
