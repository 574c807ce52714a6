"""A job that writes its own output file and runs again on a new lease (moved, preempted, requeued):
the lines its leases ship, in start order, are the file's lines, none twice."""

from __future__ import annotations

from pathlib import Path

from tests.agent.conftest import start_cmd
from tests.agent.fake_service import FakeService, wait_for

# Starts from step 1 on each lease, as an own command without a checkpoint does.
STEPS = "for i in $(seq 1 {n}); do echo step $i; sleep 0.05; done"


def own_command(lease_id: str, *, gpu: str, workdir: Path, steps: int) -> dict:
    command = start_cmd(lease_id, gpu_uuids=[gpu], job_id=36, num_cpus=1, mem_gb=4.0)
    command.update(argv=["sh", "-c", STEPS.format(n=steps)], workdir=str(workdir), stdout_path="job.out")
    return command


def shipped(service: FakeService, lease_id: str) -> list[str]:
    return [line for r in service.reports_for(lease_id, "log") for line in r["data"]["lines"]]


def test_a_restarted_job_ships_only_its_new_lines_of_its_output_file(service, make_agent, tmp_path):
    workdir = tmp_path / "jobdir"
    workdir.mkdir()
    agent = make_agent()
    first, second = (g.uuid for g in agent.gpus)
    service.commands = [own_command("lease-1", gpu=first, workdir=workdir, steps=1000)]
    agent.start()
    wait_for(lambda: "step 3" in shipped(service, "lease-1"))
    # Moved: the first lease is stopped and the job starts again on another GPU, writing the same file.
    service.commands = [{"kind": "preempt", "lease_id": "lease-1", "grace_s": 5}]
    wait_for(lambda: service.exited("lease-1"))
    service.commands = [own_command("lease-2", gpu=second, workdir=workdir, steps=10)]
    assert wait_for(lambda: service.exited("lease-2"))["data"]["exit_code"] == 0

    output = (workdir / "job.out").read_text().splitlines()
    first_run = output[:-10]
    assert len(first_run) >= 3 and output[-10:] == [f"step {i}" for i in range(1, 11)]
    # What the service keeps per lease, shown in start order, is the file: the first run once.
    assert shipped(service, "lease-1") == first_run
    assert shipped(service, "lease-1") + shipped(service, "lease-2") == output
