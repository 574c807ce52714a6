"""Resizing a running lease in place (agent/resize.py): real processes keep their pid, get the new
affinity and memory cap, and are told through the resources file and SIGWINCH (if they catch it)."""

from __future__ import annotations

import json
import os
import resource
import signal
from pathlib import Path

import pytest

from agent.launcher import ISOLATION_AFFINITY, ProcessLauncher
from agent.resize import catches, lease_resize, resized_cpus, session_members
from agent.workload import load_profile, tput
from tests.agent.conftest import python_job, start_cmd
from tests.agent.fake_service import wait_for
from tests.agent.test_launcher import cpus_allowed_list, make_spec, wait_exit

REAL_CPUS = sorted(os.sched_getaffinity(0))

# Catches SIGWINCH; on each, records the resources file, its affinity and RLIMIT_AS; forks a child
# that does not catch it (it must not be signalled: SIGWINCH is only for those who ask).
TOLD = (
    "import json, os, resource, signal, subprocess, sys, time\n"
    "out = sys.argv[1]\n"
    "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
    "def told(signum, frame):\n"
    "    seen = {'resources': json.load(open(os.environ['ATTUNE_RESOURCES_FILE'])),\n"
    "            'affinity': sorted(os.sched_getaffinity(0)),\n"
    "            'rlimit_as': resource.getrlimit(resource.RLIMIT_AS)[0], 'pid': os.getpid()}\n"
    "    json.dump(seen, open(out + '.tmp', 'w')); os.replace(out + '.tmp', out)\n"
    "signal.signal(signal.SIGWINCH, told)\n"
    "open(out + '.ready', 'w').write(str(child.pid))\n"
    "while True: time.sleep(0.05)\n"
)


def test_the_cores_of_a_resize_keep_the_leases_first_ones_and_add_the_lowest_free():
    use = {c: 0 for c in range(8)} | {3: 1, 4: 1}  # 3 and 4 are another lease's
    assert resized_cpus((0, 1, 2), 2, use) == (0, 1)
    assert resized_cpus((0, 1, 2), 5, use) == (0, 1, 2, 5, 6)
    assert resized_cpus((5, 6), 3, use) == (0, 5, 6)
    # More than is free: the least used cores, as a start would share them.
    assert resized_cpus((0,), 8, {c: 1 for c in range(1, 8)} | {0: 0}) == tuple(range(8))


def test_a_running_job_is_resized_in_place_and_told(tmp_path: Path):
    launcher = ProcessLauncher(isolation=ISOLATION_AFFINITY, real_cpus=[REAL_CPUS[0]])
    out = tmp_path / "told.json"
    spec = make_spec(tmp_path, [*python_job(TOLD), str(out)], cpus=(0,), mem_gb=4.0)
    process, facts = launcher.launch(spec)
    try:
        child_pid = int(wait_for(lambda: Path(f"{out}.ready").exists() and Path(f"{out}.ready").read_text()))
        first = json.loads(spec.resources_path.read_text())
        assert (first["cpus"], first["core_ids"], first["mem_gb"]) == (1, [REAL_CPUS[0]], 4.0)
        assert oct(spec.resources_path.stat().st_mode & 0o777) == oct(0o644)
        (job_pid,) = [pid for pid in session_members(process.pid) if pid not in (process.pid, child_pid)]
        assert catches(job_pid, signal.SIGWINCH) and not catches(child_pid, signal.SIGWINCH)

        resized = make_spec(tmp_path, [*python_job(TOLD), str(out)], cpus=(0, 1, 2), mem_gb=2.0)
        done = lease_resize(resized, shim_pid=process.pid, isolation=ISOLATION_AFFINITY, real_cpus=REAL_CPUS)

        seen = json.loads(wait_for(lambda: out.exists() and out.read_text()))
        assert seen["pid"] == job_pid and process.exited() is None  # the same process, still running
        assert (seen["resources"]["cpus"], seen["resources"]["mem_gb"]) == (3, 2.0)
        assert seen["resources"]["core_ids"] == REAL_CPUS
        assert seen["affinity"] == REAL_CPUS
        assert cpus_allowed_list(child_pid) == cpus_allowed_list(process.pid)  # the whole session
        assert seen["rlimit_as"] == 2 * 1024**3  # lowered: any process may lower its own cap
        assert resource.prlimit(child_pid, resource.RLIMIT_AS)[0] == 2 * 1024**3
        assert done["signalled"] == 1 and done["errors"] == [] and done["threads_pinned"] >= 3
        os.kill(child_pid, 0)  # not signalled (SIGWINCH would have been ignored anyway)
    finally:
        process.signal_group(signal.SIGKILL)
        wait_exit(process)
    assert facts["pid"] == process.pid


@pytest.mark.timeout(60)
def test_the_agent_applies_a_resize_command_and_the_workload_follows_its_profile(service, make_agent):
    agent = make_agent()
    agent.register()
    assert service.registrations[-1]["features"] == ["resize"]
    gpu = agent.gpus[0].uuid
    service.commands = [start_cmd("lease-1", gpu_uuids=[gpu], num_cpus=9, iters=10**7)]
    agent.sync_once()
    agent.leases.tick()
    lease = agent.leases.leases["lease-1"]
    pid = lease.process.pid

    def progress() -> dict:
        agent.leases.tick()
        try:
            return json.loads(lease.spec.progress_path.read_text())
        except (OSError, ValueError):
            return {}

    profile = load_profile("res18")
    base = profile["iter_time_s"] * 0.01  # the fixture's time scale
    fast = wait_for(lambda: progress().get("iters_per_s"))
    assert fast * base == pytest.approx(tput(profile, 9, 62.5))
    service.commands = []
    agent.sync_once()
    assert service.syncs[-1]["sizes"] == {"lease-1": [9, 62.5]}

    service.commands = [{"kind": "resize", "lease_id": "lease-1", "num_cpus": 3, "mem_gb": 62.5}]
    agent.sync_once()
    slow = tput(profile, 3, 62.5)
    wait_for(lambda: progress().get("iters_per_s", 0) * base == pytest.approx(slow))
    assert lease.process.pid == pid and lease.process.exited() is None
    assert agent.leases.sizes() == {"lease-1": [3, 62.5]} and len(lease.spec.cpus) == 3
    assert json.loads(lease.spec.resources_path.read_text())["cpus"] == 3
    service.commands = []
    agent.sync_once()
    assert service.syncs[-1]["sizes"] == {"lease-1": [3, 62.5]}
    assert "resized: 3 cores" in lease.spec.log_path.read_text()


def test_an_agent_without_live_resize_registers_no_feature_and_sends_no_sizes(service, make_agent):
    agent = make_agent(live_resize=False)
    agent.register()
    agent.sync_once()
    assert service.registrations[-1]["features"] == []
    assert "sizes" not in service.syncs[-1]
