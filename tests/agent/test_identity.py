"""Jobs as their owners' accounts: resolution and refusals, the clean environment, private files, no token."""

from __future__ import annotations

import json
import os
import pwd
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from agent.accounts import (
    DEFAULT_JOB_PATH,
    Account,
    AccountError,
    JobIdentity,
    lookup_account,
    own_account,
    traversable_by_others,
)
from agent.launcher import AGENT_ROOT, ProcessLauncher
from agent.leases import Lease, spec_from_record
from tests.agent.conftest import python_job, start_cmd
from tests.agent.fake_service import FakeService, wait_for
from tests.agent.test_launcher import make_spec, wait_exit

LEASE_VARIABLES = {
    "CUDA_VISIBLE_DEVICES",
    "ATTUNE_LEASE_ID",
    "ATTUNE_JOB_ID",
    "ATTUNE_RESUME_ITERS",
    "ATTUNE_CHECKPOINT_PATH",
    "ATTUNE_CHECKPOINT_DIR",
    "ATTUNE_PROGRESS_PATH",
    "ATTUNE_TIME_SCALE",
    "ATTUNE_MEM_GB",
    "ATTUNE_RESOURCES_FILE",
}
LOGIN_VARIABLES = {"HOME", "USER", "LOGNAME", "SHELL", "PATH", "LANG"}
NOBODY = pwd.getpwnam("nobody")


def log_lines(service: FakeService, lease_id: str) -> list[str]:
    return [line for r in service.reports_for(lease_id, "log") for line in r["data"]["lines"]]


def script_cmd(lease_id: str, script: str, *, gpu_uuids: list[str], **fields) -> dict:
    command = start_cmd(lease_id, gpu_uuids=gpu_uuids, num_cpus=1, mem_gb=4.0)
    command.pop("argv")
    command.update(script=script, **fields)
    return command


# -- resolution and refusals (no root needed) ---------------------------------------------------


def test_root_is_never_a_job_account():
    with pytest.raises(AccountError, match="never run as root"):
        lookup_account("root", node="gpu02")
    with pytest.raises(AccountError, match="never run as root"):
        JobIdentity(job_user="root", node="gpu02", euid=0).check()  # as --job-user too
    with pytest.raises(AccountError, match="never run as root"):
        JobIdentity(node="gpu02", euid=0).account_for("root")


def test_account_resolution_in_root_and_single_user_modes():
    root_mode = JobIdentity(job_user="nobody", node="gpu02", euid=0)
    assert root_mode.account_for(None).uid == NOBODY.pw_uid  # catalog workloads as --job-user
    assert "root mode" in root_mode.describe() and "nobody" in root_mode.describe()
    with pytest.raises(AccountError, match=r"^no Unix account 'attune_nosuch' on node gpu02$"):
        root_mode.account_for("attune_nosuch")

    single = JobIdentity(job_user="daemon", node="gpu02", euid=NOBODY.pw_uid)
    assert single.account_for(None).uid == NOBODY.pw_uid  # catalog: as the agent itself, not --job-user
    assert single.account_for("nobody").uid == NOBODY.pw_uid
    with pytest.raises(
        AccountError, match=r"this agent runs as 'nobody', not root: it can run only nobody's"
    ):
        single.account_for("daemon")
    assert "single-user mode" in single.describe() and "'nobody'" in single.describe()


def test_refused_accounts_fail_the_start_with_the_reason(service, make_agent):
    agent = make_agent()
    uuid = agent.gpus[0].uuid
    # Pretend to be root, so that this runs anywhere: the refusals happen before anything is launched.
    agent.leases.identity = JobIdentity(job_user=None, node="gpu02", euid=0)
    service.commands = [
        script_cmd("lease-ghost", "true", gpu_uuids=[uuid], run_as="attune_nosuch"),
        script_cmd("lease-root", "true", gpu_uuids=[uuid], run_as="root"),
    ]
    agent.start()
    ghost = wait_for(lambda: service.exited("lease-ghost"))["data"]
    assert ghost["exit_code"] is None
    assert ghost["error"] == "start failed: no Unix account 'attune_nosuch' on node gpu02"
    refused = wait_for(lambda: service.exited("lease-root"))["data"]
    assert refused["exit_code"] is None and refused["error"].startswith(
        "start failed: jobs never run as root"
    )
    assert service.reports_for("lease-ghost", "started") == service.reports_for("lease-root", "started") == []


