"""The command line against a live service: login, submit (with a dependency), queue, show, cancel."""

from __future__ import annotations

import json
import os
import re
import signal
import stat
import subprocess
import sys
import threading
import time
from datetime import timedelta

import pytest
from django.db import connection, transaction

from cli.api import Api
from scheduler_app.models import Allocation, Job, JobState
from scheduler_app.services.job_control import job_finish
from scheduler_app.services.rounds import scheduling_round_run
from tests.api.helpers import make_server, workload
from tests.cli.helpers import run, usage_error
from tests.factories import UserFactory
from tests.standalone import ROOT, assert_imports_no_service, standalone_env

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("fifo_proportional_minute_rounds"),
]


def test_a_user_logs_in_submits_a_pipeline_watches_the_queue_and_cancels(service, tmp_path, capsys):
    code, out, _ = run(capsys, "--server", service, "login", "--username", "alice")
    assert code == 0 and "Logged in" in out
    saved = tmp_path / "token"
    assert stat.S_IMODE(saved.stat().st_mode) == 0o600 and saved.read_text().split()[0] == service

    # Later commands find the service and the token in the saved login.
    code, out, _ = run(capsys, "submit", "train", "--workload", "res18", "--gpus", "2", "--iters", "5000")
    assert code == 0, out
    train = Job.objects.get(name="train")
    assert out.splitlines()[0] == f"Submitted job {train.pk}" and "predicted start" in out
    code, out, _ = run(
        capsys,
        "submit",
        "eval",
        "--command",
        "python eval.py",
        "--gpus",
        "1",
        "--iters",
        "100",
        "--time-limit",
        "30m",
        "--max-latency",
        "1-00:00:00",
        "--after",
        str(train.pk),
    )
    assert code == 0, out
    evaluate = Job.objects.get(name="eval")
    assert list(evaluate.depends_on.values_list("pk", flat=True)) == [train.pk]
    assert (evaluate.command, evaluate.time_limit_s, evaluate.qos_max_latency_s) == (
        "python eval.py",
        1800,
        86400,
    )
    # sbatch's --wrap is --command.
    code, out, _ = run(capsys, "submit", "--wrap", "python plot.py", "-J", "plot", "--gpus", "1")
    assert code == 0 and Job.objects.get(name="plot").command == "python plot.py"

    code, out, _ = run(capsys, "queue")
    header, *rows = out.splitlines()
    assert header.split() == [
        *("JOBID", "NAME", "USER", "STATE", "GPUS", "REASON", "POS", "START", "END", "QOS")
    ]
    by_id = {row.split()[0]: row.split() for row in rows}
    assert by_id[str(train.pk)][1:5] == ["train", "alice", "PENDING", "2"]
    assert by_id[str(evaluate.pk)][5] == "Dependency"
    # The QOS column: eval's maximum latency as the time it must finish by; train has no target.
    qos_at = out.splitlines()[0].index("QOS")
    qos = {row.split()[0]: row[qos_at:].strip() for row in rows}
    deadline = (evaluate.submitted_at + timedelta(days=1)).astimezone().strftime("%Y-%m-%d %H:%M")
    assert qos[str(evaluate.pk)] in (deadline, deadline + "!") and qos[str(train.pk)] == ""

    code, out, _ = run(capsys, "show", str(evaluate.pk))
    assert (
        code == 0 and re.search(rf"^After jobs +{train.pk}$", out, re.M) and "command: python eval.py" in out
    )
    # Nothing happened since the submission: the current estimate is the one predicted then.
    estimated = re.search(r"^Estimated start +(\S+ \S+)$", out, re.M).group(1)
    assert re.search(rf"^Predicted at submission +start {estimated}, ", out, re.M)

    # A round places the first job; its lease and output are what `show` and `log` print.
    scheduling_round_run()
    lease = train.allocations.get()
    Allocation.objects.filter(pk=lease.pk).update(log_tail="epoch 1 loss 2.31\nepoch 2 loss 1.87")
    code, out, _ = run(capsys, "show", str(train.pk))
    assert re.search(r"^State +RUNNING$", out, re.M)
    assert re.search(rf"^Lease +gpu01 GPUs 0,1, {lease.num_cpus} cores", out, re.M)
    assert re.search(r"^Estimated finish +\d{4}-\d\d-\d\d \d\d:\d\d$", out, re.M)
    assert re.search(r"^Predicted at submission +start \d{4}-\d\d-\d\d \d\d:\d\d, finish ", out, re.M)
    assert run(capsys, "log", str(train.pk)) == (0, "epoch 1 loss 2.31\nepoch 2 loss 1.87\n", "")

    assert run(capsys, "hold", str(evaluate.pk)) == (0, f"job {evaluate.pk}: PENDING (JobHeldUser)\n", "")
    assert run(capsys, "release", str(evaluate.pk)) == (0, f"job {evaluate.pk}: PENDING (Priority)\n", "")
    code, _, err = run(capsys, "hold", str(train.pk))
    # The service's refusal names the job: said once, not "job 4: job 4 is RUNNING".
    assert code == 1 and err == f"job {train.pk} is RUNNING: only a pending job can be held\n"

    code, out, err = run(capsys, "cancel", str(train.pk), "999999")
    assert code == 1 and out == f"job {train.pk}: CANCELLED\n"
    assert err == "job 999999: no job 999999 (or not yours to see)\n"
    train.refresh_from_db()
    assert train.state == JobState.CANCELLED
    assert run(capsys, "cancel", str(train.pk)) == (1, "", f"job {train.pk} is already CANCELLED\n")


