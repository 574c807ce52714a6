"""End to end: a round that takes cores from a running catalog job resizes it in place.

A real agent process (fake GPUs, affinity+rlimit isolation) against the live API server; the rounds
run in this process (scheduling_round_run), progress is applied within each sync. A res18 job alone
on a 4-GPU, 12-core node gets 9 cores from tune (its profile's speed-up 2.4); a 3-GPU job arriving
takes 6 of them back (res18 at 3 cores: speed-up 1.0). The first job keeps its lease, its shim and its
training process (the same pids), and its measured speed falls by the profile's ratio, 2.4.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

import psutil
import pytest

from cluster_app.models import Server
from profiles_app.catalog import profile_for
from profiles_app.models import Workload
from profiles_app.services.workloads import workload_catalog_load
from scheduler_app.models import AgentReport, Allocation, Job, JobEvent, JobState
from scheduler_app.services.rounds import scheduling_round_run
from tests.api.helpers import active, lease_of, submit
from tests.e2e.processes import Agent, wait_until
from tests.factories import UserFactory

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

TIME_SCALE = 0.05
# res18's profile: 2.4 at 9 cores per GPU (what tune gives it alone), 1.0 at 3 (its proportional share).
FAST, SLOW = 2.4, 1.0


@pytest.fixture
def resize_settings(e2e_ready, live_settings):
    live_settings.ATTUNE_SCHEDULER = {
        **live_settings.ATTUNE_SCHEDULER,
        "policy": "fifo",
        "allocator": "tune",
        "progress_apply_s": 0,  # no worker here: each sync applies its progress
    }
    return live_settings


@pytest.fixture
def agent(resize_settings, live_server, tmp_path, job_runtime):
    work_root = Path(tempfile.mkdtemp(prefix="attune-e2e-resize-", dir="/tmp"))
    work_root.chmod(0o711)
    node = Agent(
        tmp_path,
        live_server.url,
        "node1",
        gpus=4,
        cpus=12,
        mem_gb=250.0,
        time_scale=TIME_SCALE,
        extra_args=tuple(job_runtime.agent_args),
        work_root=work_root,
    )
    yield node
    node.stop()
    shutil.rmtree(work_root, ignore_errors=True)


def progress_rate(lease: Allocation, *, after_seq: int = -1) -> tuple[float, int]:
    """Iterations per agent-clock second over the lease's progress reports after `after_seq` (first to
    last), and the last report's seq."""
    reports = list(
        AgentReport.objects.filter(allocation=lease, kind="progress", seq__gt=after_seq)
        .order_by("seq")
        .values_list("seq", "at", "data")
    )
    assert len(reports) >= 2, reports
    (_, at0, d0), (seq1, at1, d1) = reports[0], reports[-1]
    return (d1["done_iters"] - d0["done_iters"]) / (at1 - at0).total_seconds(), seq1


def test_a_resize_of_cores_keeps_the_process_and_its_speed_follows(agent, job_runtime):
    wait_until(
        lambda: Server.objects.filter(name="node1", registered_at__isnull=False, live_resize=True).exists(),
        timeout_s=60,
        what="node1 to register with the `resize` feature",
    )
    workload_catalog_load()
    user = UserFactory(username=job_runtime.account)
    iter_s = profile_for("res18").iter_time_s * TIME_SCALE  # at the proportional share (speed-up 1)
    first = submit(user, gpus=1, iters=int(600 / iter_s), workload=Workload.objects.get(name="res18"))
    scheduling_round_run()
    lease = lease_of(first)
    assert lease.num_cpus == 9, "tune gives res18 alone 9 cores (the resize below takes 6 back)"

    def speed_is(expected: float) -> bool:
        lease.refresh_from_db()
        return lease.iters_per_s is not None and abs(lease.iters_per_s * iter_s - expected) < 0.01

    wait_until(lambda: speed_is(FAST), timeout_s=90, what=f"the job's speed {FAST}x proportional")
    started = AgentReport.objects.get(allocation=lease, kind="started").data
    shim = psutil.Process(started["pid"])
    (trainer,) = shim.children()  # the shim forks the job's process and waits for it
    identity = {(p.pid, p.create_time()) for p in (shim, trainer)}
    wait_until(
        lambda: AgentReport.objects.filter(allocation=lease, kind="progress").count() >= 4,
        timeout_s=60,
        what="progress reports at the first size",
    )
    fast_rate, last_seq = progress_rate(lease)

    second = submit(user, gpus=3, iters=int(600 / iter_s), workload=Workload.objects.get(name="res18"))
    sround = scheduling_round_run()

    assert (sround.num_resized, sround.num_preempted) == (1, 0)
    (now,) = active(first)
    assert now.pk == lease.pk and (now.num_cpus, now.mem_gb) == (3, lease.mem_gb)
    event = JobEvent.objects.get(job=first, kind="resized")
    assert (event.data["from"]["cpus"], event.data["to"]["cpus"]) == (9, 3)
    wait_until(lambda: speed_is(SLOW), timeout_s=60, what=f"the job's speed to follow its cores ({SLOW}x)")
    # The same processes (pid and start time), never stopped: no second start, no exit.
    assert {
        (p.pid, p.create_time()) for p in (psutil.Process(shim.pid), psutil.Process(trainer.pid))
    } == identity
    assert list(AgentReport.objects.filter(allocation=lease).exclude(kind__in=["progress", "log"])
                .values_list("kind", flat=True)) == ["started"]  # fmt: skip
    work_dir = Path(agent.args[agent.args.index("--work-dir") + 1])
    told = json.loads((work_dir / "leases" / str(lease.lease_id) / "resources.json").read_text())
    assert (told["cpus"], told["mem_gb"]) == (3, lease.mem_gb)
    assert sorted(psutil.Process(trainer.pid).cpu_affinity()) == told["core_ids"]
    assert Job.objects.get(pk=first.pk).state == JobState.RUNNING
    assert "resized lease" in agent.log_text()
    # Its progress, measured over reports after the resize: at the slower speed, in the profile's ratio.
    wait_until(
        lambda: AgentReport.objects.filter(allocation=lease, kind="progress", seq__gt=last_seq).count() >= 5,
        timeout_s=60,
        what="progress reports at the new size",
    )
    reports = AgentReport.objects.filter(allocation=lease, kind="progress").values_list("seq", "data")
    resize_seen = max(seq for seq, data in reports if abs(data["iters_per_s"] * iter_s - FAST) < 0.01)
    slow_rate, _ = progress_rate(lease, after_seq=resize_seen + 1)
    assert fast_rate / slow_rate == pytest.approx(FAST / SLOW, rel=0.25), (fast_rate, slow_rate)
    wait_until(
        lambda: lease_of(second).agent_started_at is not None,
        timeout_s=30,
        what="the second job to start on the cores the first gave back",
    )