def test_a_non_root_agent_refuses_other_accounts_jobs(service, make_agent):
    agent = make_agent()
    agent.leases.identity = JobIdentity(job_user="nobody", node="gpu02", euid=NOBODY.pw_uid)
    service.commands = [script_cmd("lease-1", "true", gpu_uuids=[agent.gpus[0].uuid], run_as="daemon")]
    agent.start()
    exited = wait_for(lambda: service.exited("lease-1"))["data"]
    assert exited["exit_code"] is None
    assert (
        exited["error"]
        == "start failed: this agent runs as 'nobody', not root: it can run only nobody's jobs"
    )


def test_users_jobs_never_run_as_the_catalog_account_or_a_system_account():
    root_mode = JobIdentity(job_user="nobody", node="gpu02", euid=0)
    with pytest.raises(
        AccountError, match=r"'nobody' is this node's account for catalog workloads \(--job-user\)"
    ):
        root_mode.account_for("nobody")
    assert root_mode.account_for(None).uid == NOBODY.pw_uid  # catalog workloads still run as it
    daemon = pwd.getpwnam("daemon")
    with pytest.raises(
        AccountError, match=rf"uid {daemon.pw_uid}, a system account \(below --min-uid 1000\)"
    ):
        root_mode.account_for("daemon")
    assert (
        JobIdentity(job_user="nobody", node="gpu02", euid=0, min_uid=0).account_for("daemon").uid
        == daemon.pw_uid
    )
    assert "uid 1000 or more, never nobody" in root_mode.describe()
    # Single-user mode becomes no one else: nothing to refuse beyond "not ours".
    assert (
        JobIdentity(job_user="daemon", node="gpu02", euid=NOBODY.pw_uid).account_for("nobody").uid
        == NOBODY.pw_uid
    )


def test_system_and_catalog_accounts_fail_the_start_with_the_reason(service, make_agent):
    agent = make_agent()
    uuid = agent.gpus[0].uuid
    # Pretend to be root, so that this runs anywhere: the refusals happen before anything is launched.
    agent.leases.identity = JobIdentity(job_user="nobody", node="gpu02", euid=0)
    service.commands = [
        script_cmd("lease-db", "ls /var/lib/postgresql", gpu_uuids=[uuid], run_as="daemon"),
        script_cmd("lease-cat", "true", gpu_uuids=[uuid], run_as="nobody"),
    ]
    agent.start()
    system = wait_for(lambda: service.exited("lease-db"))["data"]
    assert system["exit_code"] is None and system["error"].startswith(
        "start failed: account 'daemon' on node gpu02 has uid "
    )
    assert "below --min-uid 1000" in system["error"]
    catalog = wait_for(lambda: service.exited("lease-cat"))["data"]
    assert catalog["exit_code"] is None and catalog["error"] == (
        "start failed: account 'nobody' is this node's account for catalog workloads (--job-user): "
        "users' jobs never run as it"
    )
    assert service.reports_for("lease-db", "started") == service.reports_for("lease-cat", "started") == []


def test_the_min_uid_option_and_its_environment_variable(monkeypatch):
    from agent.cli import build_parser

    assert build_parser().parse_args(["--server", "http://x"]).min_uid == 1000
    assert build_parser().parse_args(["--server", "http://x", "--min-uid", "500"]).min_uid == 500
    monkeypatch.setenv("ATTUNE_AGENT_MIN_UID", "2000")
    assert build_parser().parse_args(["--server", "http://x"]).min_uid == 2000


# -- the clean environment ------------------------------------------------------------------------


def test_the_job_environment_is_built_from_nothing(tmp_path, monkeypatch):
    token = f"att_{secrets.token_hex(20)}"
    monkeypatch.setenv("ATTUNE_AGENT_TOKEN", token)
    monkeypatch.setenv("LD_PRELOAD", "/tmp/agent-side.so")
    monkeypatch.setenv("AGENT_ONLY_SETTING", "x")
    account = Account("alice", 1234, 1234, (1234, 27), "/home/alice", "/bin/zsh")
    spec = make_spec(tmp_path, ["train.sh"], env={"MY_VAR": "1", "HOME": "/scratch/alice"})
    spec = replace(spec, account=account)
    launcher = ProcessLauncher(real_cpus=[0])
    env = launcher.build_env(spec, [0])
    assert set(env) == LOGIN_VARIABLES | LEASE_VARIABLES | {"MY_VAR"}
    assert (env["USER"], env["LOGNAME"], env["SHELL"]) == ("alice", "alice", "/bin/zsh")
    assert env["HOME"] == "/scratch/alice"  # the command's env comes after the passwd entry
    assert (env["PATH"], env["LANG"]) == (DEFAULT_JOB_PATH, "C.UTF-8")
    assert env["ATTUNE_CHECKPOINT_DIR"] == str(spec.checkpoint_path.parent)
    argv = launcher.build_argv(spec, [0], env)
    assert argv[argv.index("--user") + 1] == "alice" and argv[-2:] == ["--", "train.sh"]
    everything = json.dumps([env, argv, launcher.shim_env()])
    assert token not in everything and "agent-side.so" not in everything