def test_the_services_refusals_reach_the_user_field_by_field(service, capsys):
    run(capsys, "--server", service, "login", "--username", "alice")
    before = Job.objects.count()
    code, _, err = run(
        capsys, "submit", "x", "--workload", "res18", "--gpus", "1", "--iters", "10", "--after", "424242"
    )
    assert code == 1 and err == "error: --dependency: No job 424242 that you can see.\n"
    workload("res50")
    code, _, err = run(capsys, "submit", "x", "--workload", "nope", "--gpus", "1", "--iters", "10")
    assert (code, err) == (
        1,
        "error: unknown workload 'nope': choose one of res18, res50 (python -m cli workloads lists them)\n",
    )
    # Another field's refusal still comes, in the service's words.
    code, _, err = run(capsys, "submit", "x", "--workload", "nope", "--priority", "5", "--iters", "10")
    assert code == 1 and err.splitlines() == [
        "error: unknown workload 'nope': choose one of res18, res50 (python -m cli workloads lists them)",
        "--priority: Only staff may raise a job's priority.",
    ]
    # A team: the service's own message names the teams there are.
    code, _, err = run(capsys, "submit", "x", "--command", "true", "--team", "nope")
    assert (code, err) == (1, "error: --team: Unknown team “nope”: there are none yet.\n")
    code, _, err = run(
        capsys, "submit", "x", "--workload", "res18", "--gpus", "1", "--iters", "10", "--max-latency", "soon"
    )
    assert code == 2 and err == (
        "error: --max-latency takes MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS "
        "(or 30m, 6h, 1h30m, 3h30, 2d): "
        "'soon' is not a duration\n"
    )
    code, _, err = run(capsys, "submit", "x", "--command", "true", "-t", "1-24:00")
    assert code == 2 and err == "error: --time: hours must be 0-23, minutes and seconds 0-59 after the days\n"
    code, _, err = run(capsys, "submit", "x", "--gpus", "1", "--iters", "10")
    assert code == 2 and "--workload NAME or --command" in err
    assert Job.objects.count() == before


