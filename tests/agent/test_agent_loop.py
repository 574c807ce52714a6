"""The agent loop against a fake service over HTTP, with real lease processes (synthetic workload)."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from agent.agent import AgentFatalError
from agent.launcher import proc_start_ticks
from tests.agent.conftest import python_job, start_cmd
from tests.agent.fake_service import wait_for

# A job that takes 0.8 s to "checkpoint" after SIGTERM, then exits 0.
SLOW_CHECKPOINT = (
    "import signal, sys, time\n"
    "def term(*_):\n"
    "    time.sleep(0.8); print('checkpointed', flush=True); sys.exit(0)\n"
    "signal.signal(signal.SIGTERM, term)\n"
    "print('running', flush=True)\n"
    "time.sleep(60)\n"
)
IGNORES_SIGTERM = (
    "import signal, time\n"
    "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
    "print('stubborn', flush=True)\n"
    "time.sleep(60)\n"
)


def logged(service, lease_id: str, text: str) -> bool:
    return any(text in line for r in service.reports_for(lease_id, "log") for line in r["data"]["lines"])


def assert_seqs_contiguous(reports: list[dict]) -> None:
    assert [r["seq"] for r in reports] == list(range(1, len(reports) + 1))


def test_register_reports_fake_inventory_and_heartbeats(service, make_agent):
    agent = make_agent()
    agent.start()
    wait_for(lambda: service.heartbeats)
    registration = service.registrations[0]
    assert registration["num_cpus"] == 24
    assert registration["mem_gb"] == 500.0
    assert registration["cgroup_mode"] == "affinity+rlimit"
    assert registration["hostname"] == "node-a"
    assert [g["index"] for g in registration["gpus"]] == [0, 1]
    assert all(g["uuid"].startswith("GPU-") for g in registration["gpus"])
    beat = service.heartbeats[0]
    assert {g["uuid"] for g in beat["gpus"]} == {g["uuid"] for g in registration["gpus"]}
    assert beat["sampled_at"].endswith("Z")
    assert agent.poll_interval_s == service.poll_interval_s  # the register answer sets the intervals


def test_register_retries_until_the_service_answers(service, make_agent):
    service.down = True
    agent = make_agent()
    agent.start()
    time.sleep(0.5)
    assert not agent.registered.is_set()
    service.down = False
    assert agent.registered.wait(5)
    assert service.registrations


def test_gpu_conflict_is_fatal(service, make_agent):
    service.register_status = 409
    agent = make_agent()
    with pytest.raises(AgentFatalError, match="already registered"):
        agent.run()


def test_lease_runs_to_completion_with_ordered_reports(service, make_agent):
    agent = make_agent()
    gpu = agent.gpus[0].uuid
    service.commands = [start_cmd("lease-1", gpu_uuids=[gpu], iters=60)]
    agent.start()
    wait_for(lambda: service.exited("lease-1"))
    # The service keeps sending the start until it applies `exited`; the finished lease never reruns.
    time.sleep(0.4)
    reports = service.reports_for("lease-1")
    assert_seqs_contiguous(reports)
    kinds = [r["kind"] for r in reports]
    assert kinds[0] == "started" and kinds[-1] == "exited"
    assert kinds.count("started") == 1 and kinds.count("exited") == 1
    assert "progress" in kinds and "log" in kinds
    started = reports[0]["data"]
    assert started["isolation"] == "affinity+rlimit"
    assert len(started["cpus"]) == 3
    assert started["gpu_uuids"] == [gpu]
    exited = reports[-1]["data"]
    assert exited == {**exited, "exit_code": 0, "signal": None, "oom": False, "done_iters": 60, "stop": None}
    progress = [r["data"]["done_iters"] for r in reports if r["kind"] == "progress"]
    assert progress == sorted(progress) and progress[-1] == 60
    lines = [line for r in reports if r["kind"] == "log" for line in r["data"]["lines"]]
    assert any("iteration 60/60" in line for line in lines)
    assert any(line.startswith("done:") for line in lines)
    assert any("lease-1" in running for running in service.polls)
    assert service.polls[-1] == []


def test_start_is_idempotent(service, make_agent):
    agent = make_agent()
    service.commands = [start_cmd("lease-1", gpu_uuids=[agent.gpus[0].uuid], iters=100_000)]
    agent.start()
    wait_for(lambda: service.reports_for("lease-1", "started"))
    polls_before = len(service.polls)
    wait_for(lambda: len(service.polls) >= polls_before + 5)  # the same start, five more times
    assert len(service.reports_for("lease-1", "started")) == 1
    assert agent.leases.running_ids() == ["lease-1"]


def test_preempt_checkpoints_and_reports_exit(service, make_agent, tmp_path):
    agent = make_agent()
    service.commands = [start_cmd("lease-1", gpu_uuids=[agent.gpus[0].uuid], job_id=7, iters=100_000)]
    agent.start()
    wait_for(lambda: (p := service.reports_for("lease-1", "progress")) and p[-1]["data"]["done_iters"] > 20)
    service.commands = [{"kind": "preempt", "lease_id": "lease-1", "grace_s": 5}]
    exited = wait_for(lambda: service.exited("lease-1"))["data"]
    assert exited["exit_code"] == 0 and exited["signal"] is None
    assert exited["stop"] == "preempt" and exited["killed_after_grace"] is False and not exited["oom"]
    checkpoint = json.loads((tmp_path / "work" / "checkpoints" / "job-7" / "checkpoint.json").read_text())
    assert checkpoint["done_iters"] == exited["done_iters"] > 20
    lines = [line for r in service.reports_for("lease-1", "log") for line in r["data"]["lines"]]
    assert any("SIGTERM received: checkpointed" in line for line in lines)


def test_sigkill_after_grace(service, make_agent):
    agent = make_agent()
    service.commands = [
        start_cmd("lease-1", gpu_uuids=[agent.gpus[0].uuid], argv=python_job(IGNORES_SIGTERM))
    ]
    agent.start()
    wait_for(lambda: logged(service, "lease-1", "stubborn"))
    asked_s = time.time()
    service.commands = [{"kind": "cancel", "lease_id": "lease-1", "grace_s": 0.5}]
    exited = wait_for(lambda: service.exited("lease-1"))
    assert exited["data"]["signal"] == 9 and exited["data"]["exit_code"] is None
    assert exited["data"]["killed_after_grace"] is True and exited["data"]["stop"] == "cancel"
    assert exited["data"]["oom"] is False  # the agent's own SIGKILL is not an OOM
    assert exited["received_at_s"] - asked_s >= 0.5


def test_start_waits_for_the_stopping_lease_on_the_same_gpu(service, make_agent):
    agent = make_agent()
    gpu = agent.gpus[0].uuid
    service.commands = [start_cmd("lease-a", gpu_uuids=[gpu], argv=python_job(SLOW_CHECKPOINT))]
    agent.start()
    wait_for(lambda: logged(service, "lease-a", "running"))
    a_pid = service.reports_for("lease-a", "started")[0]["data"]["pid"]
    # One poll answer both preempts A and starts B on A's GPU, as after a scheduling round.
    service.commands = [
        {"kind": "preempt", "lease_id": "lease-a", "grace_s": 5},
        start_cmd("lease-b", gpu_uuids=[gpu], job_id=2, iters=100_000),
    ]
    b_started = wait_for(lambda: service.reports_for("lease-b", "started"))[0]
    a_exited = service.exited("lease-a")
    assert a_exited is not None, "B started while A still held the GPU"
    assert a_exited["data"]["exit_code"] == 0
    assert b_started["at"] >= a_exited["at"]
    assert proc_start_ticks(a_pid) is None  # A's process is gone
    lines = [line for r in service.reports_for("lease-a", "log") for line in r["data"]["lines"]]
    assert "checkpointed" in lines


def test_queued_start_is_dropped_when_the_service_stops_asking(service, make_agent):
    agent = make_agent()
    gpu = agent.gpus[0].uuid
    service.commands = [start_cmd("lease-a", gpu_uuids=[gpu], argv=python_job(SLOW_CHECKPOINT))]
    agent.start()
    wait_for(lambda: logged(service, "lease-a", "running"))  # its SIGTERM handler is in place
    service.commands = [
        {"kind": "preempt", "lease_id": "lease-a", "grace_s": 5},
        start_cmd("lease-b", gpu_uuids=[gpu], job_id=2),
    ]
    wait_for(lambda: "lease-b" in agent.leases.pending)
    service.commands = [{"kind": "preempt", "lease_id": "lease-a", "grace_s": 5}]  # B was ended meanwhile
    wait_for(lambda: service.exited("lease-a"))
    time.sleep(0.3)
    assert service.reports_for("lease-b") == []


def test_unknown_gpu_fails_the_start(service, make_agent):
    agent = make_agent()
    service.commands = [start_cmd("lease-1", gpu_uuids=["GPU-not-here"])]
    agent.start()
    exited = wait_for(lambda: service.exited("lease-1"))["data"]
    assert "no GPU GPU-not-here" in exited["error"]
    assert service.reports_for("lease-1", "started") == []


def test_memory_error_under_the_cap_is_oom(service, make_agent):
    agent = make_agent()
    argv = ["python", "-m", "agent.workload", "--model", "res18", "--iters", "10", "--mem-mb", "1024"]
    service.commands = [start_cmd("lease-1", gpu_uuids=[agent.gpus[0].uuid], mem_gb=0.5, argv=argv)]
    agent.start()
    exited = wait_for(lambda: service.exited("lease-1"))["data"]
    assert exited["exit_code"] == 137 and exited["oom"] is True


def test_reports_spooled_while_the_service_is_down_survive_an_agent_restart(service, make_agent):
    first = make_agent()
    service.commands = [start_cmd("lease-1", gpu_uuids=[first.gpus[0].uuid], iters=30)]
    first.start()
    wait_for(lambda: service.reports_for("lease-1", "progress"))
    service.reports_down = True  # nothing more is acknowledged
    posted_before = len(service.report_posts)
    wait_for(lambda: not first.leases.running_ids())  # the lease ends while reports cannot be delivered
    first.shutdown()
    assert service.exited("lease-1") is None
    acked_before = set(service.reports)

    service.reports_down = False
    service.commands = []
    second = make_agent()
    second.start()
    exited = wait_for(lambda: service.exited("lease-1"))
    assert exited["data"]["done_iters"] == 30
    assert_seqs_contiguous(service.reports_for("lease-1"))
    # Reports acknowledged before the restart are not sent again.
    resent = {(r["lease_id"], r["seq"]) for r in service.report_posts[posted_before:]}
    assert not resent & acked_before


def test_restarted_agent_adopts_a_running_lease(service, make_agent):
    first = make_agent(stop_leases_on_exit=False)
    service.commands = [start_cmd("lease-1", gpu_uuids=[first.gpus[0].uuid], iters=150)]
    first.start()
    started = wait_for(lambda: service.reports_for("lease-1", "started"))[0]["data"]
    first.shutdown()
    assert proc_start_ticks(started["pid"]) is not None  # the job outlived the agent

    second = make_agent()
    second.start()
    wait_for(lambda: any(running == ["lease-1"] for running in service.polls[-3:]))
    exited = wait_for(lambda: service.exited("lease-1"))["data"]
    assert exited["exit_code"] == 0 and exited["done_iters"] == 150
    reports = service.reports_for("lease-1")
    assert_seqs_contiguous(reports)  # the seq counter survived the restart
    assert [r["kind"] for r in reports].count("started") == 1


def test_agent_cli_runs_and_stops_on_sigterm(service, tmp_path):
    import signal
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[2]
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "agent",
            "--server",
            service.url,
            "--token",
            service.token,
            "--name",
            "cli-node",
            "--fake-gpus",
            "4",
            "--fake-cpus",
            "24",
            "--fake-mem-gb",
            "500",
            "--spool-dir",
            str(tmp_path / "s"),
            "--work-dir",
            str(tmp_path / "w"),
            "--time-scale",
            "0.01",
        ],
        cwd=root,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(root)},
    )
    try:
        wait_for(lambda: service.heartbeats, timeout_s=15)
    finally:
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=10)
    assert proc.returncode == 0, stderr
    registration = service.registrations[0]
    assert (registration["num_cpus"], registration["mem_gb"], len(registration["gpus"])) == (24, 500.0, 4)