def test_a_real_job_sees_exactly_the_clean_environment(tmp_path, monkeypatch):
    token = f"att_{secrets.token_hex(20)}"
    monkeypatch.setenv("ATTUNE_AGENT_TOKEN", token)
    out = tmp_path / "env.json"
    code = f"import json, os; json.dump(dict(os.environ), open({str(out)!r}, 'w'))"
    spec = make_spec(tmp_path, python_job(code), env={"MY_VAR": "x"})
    process, facts = ProcessLauncher().launch(spec)
    assert wait_exit(process).exit_code == 0
    env = json.loads(out.read_text())
    assert set(env) == LOGIN_VARIABLES | LEASE_VARIABLES | {"MY_VAR"}
    assert env["USER"] == own_account().name == facts["user"]
    assert token not in out.read_text()
    assert not spec.env_path.exists()  # the shim read the job's environment and removed the file
    assert oct(spec.log_path.stat().st_mode & 0o777) == oct(0o600)
    assert oct(spec.status_path.stat().st_mode & 0o777) == oct(0o600)


# -- start failures in the shim, output files, log shipping ---------------------------------------


def test_a_missing_workdir_or_output_directory_is_a_clear_start_failure(tmp_path):
    launcher = ProcessLauncher()
    spec = replace(make_spec(tmp_path, ["true"], lease_id="a"), workdir="/nonexistent/x")
    status = wait_exit(launcher.launch(spec)[0])
    assert status.exit_code == 126
    assert status.error.startswith("start failed: cannot enter the working directory '/nonexistent/x'")
    assert "cannot enter the working directory" in spec.log_path.read_text()

    spec = make_spec(tmp_path, ["true"], lease_id="b")
    spec = replace(spec, workdir=str(tmp_path), stdout_path="no/such/dir/out.txt")
    status = wait_exit(launcher.launch(spec)[0])
    assert status.exit_code == 126
    assert f"cannot open the stdout file '{tmp_path}/no/such/dir/out.txt'" in status.error


def test_separate_output_files_are_shipped_and_a_swapped_in_symlink_is_not(service, make_agent, tmp_path):
    agent = make_agent()
    workdir = tmp_path / "wd"
    workdir.mkdir()
    secret = tmp_path / "secret.txt"
    secret.write_text("TOPSECRET\n")
    script = (
        "echo out-line\necho err-line >&2\nsleep 1\n"
        # The job's owner replaces its output file with a link to a file the agent can read.
        f"rm -f out.txt && ln -s {secret} out.txt\necho after-swap\n"
    )
    service.commands = [
        script_cmd(
            "lease-1",
            script,
            gpu_uuids=[agent.gpus[0].uuid],
            workdir=str(workdir),
            stdout_path="out.txt",
            stderr_path="err.txt",
        )
    ]
    agent.start()
    exited = wait_for(lambda: service.exited("lease-1"))["data"]
    assert exited["exit_code"] == 0, log_lines(service, "lease-1")
    lines = log_lines(service, "lease-1")
    assert "out-line" in lines and "err-line" in lines
    assert "TOPSECRET" not in lines
    assert (workdir / "err.txt").read_text() == "err-line\n"


def test_lease_records_carry_the_new_fields_and_old_records_still_load(tmp_path):
    from agent.lease_process import AdoptedProcess

    account = Account("alice", 1234, 1234, (1234, 27), "/home/alice", "/bin/bash")
    spec = make_spec(tmp_path, [], lease_id="x")
    spec = replace(spec, account=account, script="echo hi", workdir="/home/alice", stdout_path="o")
    lease = Lease(spec=spec, process=AdoptedProcess(1, None, spec.status_path), isolation="affinity+rlimit")
    lease.log_offsets = {str(spec.log_path): 10, "/home/alice/o": 5}
    record = json.loads(json.dumps(lease.record()))
    assert spec_from_record(record["spec"]) == spec
    assert record["log_offsets"] == lease.log_offsets

    new_fields = {"account", "workdir", "script", "stdout_path", "stderr_path", "job_subdir"}
    old = {k: v for k, v in record["spec"].items() if k not in new_fields}
    old_spec = spec_from_record(old)
    assert old_spec.account is None and old_spec.script is None and old_spec.job_output_files == ()
    assert old_spec.progress_path == spec.lease_dir / "progress.json"  # where an older agent put it