def test_without_a_login_or_a_service_the_user_is_told_what_to_do(service, tmp_path, capsys, monkeypatch):
    code, _, err = run(capsys, "--server", service, "queue")
    assert code == 1 and "run `python -m cli login`" in err
    code, _, err = run(capsys, "--server", service, "--token", "wrong", "queue")
    assert code == 1 and "does not know you" in err
    code, _, err = run(capsys, "--server", "http://127.0.0.1:9", "--token", "t", "queue")
    assert code == 1 and "cannot reach the Attune service at http://127.0.0.1:9" in err
    monkeypatch.setenv("ATTUNE_PASSWORD", "wrong")
    code, _, err = run(capsys, "--server", service, "login", "--username", "alice")
    assert code == 1 and "Unable to log in" in err and not (tmp_path / "token").exists()


def test_the_command_line_imports_no_django_and_explains_itself():
    assert_imports_no_service("cli")
    result = subprocess.run(
        [sys.executable, "-m", "cli", "submit", "--help"],
        cwd=ROOT,
        env=standalone_env(),
        capture_output=True,
        text=True,
    )
    assert (
        result.returncode == 0
        and "--dependency=afterok" in result.stdout
        and "--max-latency" in result.stdout
    )


def _changes(out: str) -> list[str]:
    """The change lines of `wait` without their time: "job 42: RUNNING 50%"."""
    lines = [line for line in out.splitlines() if re.match(r"\d\d:\d\d:\d\d  job ", line)]
    return [line[10:] for line in lines]


class Polls:
    """Counts the command line's polls, so that each change the test makes is seen by one of them
    however slow the machine (a fixed sleep would miss a change now and then)."""

    def __init__(self, monkeypatch) -> None:
        self.count = 0
        self.changed = threading.Condition()
        listed = Api.jobs

        def counted(api: Api, params: dict) -> list[dict]:
            jobs = listed(api, params)
            with self.changed:
                self.count += 1
                self.changed.notify_all()
            return jobs

        monkeypatch.setattr(Api, "jobs", counted)

    def two_more(self) -> None:
        """Return after two more polls: the second began after this call, so it saw what came before."""
        with self.changed:
            target = self.count + 2
            assert self.changed.wait_for(lambda: self.count >= target, timeout=60)


def test_submit_wait_prints_each_change_as_it_happens_and_returns_with_the_outcome(
    service, capsys, monkeypatch
):
    run(capsys, "--server", service, "login", "--username", "alice")
    polls = Polls(monkeypatch)

    def end_later(name: str, state: str, exit_code: int | None, message: str = "") -> threading.Thread:
        def end() -> None:
            while not Job.objects.filter(name=name).exists():
                time.sleep(0.05)
            job = Job.objects.get(name=name)
            polls.two_more()  # seen PENDING
            scheduling_round_run()
            polls.two_more()  # seen RUNNING
            Job.objects.filter(pk=job.pk).update(done_iters=5)
            polls.two_more()  # seen half done
            if state == JobState.COMPLETED:
                Job.objects.filter(pk=job.pk).update(done_iters=10)  # the agent's last progress report
            with transaction.atomic():
                job_finish(
                    job=Job.objects.select_for_update().get(pk=job.pk),
                    state=state,
                    exit_code=exit_code,
                    reason=f"exit_{exit_code}" if message else "",
                    message=message,
                )
            connection.close()

        thread = threading.Thread(target=end)
        thread.start()
        return thread

    submit = ["submit", "--workload", "res18", "--gpus", "1", "--iters", "10", "--wait", "--poll-s", "0.05"]
    thread = end_later("ok", JobState.COMPLETED, 0)
    code, out, _ = run(capsys, *submit[:1], "ok", *submit[1:])
    thread.join()
    ok = Job.objects.get(name="ok")
    # One line per change, not one per poll.
    assert polls.count > 6
    assert code == 0 and _changes(out) == [
        f"job {ok.pk}: PENDING (Priority)",
        f"job {ok.pk}: RUNNING 0%",
        f"job {ok.pk}: RUNNING 50%",
        f"job {ok.pk}: COMPLETED 100%",
    ]
    assert "reason:" not in out
    failed = "start failed: cannot open the stdout file '/home/x/attune-9.out': Permission denied"
    thread = end_later("bad", JobState.FAILED, 126, failed)
    code, out, _ = run(capsys, *submit[:1], "bad", *submit[1:])
    thread.join()
    # Why it failed follows its last line, as `show` says it: the newcomer need not look it up.
    assert code == 126 and _changes(out)[-1].endswith("FAILED 50% (exit code 126)")
    assert out.splitlines()[-1] == f"  reason: exit_126: {failed}"
    code, out, _ = run(capsys, "wait", str(ok.pk))
    assert code == 0 and _changes(out) == [f"job {ok.pk}: COMPLETED 100%"]


