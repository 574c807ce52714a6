"""End to end: a job of an unprofiled workload is profiled by a real agent process, then placed with it.

PostgreSQL, Redis, a real Celery worker running the rounds, a real agent process measuring the workload
(the synthetic one, which runs at a hidden ground truth only its process sees). The scheduler learns
the workload's CPU sensitivity from the profiling run alone, and its allocation follows from that.
"""

from __future__ import annotations

import httpx
import pytest
from rest_framework.authtoken.models import Token

from cluster_app.models import Server
from profiles_app.catalog import load_catalog
from profiles_app.models import ProfilingKind, ProfilingRun, ProfilingRunStatus, SpeedObservation, Workload
from profiles_app.optimistic import relative_error
from profiles_app.services.workloads import workload_register
from scheduler_app.models import Allocation, Job, JobEvent, JobState, PendingReason
from tests.e2e.processes import wait_until
from tests.factories import UserFactory

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

TIME_SCALE = 0.02


def cpu_hungry_truth() -> dict:
    """AlexNet's CPU curve (12 cores per GPU for 2.94x), insensitive to memory: the hidden ground truth."""
    alexnet = load_catalog()["alexnet"]
    return {
        "iter_time_s": alexnet.iter_time_s,
        "cpu_per_gpu_grid": list(alexnet.cpu_per_gpu_grid),
        "mem_gb_per_gpu_grid": list(alexnet.mem_gb_per_gpu_grid),
        "tput": [[row[-1]] * len(row) for row in alexnet.tput],
    }


def test_an_unprofiled_workload_is_profiled_by_an_agent_and_its_job_gets_more_cores(
    start_agents, live_server
):
    (agent,) = start_agents(1, gpus=4, cpus=12, mem_gb=250.0, time_scale=TIME_SCALE)
    wait_until(lambda: Server.objects.filter(gpus__isnull=False).exists(), timeout_s=60, what="the agent")
    truth = cpu_hungry_truth()
    workload = workload_register(name="users-cnn", workload_class="image", ground_truth=truth)
    assert not workload.tput_matrix  # registered by name: nothing known about it

    user = UserFactory(username="e2e-profiler")
    token = Token.objects.create(user=user)
    # ~8 s at 12 cores per GPU (2.94x), ~24 s at the proportional 3.
    iters = int(8 * 2.94 / (truth["iter_time_s"] * TIME_SCALE))
    with httpx.Client(base_url=live_server.url, headers={"Authorization": f"Token {token.key}"}) as client:
        response = client.post(
            "/api/v1/jobs/",
            json={"name": "mine", "workload": "users-cnn", "num_gpus": 1, "total_iters": iters},
        )
        assert response.status_code == 201, response.text
        job_id = response.json()["id"]

        # Held while its workload is profiled: PENDING, reason Profiling, nothing allocated.
        wait_until(
            lambda: Job.objects.get(pk=job_id).pending_reason == PendingReason.PROFILING,
            timeout_s=30,
            what="the job to wait for its profile",
        )
        shown = client.get(f"/api/v1/jobs/{job_id}/").json()
        assert shown["state"] == JobState.PENDING and shown["pending_reason"] == PendingReason.PROFILING

    def run() -> ProfilingRun:
        # Synergy's run (GENIE's lightweight profile follows it by itself: tests/e2e/test_genie_profiling.py).
        return ProfilingRun.objects.get(workload__name="users-cnn", kind=ProfilingKind.SYNERGY_CPU_SWEEP)

    wait_until(
        lambda: run().status in (ProfilingRunStatus.SUCCEEDED, ProfilingRunStatus.FAILED),
        timeout_s=120,
        what="the profiling run to end",
        interval_s=1,
    )
    done = run()
    assert done.status == ProfilingRunStatus.SUCCEEDED, (done.error, agent.log_text()[-3000:])
    assert not Allocation.objects.filter(job_id=job_id, started_at__lt=done.finished_at).exists()
    assert 2 <= len(done.measured_points) <= 9 and done.cost_gpu_s > 0 and done.server.name == "node1"
    assert {p["cpus"] for p in done.measured_points} <= {1, 2, 3, 4, 5, 6, 9, 12}
    assert done.host["mem_gbps"] > 0 and done.host["disk_mbps"] > 0

    # The stored profile is what the agent measured: the ground truth's CPU axis within 3 %.
    workload = Workload.objects.get(name="users-cnn")
    assert workload.source.startswith("profiled on node1")
    for row, true_row in zip(workload.tput_matrix[:-1], truth["tput"][:-1], strict=True):  # up to 12 cores
        assert relative_error(row[-1], true_row[-1]) <= 0.03, (row, true_row)
    assert workload.best_cpus_per_gpu == 12.0 and workload.speedup == pytest.approx(2.94, rel=0.03)

    # The next round uses it: more than the proportional 3 cores per GPU, and the job completes.
    wait_until(
        lambda: Job.objects.get(pk=job_id).state == JobState.COMPLETED,
        timeout_s=90,
        what="the job to complete",
        interval_s=1,
    )
    (allocation,) = Allocation.objects.filter(job_id=job_id)
    assert allocation.num_cpus > 3 and allocation.speedup > 2.5
    events = list(JobEvent.objects.filter(job_id=job_id).values_list("kind", flat=True))
    assert events.index("profiling") < events.index("scheduled")
    # The process ran at its ground truth; the scheduler predicted from the measured profile.
    observation = SpeedObservation.objects.get(allocation=allocation)
    assert relative_error(observation.measured_iters_per_s, observation.predicted_iters_per_s) <= 0.05
    assert agent.proc.poll() is None