# -- as root, with real accounts ----------------------------------------------------------------


def run_as(account: Account, argv: list[str]) -> subprocess.CompletedProcess:
    """`argv` as the account: its uid, gid and groups only (not root's groups), clean environment.
    A program the account cannot execute gives returncode 126, as a shell would."""
    try:
        return run_as_or_raise(account, argv)
    except PermissionError as exc:
        return subprocess.CompletedProcess(argv, 126, "", str(exc))


def run_as_or_raise(account: Account, argv: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run(
        argv,
        user=account.uid,
        group=account.gid,
        extra_groups=list(account.groups),
        env={"PATH": DEFAULT_JOB_PATH, "HOME": account.home},
        cwd="/",
        capture_output=True,
        text=True,
        timeout=30,
    )


@pytest.fixture(scope="module")
def accounts() -> Iterator[tuple[Account, Account]]:
    """Two throwaway accounts (removed with their homes afterwards)."""
    if os.geteuid() != 0:
        pytest.skip("running jobs as other accounts needs root (the test runs as a normal user)")
    if shutil.which("useradd") is None or shutil.which("userdel") is None:
        pytest.skip("useradd/userdel are not installed")
    names = [f"attune_t_{secrets.token_hex(3)}" for _ in range(2)]
    created = []
    try:
        for name in names:
            subprocess.run(["useradd", "-m", "-s", "/bin/bash", name], check=True, capture_output=True)
            created.append(name)
        yield tuple(lookup_account(name, node="test") for name in names)
    finally:
        for name in created:
            subprocess.run(["userdel", "-r", name], capture_output=True)


@pytest.fixture
def shared_dir() -> Iterator[Path]:
    """A directory every account can reach (pytest's tmp_path is root's alone)."""
    path = Path(tempfile.mkdtemp(prefix="attune-identity-", dir="/tmp"))
    os.chmod(path, 0o711)
    if not traversable_by_others(path / "x"):
        pytest.skip(f"{path} is not reachable by other accounts")
    yield path
    shutil.rmtree(path, ignore_errors=True)


JOB_SCRIPT = """\
id -u
id -G
umask
echo '{"done_iters": 3}' > "$ATTUNE_CHECKPOINT_PATH"
echo '{"done_iters": 3, "iters_per_s": 1.5}' > "$ATTUNE_PROGRESS_PATH"
echo to-stderr >&2
"""


def test_a_job_runs_as_its_owner_and_its_files_are_private(service, make_agent, accounts, shared_dir):
    alice, bob = accounts
    agent = make_agent(work_dir=shared_dir / "work")
    uuids = [g.uuid for g in agent.gpus]
    out_name = f"attune-{secrets.token_hex(3)}.out"
    service.commands = [
        script_cmd(
            "lease-a", JOB_SCRIPT, gpu_uuids=[uuids[0]], job_id=11, run_as=alice.name, stdout_path=out_name
        )
    ]
    agent.start()
    exited = wait_for(lambda: service.exited("lease-a"))["data"]
    assert exited["exit_code"] == 0, (exited, log_lines(service, "lease-a"))
    assert service.reports_for("lease-a", "started")[0]["data"]["user"] == alice.name

    out = Path(alice.home) / out_name
    uid_line, groups_line, umask_line = out.read_text().splitlines()[:3]
    assert int(uid_line) == alice.uid
    assert {int(g) for g in groups_line.split()} == set(alice.groups)
    assert umask_line == "0077"
    info = out.stat()
    assert info.st_uid == alice.uid and info.st_mode & 0o077 == 0  # 0600 or stricter
    assert run_as(bob, ["test", "-r", str(out)]).returncode != 0
    # Both the stdout file and the stderr (merged into it) reached the service; progress too.
    lines = log_lines(service, "lease-a")
    assert str(alice.uid) in lines and "to-stderr" in lines
    assert service.reports_for("lease-a", "progress")[-1]["data"]["done_iters"] == 3

    work = shared_dir / "work"
    checkpoint = work / "checkpoints" / "job-11" / "checkpoint.json"
    assert json.loads(checkpoint.read_text()) == {"done_iters": 3}
    assert checkpoint.parent.stat().st_uid == alice.uid and checkpoint.parent.stat().st_mode & 0o777 == 0o700
    job_dir = work / "leases" / "lease-a" / "job"
    for private in (job_dir, checkpoint.parent):
        assert run_as(bob, ["test", "-r", str(private)]).returncode != 0
        assert run_as(bob, ["ls", str(private)]).returncode != 0
    assert run_as(bob, ["ls", str(work / "checkpoints")]).returncode != 0  # traversable, not listable
    assert run_as(bob, ["cat", str(work / "leases" / "lease-a" / "exit-status.json")]).returncode != 0

    # Bob's own job cannot read Alice's checkpoint either.
    service.commands = [
        script_cmd(
            "lease-b", f"cat {checkpoint}; echo rc=$?", gpu_uuids=[uuids[1]], job_id=12, run_as=bob.name
        )
    ]
    wait_for(lambda: service.exited("lease-b"))
    lines = log_lines(service, "lease-b")
    assert any("Permission denied" in line for line in lines) and "rc=1" in lines, lines
    assert not any("done_iters" in line for line in lines)


def test_a_job_asking_for_root_is_refused(service, make_agent, accounts, shared_dir):
    agent = make_agent(work_dir=shared_dir / "work")
    service.commands = [script_cmd("lease-r", "id", gpu_uuids=[agent.gpus[0].uuid], run_as="root")]
    agent.start()
    exited = wait_for(lambda: service.exited("lease-r"))["data"]
    assert exited["exit_code"] is None and exited["error"].startswith("start failed: jobs never run as root")


TOKEN_PROBE = """\
echo "== env"; env
echo "== cmdline"; tr '\\0' ' ' < /proc/$$/cmdline; echo
echo "== shim"; tr '\\0' ' ' < /proc/$PPID/cmdline; echo; tr '\\0' ' ' < /proc/$PPID/environ; echo
echo "== agent"; tr '\\0' ' ' < /proc/$AGENT_PID/cmdline; echo; tr '\\0' ' ' < /proc/$AGENT_PID/environ; echo
lease_dir=$(dirname "$(dirname "$ATTUNE_PROGRESS_PATH")")
echo "== lease files"
for f in output.log exit-status.json job-env.json; do cat "$lease_dir/$f"; done
cat "$SPOOL_DIR/spool.sqlite3"; ls "$SPOOL_DIR" "$lease_dir" "$lease_dir/.."
echo "== readable"
find "$HOME" "$ATTUNE_CHECKPOINT_DIR" "$(dirname "$ATTUNE_PROGRESS_PATH")" -type f -readable 2>/dev/null
"""


def test_the_agent_token_never_reaches_the_job(accounts, shared_dir):
    alice, bob = accounts
    token = f"att_{secrets.token_hex(20)}"
    root = Path(__file__).resolve().parents[2]
    with FakeService(token=token) as service:
        agent = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "agent",
                "--server",
                service.url,
                "--token",  # in the argv and in the environment, as the brief's worst case
                token,
                "--name",
                "id-node",
                "--fake-gpus",
                "1",
                "--spool-dir",
                str(shared_dir / "spool"),
                "--work-dir",
                str(shared_dir / "work"),
                "--isolation",
                "affinity+rlimit",
                "--job-user",
                bob.name,  # never the account of users' jobs (refused)
            ],
            cwd=root,
            env={**os.environ, "PYTHONPATH": str(root), "ATTUNE_AGENT_TOKEN": token},
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            wait_for(lambda: service.registrations, timeout_s=15)
            out_name = f"attune-{secrets.token_hex(3)}.out"
            command = script_cmd(
                "lease-t",
                TOKEN_PROBE,
                gpu_uuids=[service.registrations[0]["gpus"][0]["uuid"]],
                run_as=alice.name,
                stdout_path=out_name,
                env={"AGENT_PID": str(agent.pid), "SPOOL_DIR": str(shared_dir / "spool")},
            )
            service.commands = [command]
            exited = wait_for(lambda: service.exited("lease-t"), timeout_s=15)["data"]
        finally:
            agent.send_signal(signal.SIGTERM)
            _, stderr = agent.communicate(timeout=15)
    assert exited["exit_code"] == 0, (exited, stderr)
    output = (Path(alice.home) / out_name).read_text()
    assert "== agent" in output and "== readable" in output, output
    assert "batch-script" in output.split("== cmdline", 1)[1].split("== shim", 1)[0]  # its own command line
    assert token not in output  # its env, command line, the shim's and the agent's /proc entries
    assert "Permission denied" in output.split("== lease files", 1)[1]  # the agent's own files stay shut
    readable = output.split("== readable\n", 1)[1].split()
    assert any(path.endswith("batch-script") for path in readable)  # the probe saw what the job can see
    for path in readable:  # and every file under the agent's directories it can open
        assert token not in Path(path).read_text(errors="replace"), path
    assert token not in json.dumps(service.reports_for("lease-t"))
    assert "moving the agent token from the command line" in stderr