def test_an_array_is_submitted_and_listed_task_by_task(service, capsys):
    run(capsys, "--server", service, "login", "--username", "alice")
    code, out, _ = run(
        capsys, "submit", "sweep", "--workload", "res18", "--gpus", "1", "--iters", "10", "--array", "0-2"
    )
    tasks = list(Job.objects.filter(name="sweep").order_by("array_task_id"))
    assert (
        code == 0
        and out == f"Submitted array job {tasks[0].pk}: 3 tasks, jobs {tasks[0].pk} to {tasks[2].pk}\n"
    )
    code, out, _ = run(capsys, "queue", "--array", str(tasks[0].pk))
    names = sorted(line.split()[1] for line in out.splitlines()[1:])
    assert names == ["sweep[0]", "sweep[1]", "sweep[2]"]
    code, out, _ = run(capsys, "show", str(tasks[1].pk))
    assert code == 0 and re.search(rf"^Array +{tasks[0].pk}_1: task 1 of array {tasks[0].pk}$", out, re.M)
    # sbatch's %N: at most N tasks at once, said by show.
    code, out, _ = run(
        capsys, "submit", "few", "--workload", "res18", "--gpus", "1", "--iters", "10", "--array", "0-3%2"
    )
    limited = list(Job.objects.filter(name="few").order_by("array_task_id"))
    assert code == 0 and [t.array_task_limit for t in limited] == [2] * 4
    code, out, _ = run(capsys, "show", str(limited[3].pk))
    assert re.search(
        rf"^Array +{limited[0].pk}_3: task 3 of array {limited[0].pk}, at most 2 tasks at once$", out, re.M
    )
    # squeue's lines: the pending tasks waiting for the same reason share one; -r lists each.
    code, out, _ = run(capsys, "queue", "-n", "few")
    assert [line.split()[:4] for line in out.splitlines()[1:]] == [
        [f"{limited[0].pk}_[0-3%2]", "few", "alice", "PENDING"]
    ]
    code, out, _ = run(capsys, "queue", "-n", "few", "-r")
    assert [line.split()[1] for line in out.splitlines()[1:]] == [f"few[{i}]" for i in range(4)]
    code, _, err = run(
        capsys, "submit", "x", "--workload", "res18", "--gpus", "1", "--iters", "1", "--array", "x"
    )
    assert code == 1 and err.startswith("error: --array: “x” is not an index or a range")
    # Slurm's ARRAYID_INDEX names a task wherever a job id goes.
    first = tasks[0].pk
    code, out, _ = run(capsys, "show", f"{first}_2", "--json")
    assert code == 0 and json.loads(out)["id"] == tasks[2].pk
    assert run(capsys, "hold", f"{first}_2", f"{first}_0") == (
        0,
        f"job {tasks[2].pk}: PENDING (JobHeldUser)\njob {first}: PENDING (JobHeldUser)\n",
        "",
    )
    run(capsys, "release", f"{first}_2", str(first))
    code, _, err = run(capsys, "show", f"{first}_9")
    assert (code, err) == (1, f"error: {first}_9: no task 9 in array {first} (or not yours to see)\n")
    assert "'x_1' is not a job id: give 42, or an array's task as 42_3" in usage_error(capsys, "show", "x_1")
    # scancel ARRAYID: every task still in the queue.
    Job.objects.filter(pk=tasks[1].pk).update(state=JobState.COMPLETED)
    code, out, _ = run(capsys, "cancel", "--array", str(tasks[0].pk))
    assert code == 0 and out == f"job {tasks[0].pk}: CANCELLED\njob {tasks[2].pk}: CANCELLED\n"
    assert run(capsys, "cancel")[0] == 2  # nothing named


