"""The agent loop against a fake service over HTTP, with real lease processes (synthetic workload)."""

from __future__ import annotations

import json
import os
import time
from datetime import datetime
from pathlib import Path

import pytest

from agent.agent import AgentFatalError
from agent.lease_process import proc_start_ticks
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


def parse_at(at: str) -> datetime:
    return datetime.fromisoformat(at.replace("Z", "+00:00"))


def assert_seqs_contiguous(reports: list[dict]) -> None:
    assert [r["seq"] for r in reports] == list(range(1, len(reports) + 1))


def test_register_reports_fake_inventory_and_syncs_usage(service, make_agent):
    service.sync_interval_s = 0.25
    agent = make_agent()
    assert agent.syncer.interval_s == 10.0  # AgentConfig's default, until the register answer
    agent.start()
    wait_for(lambda: service.syncs)
    registration = service.registrations[0]
    assert registration["num_cpus"] == 24
    assert registration["mem_gb"] == 500.0
    assert registration["cgroup_mode"] == "affinity+rlimit"
    assert registration["hostname"] == "node-a"
    assert [g["index"] for g in registration["gpus"]] == [0, 1]
    assert all(g["uuid"].startswith("GPU-") for g in registration["gpus"])
    sample = service.samples[0]
    assert {g["uuid"] for g in sample["gpus"]} == {g["uuid"] for g in registration["gpus"]}
    assert sample["sampled_at"].endswith("Z")
    assert {"cpu_util_pct", "mem_used_gb"} <= set(sample)
    assert service.running[0] == [] and service.syncs[0]["reports"] == []
    assert agent.syncer.interval_s == 0.25  # the register answer sets the interval
    wait_for(lambda: len(service.syncs) >= 3)  # and syncs keep coming at it


def test_sync_once_drives_the_agent_without_threads(service, make_agent):
    agent = make_agent()
    agent.register()
    gpu = agent.gpus[0].uuid
    service.commands = [start_cmd("lease-1", gpu_uuids=[gpu], iters=100_000)]
    answer = agent.sync_once()
    assert answer["commands"] == service.commands and answer["state"] == "IDLE"
    assert agent.leases.running_ids() == []  # a start is queued; the supervisor's tick launches it
    agent.leases.tick()
    assert agent.leases.running_ids() == ["lease-1"]
    answer = agent.sync_once()
    assert service.running[-1] == ["lease-1"] and answer["state"] == "MIXED"
    assert [r["kind"] for r in service.reports_for("lease-1")] == ["started"]
    busy = {g["uuid"]: g for g in service.samples[-1]["gpus"]}
    assert busy[gpu]["util_pct"] > 0 and busy[agent.gpus[1].uuid]["util_pct"] == 0  # usage per GPU

    service.commands = [{"kind": "cancel", "lease_id": "lease-1", "grace_s": 5}]
    agent.sync_once()

    def exited_locally() -> bool:
        agent.leases.tick()
        return not agent.leases.running_ids()

    wait_for(exited_locally)
    assert agent.spool.pending_count() >= 1 and service.exited("lease-1") is None  # spooled, not sent
    agent.sync_once()
    assert service.exited("lease-1")["data"]["stop"] == "cancel"
    assert agent.spool.pending_count() == 0 and service.running[-1] == []
    assert_seqs_contiguous(service.reports_for("lease-1"))


def test_a_wake_brings_commands_at_once_and_urgent_reports_beat_the_interval(service, make_agent):
    service.sync_interval_s, service.offer_wait, service.wait_timeout_s = 5.0, True, 20.0
    agent = make_agent()
    agent.start()
    wait_for(lambda: len(service.syncs) == 1 and service.waiting == 1)
    woken_s = time.monotonic()
    service.wake(commands=[start_cmd("lease-1", gpu_uuids=[agent.gpus[0].uuid], iters=60)])
    # The wake's sync fetches the start at once.
    wait_for(lambda: len(service.syncs) == 2, timeout_s=2)
    assert service.sync_times()[1] - woken_s < 1.0
    # The `started` report, progress and log lines wait for the next sync; the exit is urgent and takes
    # them along: no sync of its own for the start.
    exited = wait_for(lambda: service.exited("lease-1"), timeout_s=4)
    assert exited["data"]["exit_code"] == 0 and time.monotonic() - woken_s < 4.0  # within one interval
    started = service.reports_for("lease-1", "started")[0]
    carrying = [s for s in service.syncs if ("lease-1", started["seq"]) in s["reports"]]
    assert ("lease-1", exited["seq"]) in carrying[0]["reports"]
    assert len(service.syncs) == 3  # the first, the wake's, the exit's: its last lines came along too
    progress = service.reports_for("lease-1", "progress")
    assert progress and progress[-1]["data"]["done_iters"] == 60
    assert len(service.syncs) <= 6  # no sync per progress report (one every 0.1 s)
    assert_seqs_contiguous(service.reports_for("lease-1"))
    # A wait is held right now; stopping does not wait it out.
    wait_for(lambda: service.waiting == 1)
    stopping_s = time.monotonic()
    agent.shutdown()
    assert time.monotonic() - stopping_s < 1.5