def test_a_catalog_workload_runs_as_the_job_account(service, make_agent, accounts, shared_dir):
    alice, _bob = accounts
    if run_as(alice, ["test", "-r", str(AGENT_ROOT / "agent" / "workload.py")]).returncode != 0:
        pytest.skip(f"the repository {AGENT_ROOT} is not readable by other accounts")
    # The agent's interpreter must be usable by the job account; this test's may sit under /root.
    usable = [
        exe
        for exe in (sys.executable, shutil.which("python3"), "/usr/bin/python3")
        if exe
        and run_as(alice, [exe, "-c", "import sys; assert sys.version_info >= (3, 11)"]).returncode == 0
    ]
    if not usable:
        pytest.skip("no Python 3.11+ interpreter here is usable by other accounts")
    agent = make_agent(work_dir=shared_dir / "work", job_user=alice.name)
    agent.launcher.python = usable[0]
    service.commands = [start_cmd("lease-c", gpu_uuids=[agent.gpus[0].uuid], job_id=21, iters=30)]
    agent.start()
    exited = wait_for(lambda: service.exited("lease-c"))["data"]
    assert exited["exit_code"] == 0 and exited["done_iters"] == 30, log_lines(service, "lease-c")
    assert service.reports_for("lease-c", "started")[0]["data"]["user"] == alice.name
    checkpoint = shared_dir / "work" / "checkpoints" / "job-21" / "checkpoint.json"
    assert checkpoint.stat().st_uid == alice.uid
    assert json.loads(checkpoint.read_text())["done_iters"] == 30


