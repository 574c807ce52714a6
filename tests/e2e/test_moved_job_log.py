"""End to end: an own command writing its output file is stopped mid-run and runs again from step 1 on
a new lease (the demo's moved job); the log the service shows (`cli log`, the API) is that file, line
for line, with the first run's lines once (issue 36: they were shown twice)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from django.db import transaction
from rest_framework.authtoken.models import Token

from cluster_app.models import Server
from scheduler_app.models import Allocation, Job, JobState
from scheduler_app.selectors import job_log_tail
from scheduler_app.services.job_control import job_requeue
from tests.e2e.processes import wait_until
from tests.factories import UserFactory
from tests.standalone import ROOT, standalone_env

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

# No checkpoint: every start begins at step 1 and appends to the same file (the shim opens it O_APPEND).
# Long enough that the first run is still going when the stop reaches it: its lines reach the service
# with the agent's next sync (log lines are not urgent), then the stop with the one after.
STEP_COUNT = 20
STEPS = f'for i in $(seq 1 {STEP_COUNT}); do echo "step $i of $ATTUNE_LEASE_ID"; sleep 0.3; done'


def cli(live_server, env: dict[str, str], cwd: Path, *argv: str) -> str:
    result = subprocess.run(
        [sys.executable, "-m", "cli", "--server", live_server.url, *argv],
        cwd=cwd,
        env={**env, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


def test_the_log_of_a_job_stopped_and_started_again_equals_its_output_file(
    start_agents, live_server, job_runtime
):
    start_agents(2, gpus=2, cpus=4, mem_gb=64.0)
    wait_until(lambda: Server.objects.filter(address="127.0.0.1").count() == 2, timeout_s=60, what="2 agents")
    user = UserFactory(username=job_runtime.account)
    env = {**standalone_env(), "ATTUNE_TOKEN": Token.objects.create(user=user).key}
    workdir = job_runtime.make_shared_dir("attune-moved-")
    submit = ("submit", "moved", "--command", STEPS, "--gpus", "1", "--output", "moved.out")
    cli(live_server, env, workdir, *submit)
    job = Job.objects.get(owner=user)

    wait_until(
        lambda: "step 4" in " ".join(job_log_tail(job=job)), timeout_s=90, what="the first run's 4th line"
    )
    first = Allocation.objects.get(job=job)
    # Stopped by no fault of its own (as a round's move or preemption ends its lease): SIGTERM, the
    # process exits, and the next round starts it again, from step 1, on a new lease.
    with transaction.atomic():
        job_requeue(job=Job.objects.select_for_update().get(pk=job.pk), reason="preempted", lost_work_s=12.5)

    def completed() -> bool:
        job.refresh_from_db()
        assert job.state in (JobState.PENDING, JobState.RUNNING, JobState.COMPLETED), job.state
        return job.state == JobState.COMPLETED

    wait_until(completed, timeout_s=120, what="the job to complete on its second lease")
    leases = list(job.allocations.order_by("started_at", "id"))
    assert len(leases) == 2 and leases[0] == first and leases[0].end_reason == "preempted"

    output = (workdir / "moved.out").read_text().splitlines()
    runs = [[line for line in output if line.endswith(str(lease.lease_id))] for lease in leases]
    assert 4 <= len(runs[0]) < STEP_COUNT and len(runs[1]) == STEP_COUNT, output
    assert runs[0] + runs[1] == output, output
    assert runs[0][0].startswith("step 1 ") and runs[1][0].startswith("step 1 ")  # it really began again
    # The page's and `cli log`'s tail (the API's) are the file, the first run's lines once.
    assert job_log_tail(job=job) == output
    assert cli(live_server, env, workdir, "log", str(job.pk)).splitlines() == output
    # And `cli show` counts the restart and the GPU time it lost (1 GPU x the work redone, plus the
    # second lease's start-up when the agent measured one): the node's seconds, the job's 12.5 s of
    # work times the fake node's time scale (docs/restarts.md).
    restarts = json.loads(cli(live_server, env, workdir, "show", str(job.pk), "--json"))["restarts"]
    assert (restarts["requeues"], restarts["restarts"], restarts["moves"]) == (1, 1, 0), restarts
    scale = leases[0].server.time_scale
    assert scale < 1 and restarts["gpu_s_lost"] >= 12.5 * scale * (1 - 1e-9), restarts
