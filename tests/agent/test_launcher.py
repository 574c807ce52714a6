"""The launcher with real processes: environment, CPU pinning, process groups, exit status and OOM rules."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest

from agent.exit_status import ExitStatus, classify_oom
from agent.launch_spec import LaunchSpec
from agent.launcher import ISOLATION_AFFINITY, ProcessLauncher, systemd_run_unavailable_reason
from agent.lease_process import LeaseProcess, proc_start_ticks
from tests.agent.conftest import python_job
from tests.agent.fake_service import wait_for

REAL_CPUS = sorted(os.sched_getaffinity(0))

# Records its environment, pid and affinity, then waits to be signalled.
REPORTER = (
    "import json, os, sys, time\n"
    "json.dump({'env': dict(os.environ), 'pid': os.getpid(), 'affinity': sorted(os.sched_getaffinity(0))},\n"
    "          open(sys.argv[1] + '.tmp', 'w'))\n"
    "os.replace(sys.argv[1] + '.tmp', sys.argv[1])\n"
    "time.sleep(30)\n"
)


def make_spec(
    tmp_path: Path,
    argv: list[str],
    *,
    cpus: tuple[int, ...] = (0,),
    mem_gb: float = 4.0,
    lease_id: str = "lease-1",
    env: dict[str, str] | None = None,
) -> LaunchSpec:
    return LaunchSpec(
        lease_id=lease_id,
        job_id=42,
        argv=tuple(argv),
        env=env or {},
        gpu_uuids=("GPU-a", "GPU-b"),
        cpus=cpus,
        mem_gb=mem_gb,
        resume_iters=1200,
        lease_dir=tmp_path / "leases" / lease_id,
        checkpoint_path=tmp_path / "checkpoints" / "job-42.json",
        time_scale=0.5,
    )


def wait_exit(process: LeaseProcess, timeout_s: float = 10.0) -> ExitStatus:
    return wait_for(process.exited, timeout_s=timeout_s)


def cpus_allowed_list(pid: int) -> str:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Cpus_allowed_list:"):
            return line.split(":", 1)[1].strip()
    raise AssertionError("no Cpus_allowed_list")


def launch_reporter(tmp_path: Path, launcher: ProcessLauncher, cpus: tuple[int, ...], **kwargs):
    out = tmp_path / f"reported-{len(list(tmp_path.glob('reported-*')))}.json"
    process, facts = launcher.launch(
        make_spec(tmp_path, [*python_job(REPORTER), str(out)], cpus=cpus, **kwargs)
    )
    reported = json.loads(wait_for(lambda: out.exists() and out.read_text()))
    return process, facts, reported


def test_job_environment_and_pinning(tmp_path):
    launcher = ProcessLauncher(isolation=ISOLATION_AFFINITY)
    core = REAL_CPUS[-1]
    process, facts, reported = launch_reporter(
        tmp_path, launcher, (core,), env={"MY_VAR": "x", "ATTUNE_LEASE_ID": "forged"}
    )
    try:
        env = reported["env"]
        assert env["CUDA_VISIBLE_DEVICES"] == "GPU-a,GPU-b"
        assert env["ATTUNE_LEASE_ID"] == "lease-1"  # the agent's variables win over the command's
        assert env["ATTUNE_JOB_ID"] == "42"
        assert env["ATTUNE_RESUME_ITERS"] == "1200"
        assert env["ATTUNE_CHECKPOINT_PATH"].endswith("checkpoints/job-42.json")
        assert env["ATTUNE_PROGRESS_PATH"].endswith("leases/lease-1/job/progress.json")
        assert env["ATTUNE_TIME_SCALE"] == "0.5"
        assert env["MY_VAR"] == "x"
        assert "ATTUNE_CPUS_GRANTED" not in env  # one logical core on one real core: nothing to pretend
        assert reported["affinity"] == [core]
        # The kernel's view, for the job and for its shim (the process-group leader).
        assert cpus_allowed_list(reported["pid"]) == str(core)
        assert cpus_allowed_list(process.pid) == str(core)
        assert os.getpgid(reported["pid"]) == process.pid != os.getpgid(0)  # its own process group
        assert facts["isolation"] == ISOLATION_AFFINITY and facts["real_cpus"] == [core]
    finally:
        process.signal_group(signal.SIGKILL)
        wait_exit(process)


def test_fake_host_maps_logical_cores_and_passes_the_grant(tmp_path):
    launcher = ProcessLauncher(isolation=ISOLATION_AFFINITY, real_cpus=[0, 1])
    assert launcher.map_cpus([4, 5, 6]) == [0, 1]  # core i -> real core i mod 2
    assert launcher.map_cpus([3]) == [1]
    process, facts, reported = launch_reporter(tmp_path, launcher, (3,))
    try:
        assert cpus_allowed_list(reported["pid"]) == "1"
        assert "ATTUNE_CPUS_GRANTED" not in reported["env"]
    finally:
        process.signal_group(signal.SIGKILL)
        wait_exit(process)
    process, facts, reported = launch_reporter(tmp_path, launcher, (9, 10, 11, 12, 13, 14, 15, 16, 17))
    try:
        assert reported["env"]["ATTUNE_CPUS_GRANTED"] == "9"
        assert cpus_allowed_list(reported["pid"]) == "0-1"
        assert facts["cpus"] == [9, 10, 11, 12, 13, 14, 15, 16, 17]
    finally:
        process.signal_group(signal.SIGKILL)
        wait_exit(process)


def test_rlimit_caps_the_address_space(tmp_path):
    code = "import resource; print(resource.getrlimit(resource.RLIMIT_AS)[0], flush=True)"
    spec = make_spec(tmp_path, python_job(code), mem_gb=2.0)
    process, _ = ProcessLauncher().launch(spec)
    assert wait_exit(process) == ExitStatus(0, None, process.exited().peak_rss_kb)
    assert spec.log_path.read_text().strip() == str(2 * 1024**3)


def test_exit_codes_signals_and_start_failures(tmp_path):
    launcher = ProcessLauncher()
    process, _ = launcher.launch(make_spec(tmp_path, python_job("import sys; sys.exit(3)"), lease_id="a"))
    status = wait_exit(process)
    assert (status.exit_code, status.signal) == (3, None) and status.peak_rss_kb > 0
    process, _ = launcher.launch(
        make_spec(tmp_path, python_job("import os; os.kill(os.getpid(), 9)"), lease_id="b")
    )
    assert (wait_exit(process).exit_code, wait_exit(process).signal) == (None, 9)
    spec = make_spec(tmp_path, ["/nonexistent/binary"], lease_id="c")
    process, _ = launcher.launch(spec)
    status = wait_exit(process)
    assert status.exit_code == 127 and "cannot start" in status.error
    assert "cannot start" in spec.log_path.read_text()


def test_group_signal_reaches_grandchildren_and_stragglers_die_with_the_job(tmp_path):
    launcher = ProcessLauncher()
    # A job that forks a long sleep and waits for it: SIGTERM to the group ends both.
    out = tmp_path / "pids"
    code = (
        f"import subprocess, sys, time\np = subprocess.Popen(['sleep', '30'])\n"
        f"open({str(out)!r}, 'w').write(str(p.pid))\np.wait()\n"
    )
    process, _ = launcher.launch(make_spec(tmp_path, python_job(code), lease_id="a"))
    grandchild = int(wait_for(lambda: out.exists() and out.read_text()))
    process.signal_group(signal.SIGTERM)
    status = wait_exit(process)
    assert status.signal == signal.SIGTERM
    wait_for(lambda: proc_start_ticks(grandchild) is None)

    # A job that exits 0 but leaves a background process in its group: it must not keep the GPU.
    code = (
        f"import subprocess\np = subprocess.Popen(['sleep', '30'])\n"
        f"open({str(out)!r}, 'w').write(str(p.pid))\n"
    )
    out.unlink()
    process, _ = launcher.launch(make_spec(tmp_path, python_job(code), lease_id="b"))
    assert wait_exit(process).exit_code == 0
    straggler = int(out.read_text())
    wait_for(lambda: proc_start_ticks(straggler) is None, timeout_s=2)


def test_adopted_process_is_watched_by_pid_and_reads_the_shim_status(tmp_path):
    launcher = ProcessLauncher()
    spec = make_spec(tmp_path, python_job("import time; time.sleep(0.5)"))
    child, _ = launcher.launch(spec)
    adopted = launcher.adopt(child.pid, child.start_ticks, spec.status_path)
    assert adopted.exited() is None
    wait_for(lambda: spec.status_path.exists())
    wait_exit(child)  # reap it (the test process is its parent)
    assert adopted.exited() == ExitStatus(0, None, adopted.exited().peak_rss_kb)
    lost = launcher.adopt(child.pid, child.start_ticks, tmp_path / "missing.json")
    assert "lost" in lost.exited().error


@pytest.mark.parametrize(
    ("status", "kwargs", "oom"),
    [
        (ExitStatus(1, None), {"log_tail": ["Traceback...", "MemoryError"]}, True),
        (ExitStatus(1, None), {"log_tail": ["ValueError: nope"]}, False),
        (ExitStatus(137, None), {}, True),
        (ExitStatus(137, None), {"stop_requested": True}, False),
        (ExitStatus(None, 9, peak_rss_kb=950 * 1024), {"mem_cap_bytes": 1000 * 1024 * 1024}, True),
        (ExitStatus(None, 9, peak_rss_kb=100 * 1024), {"mem_cap_bytes": 1000 * 1024 * 1024}, False),
        (
            ExitStatus(None, 9, peak_rss_kb=990 * 1024),
            {"mem_cap_bytes": 1000 * 1024 * 1024, "stop_requested": True},
            False,
        ),
        (ExitStatus(None, 9), {"cgroup_oom_kills": 1, "stop_requested": True}, True),
        (ExitStatus(0, None), {}, False),
    ],
)
def test_oom_classification(status, kwargs, oom):
    kwargs = {"stop_requested": False, "mem_cap_bytes": 2 * 1024**3, **kwargs}
    assert classify_oom(status, **kwargs) is oom


def test_systemd_run_probe_explains_itself():
    reason = systemd_run_unavailable_reason()
    assert reason is None or isinstance(reason, str)
    if reason is None:  # a machine with cgroup v2 delegation: the mode must be selectable
        from agent.launcher import choose_isolation

        assert choose_isolation("auto") == "systemd-run"


def test_systemd_run_argv(tmp_path):
    launcher = ProcessLauncher(isolation="systemd-run", real_cpus=[0, 1, 2, 3])
    spec = make_spec(tmp_path, ["train.sh"], cpus=(1, 2), mem_gb=1.5)
    argv = launcher.build_argv(spec, launcher.map_cpus(spec.cpus), {})
    assert argv[0] == "systemd-run" and "--scope" in argv
    assert "AllowedCPUs=1,2" in argv and f"MemoryMax={int(1.5 * 1024**3)}" in argv
    assert "--mem-bytes" not in argv  # the cgroup caps memory, not RLIMIT_AS
    assert argv[-2:] == ["--", "train.sh"]
