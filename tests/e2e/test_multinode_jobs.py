"""End to end: a batch script on two servers as its owner's Unix account, with a real torch.distributed
rendezvous, a preemption it survives through its checkpoint, and an agent that dies under it.

The script is docs/examples/ddp_multinode.sh and its trainer docs/examples/train_ddp.py, run as they
are documented (so the documentation cannot rot): torchrun on each server with the rendezvous Attune
sets, gloo all-reduces on CPU, a checkpoint in the shared working directory.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from django.db import transaction
from rest_framework.authtoken.models import Token

from cluster_app.models import NodeState, Server
from scheduler_app.models import AgentReport, Allocation, Job, JobEvent, JobState
from scheduler_app.services.job_control import job_requeue
from tests.e2e.processes import wait_until
from tests.e2e.test_live_cluster import assert_no_gpu_double_booked
from tests.factories import UserFactory
from tests.standalone import ROOT, standalone_env

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(480)]

EXAMPLES = ROOT / "docs" / "examples"
DEMO_PACING = "--step-s 0.3"


def pytest_torch_or_skip() -> None:
    pytest.importorskip("torch", reason="the CPU build of PyTorch (requirements-profiling.txt) is needed")


def submit_example(live_server, job_runtime, *, step_s: float | None = None) -> tuple[Job, Path]:
    """`python -m cli submit ddp_multinode.sh` from a working directory holding the trainer; `step_s`
    replaces the script's demo pacing (`--step-s 0.3`, seconds slept per step), and nothing else."""
    workdir = job_runtime.make_shared_dir("attune-ddp-")
    for name in ("ddp_multinode.sh", "train_ddp.py"):
        shutil.copy(EXAMPLES / name, workdir / name)
        job_runtime.give(workdir / name)
    if step_s is not None:
        script = workdir / "ddp_multinode.sh"
        text = script.read_text()
        assert text.count(DEMO_PACING) == 1, text  # the documented script still paces its steps so
        script.write_text(text.replace(DEMO_PACING, f"--step-s {step_s}"))
    user = UserFactory(username=job_runtime.account)
    env = {**standalone_env(), "ATTUNE_TOKEN": Token.objects.create(user=user).key}
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "cli",
            "--server",
            live_server.url,
            "submit",
            "ddp_multinode.sh",
            "--chdir",
            str(workdir),
        ],
        cwd=workdir,
        env={**env, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    job = Job.objects.get(owner=user)
    assert (job.num_nodes, job.num_gpus, job.name) == (2, 4, "ddp-example")
    return job, workdir


def job_output(job: Job, workdir: Path) -> str:
    """Both servers' output files (--output=%x-%j.%n.out: one per node rank)."""
    paths = [workdir / f"ddp-example-{job.pk}.{rank}.out" for rank in (0, 1)]
    return "".join(path.read_text() for path in paths if path.exists())


def running_on_both(job: Job) -> bool:
    job.refresh_from_db()
    leases = Allocation.objects.filter(job=job, ended_at__isnull=True)
    return job.state == JobState.RUNNING and leases.count() == 2


def progressed(job: Job, at_least: int) -> bool:
    job.refresh_from_db()
    assert job.state in (JobState.PENDING, JobState.RUNNING), (
        job.state,
        list(job.events.values_list("kind", "reason", "message")),
        [a.log_tail[-2000:] for a in job.allocations.all()],
    )
    return job.state == JobState.RUNNING and job.done_iters >= at_least


def history(job: Job) -> str:
    """The job's events and leases, for a failure message."""
    events = [
        f"{e.at:%H:%M:%S.%f} {e.kind} {e.reason} {e.message[:200]} {e.data.get('lease_id', '')} "
        f"exit={e.data.get('exit_code')} signal={e.data.get('signal')} stop={e.data.get('stop')}"
        for e in job.events.all()
    ]
    leases = [
        f"{a.lease_id} {a.server.name} port={a.rendezvous_port} {a.started_at:%H:%M:%S} -> {a.end_reason}"
        for a in job.allocations.order_by("id")
    ]
    return "\n".join([*events, *leases])


def completed(job: Job, workdir: Path) -> bool:
    job.refresh_from_db()
    assert job.state in (JobState.PENDING, JobState.RUNNING, JobState.COMPLETED), (
        f"{job.state}\n{history(job)}\n{job_output(job, workdir)[-1500:]}"
    )
    return job.state == JobState.COMPLETED


def start_steps(output: str) -> list[int]:
    """The step each start of rank 0 resumed from."""
    return [int(m) for m in re.findall(r"rank 0/4 on .*?: starting at step (\d+)", output)]


def test_a_two_node_batch_script_trains_survives_a_preemption_and_completes(
    start_agents, live_server, job_runtime
):
    pytest_torch_or_skip()
    start_agents(2, gpus=2, cpus=2, mem_gb=64.0, time_scale=1.0)
    wait_until(lambda: Server.objects.filter(address="127.0.0.1").count() == 2, timeout_s=60, what="2 agents")
    # 0.1 s a step, not the demo's 0.3: the 100 steps take 20 s less, and most are still left when the
    # preemption comes (within a few seconds of step 15: two syncs and a poll).
    job, workdir = submit_example(live_server, job_runtime, step_s=0.1)

    wait_until(lambda: running_on_both(job), timeout_s=60, what="the job to start on both servers")
    parts = list(Allocation.objects.filter(job=job, ended_at__isnull=True).order_by("id"))
    assert {p.server.name for p in parts} == {"node1", "node2"}
    assert len({p.rendezvous_port for p in parts}) == 1
    wait_until(lambda: progressed(job, 15), timeout_s=180, what="rank 0 to report 15 steps", interval_s=1)

    # Preempted (as a round does): every part gets SIGTERM, rank 0 checkpoints, the job goes back to the
    # queue as one and the next round starts it again on both servers.
    with transaction.atomic():
        locked = Job.objects.select_for_update().get(pk=job.pk)
        job_requeue(job=locked, reason="preempted")
    wait_until(lambda: completed(job, workdir), timeout_s=300, what="the job to complete", interval_s=1)

    output = job_output(job, workdir)
    starts = start_steps(output)
    assert len(starts) == 2 and starts[0] == 0 and starts[1] >= 15, output[-3000:]  # resumed, not restarted
    assert "rank 3/4" in output and "done: 100 steps" in output, output[-3000:]
    assert job.done_iters == 100
    # Each part really ran as the owner: its files are the account's, private.
    out_file = workdir / f"ddp-example-{job.pk}.0.out"
    info = out_file.stat()
    assert (info.st_mode & 0o777) == 0o600
    if job_runtime.created_account:
        import pwd

        assert info.st_uid == pwd.getpwnam(job_runtime.account).pw_uid
        assert (workdir / "checkpoints" / "last.pt").stat().st_uid == info.st_uid
    started = AgentReport.objects.filter(allocation__job=job, kind="started")
    assert {r.data.get("user") for r in started} == {job_runtime.account}
    assert started.count() == 4  # two parts, twice
    assert not Allocation.objects.filter(job=job, ended_at__isnull=True).exists()
    assert_no_gpu_double_booked()


def test_an_agent_dying_under_a_two_node_job_stops_the_other_part_and_requeues_the_job(
    start_agents, live_server, job_runtime
):
    pytest_torch_or_skip()
    agents = start_agents(2, gpus=2, cpus=2, mem_gb=64.0, time_scale=1.0)
    wait_until(lambda: Server.objects.filter(address="127.0.0.1").count() == 2, timeout_s=60, what="2 agents")
    job, workdir = submit_example(live_server, job_runtime)
    wait_until(lambda: running_on_both(job), timeout_s=60, what="the job to start on both servers")
    wait_until(lambda: progressed(job, 10), timeout_s=180, what="rank 0 to report 10 steps", interval_s=1)

    parts = {p.server.name: p for p in Allocation.objects.filter(job=job, ended_at__isnull=True)}
    victim = next(a for a in agents if a.name == "node2")
    survivor_lease = parts["node1"].lease_id
    victim.kill_agent_only()

    wait_until(
        lambda: Server.objects.get(name="node2").state == NodeState.DOWN, timeout_s=60, what="node2 DOWN"
    )
    wait_until(
        lambda: JobEvent.objects.filter(job=job, to_state=JobState.NODE_FAIL).exists(),
        timeout_s=30,
        what="the job to be interrupted by the node failure",
    )
    # The surviving part ended, and the job waits as one for two servers again. Either its agent stopped
    # it (the sweep requeued the job first and ended the lease), or node2's fence stopped node2's part
    # and node1's collective failed first: the service then put the failure down to the silent node.
    wait_until(
        lambda: AgentReport.objects.filter(lease_id=survivor_lease, kind="exited").exists(),
        timeout_s=60,
        what="node1's part to be stopped",
    )
    exited = AgentReport.objects.get(lease_id=survivor_lease, kind="exited")
    if exited.data.get("stop") not in ("preempt", "cancel"):
        assert exited.data.get("exit_code") not in (None, 0), exited.data
        seen = JobEvent.objects.get(job=job, kind="lease_exited", data__lease_id=str(survivor_lease))
        assert seen.data.get("silent_servers") == ["node2"], seen.data
    job.refresh_from_db()
    assert job.state == JobState.PENDING
    assert not Allocation.objects.filter(job=job, ended_at__isnull=True).exists()

    # The agent comes back: it adopts and stops its orphaned part, and the job resumes on both servers.
    victim.start()
    wait_until(lambda: completed(job, workdir), timeout_s=300, what="the job to complete", interval_s=1)
    starts = start_steps(job_output(job, workdir))
    assert starts[0] == 0 and starts[-1] >= 10, job_output(job, workdir)[-3000:]
    assert_no_gpu_double_booked()
    assert os.path.exists(workdir / "checkpoints" / "last.pt")
