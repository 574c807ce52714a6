"""Lease fencing on the node (docs/faults.md, "Fencing"): a lease its agent cannot renew is stopped by the
agent, or by its shim when the agent is gone, within the fence, with real shims and job processes."""

from __future__ import annotations

import json
import signal
import time

from agent.fence import FenceTimes, boot_clock_s, renewal_read
from agent.launcher import ProcessLauncher
from agent.lease_process import proc_start_ticks
from tests.agent.conftest import python_job, start_cmd
from tests.agent.fake_service import wait_for
from tests.agent.test_launcher import make_spec, wait_exit

FENCE_S, GRACE_S = 1.5, 0.6
# Writes its pid, then works until killed: it ignores SIGTERM, so only the fence's SIGKILL ends it.
STUBBORN = (
    "import os, signal, sys, time\n"
    "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
    "print('stubborn', os.getpid(), flush=True)\n"
    "time.sleep(120)\n"
)


def write_renewal(path, renewed_boot_s: float, fence_s: float = FENCE_S, grace_s: float = GRACE_S) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"renewed_boot_s": renewed_boot_s, "fence_s": fence_s, "grace_s": grace_s}))


def alive(pid: int) -> bool:
    return proc_start_ticks(pid) is not None


def job_pid(service, lease_id: str) -> int:
    """The job's own pid (the shim's child), from its first log line."""
    for report in service.reports_for(lease_id, "log"):
        for line in report["data"]["lines"]:
            if line.startswith("stubborn "):
                return int(line.split()[1])
    raise AssertionError("no pid logged")


def test_the_shim_stops_a_job_whose_renewal_is_older_than_the_fence(tmp_path):
    launcher = ProcessLauncher()
    spec = make_spec(tmp_path, python_job(STUBBORN))
    write_renewal(spec.renewal_path, boot_clock_s())
    started_s = time.monotonic()
    process, _ = launcher.launch(spec)
    status = wait_exit(process, timeout_s=FENCE_S + GRACE_S + 5)
    took_s = time.monotonic() - started_s
    # SIGTERM ignored: the SIGKILL at the grace's end, after the fence (checked every second).
    assert status.signal == signal.SIGKILL and status.fenced
    assert FENCE_S + GRACE_S <= took_s <= FENCE_S + GRACE_S + 2.5, took_s
    assert "lease not renewed" in spec.log_path.read_text()


def test_a_renewed_lease_is_not_fenced_and_a_lease_without_a_renewal_file_never_is(tmp_path):
    launcher = ProcessLauncher()
    renewed = make_spec(tmp_path, python_job("import time; time.sleep(3.5)"), lease_id="renewed")
    write_renewal(renewed.renewal_path, boot_clock_s())
    unfenced = make_spec(tmp_path, python_job("import time; time.sleep(3.5)"), lease_id="unfenced")
    first, _ = launcher.launch(renewed)
    second, _ = launcher.launch(unfenced)
    deadline = time.monotonic() + 3.5
    while time.monotonic() < deadline:  # the agent renews it every half second
        write_renewal(renewed.renewal_path, boot_clock_s())
        time.sleep(0.5)
    for process in (first, second):
        status = wait_exit(process)
        assert status.exit_code == 0 and not status.fenced


def test_a_partitioned_agent_stops_its_leases_within_the_fence_and_reports_why(service, make_agent):
    service.fence = {"lease_fence_s": FENCE_S, "grace_s": GRACE_S}
    agent = make_agent()
    service.commands = [
        start_cmd("lease-1", gpu_uuids=[agent.gpus[0].uuid], iters=1_000_000),
        start_cmd("lease-2", gpu_uuids=[agent.gpus[1].uuid], job_id=2, argv=python_job(STUBBORN)),
    ]
    agent.start()
    wait_for(lambda: service.reports_for("lease-1", "started") and service.reports_for("lease-2", "started"))
    wait_for(lambda: any(r == ["lease-1", "lease-2"] for r in service.running[-2:]))
    assert agent.leases.fence == FenceTimes(FENCE_S, GRACE_S)
    pids = [wait_for(lambda: logged_pid(service, "lease-2"))]
    pids.append(service.reports_for("lease-1", "started")[0]["data"]["pid"])
    service.down = True  # the agent lives on but no sync is answered: a partition
    last_answered_s = service.sync_times()[-1]
    wait_for(lambda: not any(alive(pid) for pid in pids), timeout_s=FENCE_S + GRACE_S + 5)
    gone_s = time.monotonic() - last_answered_s
    assert gone_s <= FENCE_S + GRACE_S + 1.5, gone_s
    service.down = False
    for lease_id in ("lease-1", "lease-2"):
        exited = wait_for(lambda lease_id=lease_id: service.exited(lease_id))["data"]
        assert exited["stop"] == "fence" and not exited["oom"], exited
    # The workload checkpointed on SIGTERM; the stubborn job needed the SIGKILL.
    assert service.exited("lease-1")["data"]["exit_code"] == 0
    assert service.exited("lease-2")["data"]["signal"] == signal.SIGKILL
    assert service.exited("lease-2")["data"]["killed_after_grace"] is True


def test_renewals_follow_the_answered_syncs_and_stop_with_a_stop_command(service, make_agent):
    agent = make_agent()
    service.commands = [start_cmd("lease-1", gpu_uuids=[agent.gpus[0].uuid], argv=python_job(STUBBORN))]
    agent.start()
    wait_for(lambda: service.reports_for("lease-1", "started"))
    path = agent.leases.leases["lease-1"].spec.renewal_path
    first = wait_for(lambda: renewal_read(path))
    assert wait_for(lambda: (r := renewal_read(path)) and r > first)  # each answered sync renews it
    # The default fence (the service's answers here carry none), written for the shim.
    assert json.loads(path.read_text())["fence_s"] == 60.0
    service.commands = [{"kind": "cancel", "lease_id": "lease-1", "grace_s": 5}]
    wait_for(lambda: agent.leases.leases["lease-1"].stop_kind == "cancel")
    stopped_at = renewal_read(path)
    time.sleep(0.5)  # several syncs: a lease the service ended is renewed no more
    assert renewal_read(path) == stopped_at


def test_a_dead_agents_job_is_stopped_by_its_shim_and_reported_by_the_next_agent(service, make_agent):
    service.fence = {"lease_fence_s": FENCE_S, "grace_s": GRACE_S}
    first = make_agent(stop_leases_on_exit=False)
    service.commands = [start_cmd("lease-1", gpu_uuids=[first.gpus[0].uuid], argv=python_job(STUBBORN))]
    first.start()
    wait_for(lambda: service.reports_for("lease-1", "started"))
    pid = wait_for(lambda: logged_pid(service, "lease-1"))
    first.shutdown()  # gone without stopping its jobs, as after a SIGKILL
    last_answered_s = service.sync_times()[-1]
    assert alive(pid)
    wait_for(lambda: not alive(pid), timeout_s=FENCE_S + GRACE_S + 5)
    assert time.monotonic() - last_answered_s <= FENCE_S + GRACE_S + 2.0

    second = make_agent()  # it adopts the lease, finds its shim gone and its status written
    second.start()
    exited = wait_for(lambda: service.exited("lease-1"))["data"]
    assert exited["stop"] == "fence" and exited["signal"] == signal.SIGKILL and not exited["oom"]


def logged_pid(service, lease_id: str) -> int | None:
    try:
        return job_pid(service, lease_id)
    except AssertionError:
        return None