def test_no_users_job_can_touch_a_catalog_jobs_checkpoints(service, make_agent, accounts, shared_dir):
    """Catalog jobs run as --job-user (bob here) in checkpoint directories of their own, 0700: a user's
    job (alice) can neither read nor change them, and no user's job may run as bob."""
    alice, bob = accounts
    agent = make_agent(work_dir=shared_dir / "work", job_user=bob.name)
    uuids = [g.uuid for g in agent.gpus]
    write = """echo '{"done_iters": 7}' > "$ATTUNE_CHECKPOINT_PATH"; id -u"""
    service.commands = [script_cmd("lease-cat", write, gpu_uuids=[uuids[0]], job_id=31)]  # run_as null
    agent.start()
    exited = wait_for(lambda: service.exited("lease-cat"))["data"]
    assert exited["exit_code"] == 0, (exited, log_lines(service, "lease-cat"))
    assert str(bob.uid) in log_lines(service, "lease-cat")
    checkpoint = shared_dir / "work" / "checkpoints" / "job-31" / "checkpoint.json"
    info = checkpoint.parent.stat()
    assert info.st_uid == bob.uid and info.st_mode & 0o777 == 0o700

    probe = (
        f"cat {checkpoint}; echo read=$?; echo x >> {checkpoint}; echo write=$?; "
        f"ls {checkpoint.parent}; echo ls=$?"
    )
    service.commands = [
        script_cmd("lease-own", probe, gpu_uuids=[uuids[1]], job_id=32, run_as=alice.name),
        script_cmd("lease-as-bob", probe, gpu_uuids=[uuids[1]], job_id=33, run_as=bob.name),
    ]
    wait_for(lambda: service.exited("lease-own"))
    lines = log_lines(service, "lease-own")
    assert {"read=1", "write=1", "ls=2"} <= set(lines), lines
    assert not any("done_iters" in line for line in lines)
    refused = wait_for(lambda: service.exited("lease-as-bob"))["data"]
    assert refused["error"].startswith(
        f"start failed: account '{bob.name}' is this node's account for catalog"
    )
    assert json.loads(checkpoint.read_text()) == {"done_iters": 7}