def test_a_reader_that_goes_away_ends_the_command_quietly_with_a_pipes_status(service, capsys, tmp_path):
    run(capsys, "--server", service, "login", "--username", "alice")
    run(capsys, "submit", "listed", "--workload", "res18", "--gpus", "1", "--iters", "10")
    read_end, write_end = os.pipe()
    os.close(read_end)  # `attune queue | head -0`: nobody reads what it prints
    env = {**standalone_env(), "ATTUNE_TOKEN_FILE": os.environ["ATTUNE_TOKEN_FILE"]}
    with os.fdopen(write_end, "wb") as stdout:
        result = subprocess.run(
            [sys.executable, "-m", "cli", "queue"], stdout=stdout, stderr=subprocess.PIPE, env=env, cwd=ROOT
        )
    assert result.returncode == 128 + signal.SIGPIPE and "Traceback" not in result.stderr.decode()


def test_cancel_takes_scancels_filters_name_user_and_state(service, capsys):
    run(capsys, "--server", service, "login", "--username", "alice")
    submit = ["--workload", "res18", "--gpus", "4", "--iters", "10"]
    run(capsys, "submit", "sweep", *submit)
    scheduling_round_run()  # the first sweep runs, the rest wait (one 4-GPU server)
    run(capsys, "submit", "sweep", *submit)
    run(capsys, "submit", "other", *submit)
    running, waiting = Job.objects.filter(name="sweep").order_by("pk")
    other = Job.objects.get(name="other")
    bobs = Job.objects.create(owner=UserFactory(username="bob"), name="sweep", num_gpus=1, command="true")

    def states() -> dict[int, str]:
        return dict(Job.objects.values_list("pk", "state"))

    # scancel -n sweep -t PD: the pending sweep only; neither the running one, nor bob's (not -u bob).
    assert run(capsys, "cancel", "-n", "sweep", "-t", "PD") == (0, f"job {waiting.pk}: CANCELLED\n", "")
    # With ids, only those of them that match.
    assert (
        run(capsys, "cancel", str(other.pk), str(running.pk), "-t", "R")[1]
        == f"job {running.pk}: CANCELLED\n"
    )
    assert states() == {
        running.pk: JobState.CANCELLED,
        waiting.pk: JobState.CANCELLED,
        other.pk: JobState.PENDING,
        bobs.pk: JobState.PENDING,
    }
    assert run(capsys, "cancel", "-n", "nothing") == (0, "", "no pending or running job matches\n")
    # -u someone else: each is refused by the service (only staff may), as scancel's are.
    code, out, err = run(capsys, "cancel", "-u", "bob")
    assert (code, out) == (1, "") and err == f"job {bobs.pk}: Only the job's owner or staff may change it.\n"
    assert run(capsys, "cancel", "-u", "alice") == (0, f"job {other.pk}: CANCELLED\n", "")
    assert run(capsys, "cancel", "-t", "CD") == (
        2,
        "",
        "error: -t: only PENDING or RUNNING jobs can be cancelled\n",
    )