def test_progress_is_reported_at_most_once_per_sync_interval(service, make_agent):
    # Progress is read every 0.1 s (the fixture's), but the service syncs every 0.5 s: more than one
    # progress report per sync would only be more rows for the service to ingest.
    service.sync_interval_s = 0.5
    agent = make_agent()
    agent.start()
    wait_for(lambda: service.syncs)
    service.commands = [start_cmd("lease-1", gpu_uuids=[agent.gpus[0].uuid], iters=600)]
    exited = wait_for(lambda: service.exited("lease-1"), timeout_s=30)
    assert exited["data"]["exit_code"] == 0
    progress = service.reports_for("lease-1", "progress")
    started_at = service.reports_for("lease-1", "started")[0]["at"]
    span_s = (parse_at(exited["at"]) - parse_at(started_at)).total_seconds()
    assert progress and progress[-1]["data"]["done_iters"] == 600
    # One per 0.5 s of running (and the exit's own), not one per 0.1 s.
    assert len(progress) <= span_s / 0.5 + 2, (len(progress), span_s)
    assert span_s >= 1.5  # long enough that one report per 0.1 s would have been several times more
    assert_seqs_contiguous(service.reports_for("lease-1"))


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
    assert any("lease-1" in running for running in service.running)
    assert service.running[-1] == []


def test_start_is_idempotent(service, make_agent):
    agent = make_agent()
    service.commands = [start_cmd("lease-1", gpu_uuids=[agent.gpus[0].uuid], iters=100_000)]
    agent.start()
    wait_for(lambda: service.reports_for("lease-1", "started"))
    syncs_before = len(service.syncs)
    wait_for(lambda: len(service.syncs) >= syncs_before + 5)  # the same start, five more times
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
    # One sync answer both preempts A and starts B on A's GPU, as after a scheduling round.
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
    service.commands = [start_cmd("lease-1", gpu_uuids=[first.gpus[0].uuid], iters=150)]
    first.start()
    wait_for(lambda: service.reports_for("lease-1", "progress"))
    service.sync_status = 503  # the service goes away: no sync gets through
    posted_before = len(service.report_posts)
    wait_for(lambda: not first.leases.running_ids())  # the lease runs on and ends meanwhile
    first.shutdown()  # its one last sync fails too
    assert service.exited("lease-1") is None
    assert first.syncer.syncs >= 1
    acked_before = set(service.acked)

    service.sync_status = 200
    service.commands = []
    second = make_agent()
    second.start()
    exited = wait_for(lambda: service.exited("lease-1"))
    assert exited["data"]["done_iters"] == 150
    assert_seqs_contiguous(service.reports_for("lease-1"))
    # Reports acknowledged before the restart are not sent again.
    resent = {(r["lease_id"], r["seq"]) for r in service.report_posts[posted_before:]}
    assert resent and not resent & acked_before


def test_reports_whose_acks_were_lost_are_sent_again_and_counted_once(service, make_agent):
    service.ack = False  # the service commits every report, but no answer reaches the agent's spool
    agent = make_agent()
    service.commands = [start_cmd("lease-1", gpu_uuids=[agent.gpus[0].uuid], iters=20)]
    agent.start()
    wait_for(lambda: service.exited("lease-1"))
    wait_for(lambda: len(service.report_posts) > len(service.reports))  # at-least-once: sent again
    assert agent.spool.pending_count() >= len(service.reports_for("lease-1"))
    service.ack = True
    wait_for(lambda: agent.spool.pending_count() == 0)
    reports = service.reports_for("lease-1")
    assert_seqs_contiguous(reports)  # each (lease_id, seq) once, however often it came
    assert [r["kind"] for r in reports].count("exited") == 1


def test_restarted_agent_adopts_a_running_lease(service, make_agent):
    first = make_agent(stop_leases_on_exit=False)
    service.commands = [start_cmd("lease-1", gpu_uuids=[first.gpus[0].uuid], iters=150)]
    first.start()
    started = wait_for(lambda: service.reports_for("lease-1", "started"))[0]["data"]
    first.shutdown()
    assert proc_start_ticks(started["pid"]) is not None  # the job outlived the agent

    second = make_agent()
    second.start()
    wait_for(lambda: any(running == ["lease-1"] for running in service.running[-3:]))
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
        wait_for(lambda: service.syncs, timeout_s=15)
    finally:
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=10)
    assert proc.returncode == 0, stderr
    registration = service.registrations[0]
    assert (registration["num_cpus"], registration["mem_gb"], len(registration["gpus"])) == (24, 500.0, 4)


def test_a_sync_answered_not_registered_makes_the_agent_register_again(service, make_agent):
    agent = make_agent()
    agent.start()
    wait_for(lambda: len(service.registrations) == 1 and service.syncs)
    service.sync_status = 409  # the service lost the registration (a server re-created in the admin)
    service.sync_body = {"code": "not_registered", "detail": "server node-a has not registered"}
    wait_for(lambda: len(service.registrations) >= 2)
    service.sync_status = 200
    synced = len(service.syncs)
    wait_for(lambda: len(service.syncs) > synced)
    assert agent.fatal_error is None