def test_a_batch_script_is_submitted_with_its_directives_and_the_options_given_win(service, tmp_path, capsys):
    run(capsys, "--server", service, "login", "--username", "alice")
    script = tmp_path / "train.sh"
    script.write_text(
        "#!/bin/bash\n"
        "#SBATCH --job-name=from-script --gpus=2\n"
        "#SBATCH --time=1:00:00\n"
        "#ATTUNE --iters 50\n"
        "python train.py\n"
    )
    code, out, _ = run(capsys, "submit", str(script), "--gpus", "1")
    assert code == 0, out
    job = Job.objects.get(name="from-script")
    assert (job.num_gpus, job.time_limit_s, job.total_iters) == (1, 3600, 50)
    assert "#SBATCH --time=1:00:00" in job.script

    script.write_text("#!/bin/bash\n#SBATCH --job-name=bad\n#SBATCH --gpus=abc\npython train.py\n")
    code, _, err = run(capsys, "submit", str(script))
    assert code == 1 and err == (
        f"error: {script}: line 3: #SBATCH --gpus=abc: --gpus needs a whole number of GPUs\n"
    )
    assert not Job.objects.filter(name="bad").exists()


def test_every_supported_directive_is_stored_as_it_says(service, tmp_path, capsys):
    make_server("gpu02", gpus=4, cpus=12, mem_gb=250)
    from tests.factories import TeamFactory

    TeamFactory(name="vision").members.add(UserFactory(username="alice"))
    run(capsys, "--server", service, "login", "--username", "alice")
    code, out, _ = run(capsys, "submit", "first", "--command", "true", "--gpus", "1")
    assert code == 0, out
    first = Job.objects.get(name="first")
    script = tmp_path / "all.sh"
    script.write_text(
        "#!/bin/bash\n"
        "#SBATCH --job-name=all-directives\n"
        "#SBATCH --gres=gpu:4 --nodes=2\n"
        "#SBATCH -t 1-02:03:04\n"
        "#SBATCH --array=0-1\n"
        f"#SBATCH --dependency=afterok:{first.pk}\n"
        "#SBATCH --output=%x-%A_%a.out --error=%x-%A_%a.err\n"
        "#SBATCH --chdir=/srv/runs\n"
        "#SBATCH --hold\n"
        "#SBATCH --cpus-per-gpu=3 --mem-per-gpu=8G\n"
        "#ATTUNE --iters 500 --team vision --max-latency 2d\n"
        "torchrun train.py\n"
    )
    code, out, _ = run(capsys, "submit", str(script))
    assert code == 0, out
    tasks = list(Job.objects.filter(name="all-directives").order_by("array_task_id"))
    assert [t.array_task_id for t in tasks] == [0, 1]
    for job in tasks:
        assert (job.num_gpus, job.num_nodes, job.time_limit_s) == (4, 2, 93784)
        assert (job.output_path, job.error_path) == ("%x-%A_%a.out", "%x-%A_%a.err")
        assert job.work_dir == "/srv/runs"
        assert job.held and list(job.depends_on.values_list("pk", flat=True)) == [first.pk]
        assert (job.cpus_per_gpu, job.mem_gb_per_gpu, job.total_iters) == (3.0, 8.0, 500)
        assert job.team.name == "vision" and job.qos_max_latency_s == 2 * 86400
        assert job.run_as == "alice" and job.script == script.read_text()


@pytest.mark.parametrize(
    ("typed", "seconds"),
    [("90m", 5400), ("6h", 21600), ("1-12:00", 129600), ("30", 1800), ("01:30:00", 5400), ("1h30m", 5400)],
)
def test_an_own_command_needs_no_iterations_and_every_duration_takes_slurms_formats(
    service, capsys, typed, seconds
):
    run(capsys, "--server", service, "login", "--username", "alice")
    code, out, _ = run(
        capsys, "submit", "mine", "--command", "python train.py", "-t", typed, "--max-latency", typed
    )
    assert code == 0, out
    job = Job.objects.get(name="mine")
    assert (job.total_iters, job.time_limit_s, job.qos_max_latency_s) == (None, seconds, seconds)


def test_queue_takes_squeues_state_codes_and_user_and_lists_the_states_it_knows(service, capsys):
    run(capsys, "--server", service, "login", "--username", "alice")
    run(capsys, "submit", "big", "--workload", "res18", "--gpus", "4", "--iters", "10")
    scheduling_round_run()
    run(capsys, "submit", "waits", "--workload", "res18", "--gpus", "4", "--iters", "10")

    def names(*argv: str) -> list[str]:
        code, out, err = run(capsys, "queue", *argv)
        assert code == 0, err
        return [line.split()[1] for line in out.splitlines()[1:]]

    assert names("-t", "pd") == ["waits"]
    assert names("--state", "R") == ["big"]
    assert names("-t", "R,PD") == names("-t", "running", "-t", "PENDING") == ["big", "waits"]
    assert names("--name", "waits") == names("-n", "waits") == ["waits"]
    assert names("-u", "alice") == names("--user", "alice") == ["big", "waits"]  # squeue -u
    assert names("-u", "bob") == []
    run(capsys, "cancel", str(Job.objects.get(name="waits").pk))
    # squeue -t all: every state, as --all.
    assert names("-t", "all") == names("--all") == names("-t", "R,CA") == ["big", "waits"]
    err = usage_error(capsys, "queue", "--state", "active")
    assert (
        "unknown state 'active': choose one of PENDING, RUNNING, COMPLETED, FAILED, CANCELLED, PREEMPTED, "
        "TIMEOUT, NODE_FAIL, OUT_OF_MEMORY (or squeue's PD, R, CD, F, CA, PR, TO, NF, OOM, or all)"
    ) in err


def test_update_lowers_a_time_limit_and_changes_an_arrays_limit_as_scontrol_update(service, capsys):
    run(capsys, "--server", service, "login", "--username", "alice")
    run(capsys, "submit", "one", "--workload", "res18", "--gpus", "1", "--iters", "10", "-t", "2h")
    job = Job.objects.get(name="one")
    assert run(capsys, "update", str(job.pk), "-t", "90m") == (0, f"job {job.pk}: time limit 01:30:00\n", "")
    code, _, err = run(capsys, "update", str(job.pk), "-t", "3h")
    assert code == 1 and "only staff can raise a time limit (5400 s now); you may lower it" in err
    code, _, err = run(capsys, "update", str(job.pk), "--array-limit", "2")
    assert code == 1 and err == f"job {job.pk}: array_task_limit: job {job.pk} is not a task of an array.\n"
    assert run(capsys, "update", str(job.pk))[0] == 2
    run(capsys, "submit", "few", "--workload", "res18", "--gpus", "1", "--iters", "10", "--array", "0-3%1")
    first, third = (Job.objects.get(name="few", array_task_id=i).pk for i in (0, 2))
    code, out, _ = run(capsys, "update", f"{first}_2", "--array-limit", "3")
    assert (code, out) == (0, f"job {third}: time limit none, array {first}: at most 3 tasks at once\n")
    assert set(Job.objects.filter(array_job_id=first).values_list("array_task_limit", flat=True)) == {3}
    # scontrol update JobId=ARRAYID: every live task of the array; an ended one is left as it was.
    Job.objects.filter(pk=first).update(state=JobState.COMPLETED)
    code, out, err = run(capsys, "update", "--array", str(first), "-t", "1h")
    tasks = Job.objects.filter(array_job_id=first).order_by("array_task_id")
    assert (code, err) == (0, "") and out.count("time limit 01:00:00") == 3
    assert [t.time_limit_s for t in tasks] == [None, 3600, 3600, 3600]
    # A list of jobs: one refused (not an array's task) does not stop the others, and exits 1.
    code, out, err = run(capsys, "update", str(job.pk), f"{first}_3", "--array-limit", "2")
    assert code == 1 and f"job {job.pk}: array_task_limit:" in err and "at most 2 tasks at once" in out
    assert run(capsys, "update", "-t", "1h") == (
        2,
        "",
        "error: give job ids, or --array ID (with pending or running tasks)\n",
    )
