"""What a Slurm user expects of the command line, against a live service: `show` as `scontrol show job`,
`acct --jobs` as sacct, the service's refusals in its own words, options named as typed, sbatch's times."""

from __future__ import annotations

import re

import pytest

from cli.api import Api
from scheduler_app.models import Job, JobState
from scheduler_app.services.job_control import job_finish
from scheduler_app.services.rounds import scheduling_round_run
from tests.cli.helpers import run
from tests.factories import UserFactory

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("fifo_proportional_minute_rounds"),
]


def _field(out: str, label: str) -> str:
    match = re.search(rf"^{label} +(.*)$", out, re.M)
    assert match, f"no {label!r} line in:\n{out}"
    return match.group(1)


def test_show_states_exit_code_reason_nodes_times_limit_directory_and_files(service, tmp_path, capsys):
    run(capsys, "--server", service, "login", "--username", "alice")
    code, out, _ = run(
        capsys, "submit", "-J", "train", "--command", "python train.py", "--gpus", "2", "-t", "3h30",
        "-D", str(tmp_path), "-o", "logs/%x-%j.out", "-e", "logs/%x-%j.err",
    )  # fmt: skip
    assert code == 0, out
    job = Job.objects.get(name="train")
    assert job.time_limit_s == 3 * 3600 + 30 * 60  # sbatch --time=3:30:00

    out = run(capsys, "show", str(job.pk))[1]
    assert _field(out, "State") == "PENDING (Priority)" or _field(out, "State").startswith("PENDING (")
    assert (_field(out, "Exit code"), _field(out, "Nodes"), _field(out, "Elapsed")) == ("-", "-", "-")
    assert _field(out, "Time limit") == "03:30:00"
    assert _field(out, "Working directory") == str(tmp_path)
    assert _field(out, "Output") == f"{tmp_path}/logs/train-{job.pk}.out"
    assert _field(out, "Error") == f"{tmp_path}/logs/train-{job.pk}.err"

    scheduling_round_run()
    out = run(capsys, "show", str(job.pk))[1]
    assert _field(out, "State") == "RUNNING" and _field(out, "Nodes") == "gpu01"
    assert re.fullmatch(r"00:00:\d\d", _field(out, "Elapsed"))

    job.refresh_from_db()
    job_finish(job=job, state=JobState.FAILED, exit_code=3, reason="exit_code", message="exited with 3")
    out = run(capsys, "show", str(job.pk))[1]
    assert _field(out, "State") == "FAILED" and _field(out, "Exit code") == "3"
    assert _field(out, "Reason") == "exit_code: exited with 3"
    assert _field(out, "Nodes") == "gpu01"  # where it ran last
    assert _field(out, "Finished") != "-"

    # A catalog workload has no files of its own; its output is the service's log.
    run(capsys, "submit", "r18", "--workload", "res18", "--gpus", "1", "--iters", "100", "-t", "1-0")
    r18 = Job.objects.get(name="r18")
    out = run(capsys, "show", str(r18.pk))[1]
    assert _field(out, "Time limit") == "1-00:00:00" and _field(out, "Output") == "the service's log (`log`)"


def test_acct_jobs_lists_ones_own_jobs_as_sacct_with_filters(service, capsys):
    run(capsys, "--server", service, "login", "--username", "alice")
    for name in ("one", "two"):
        assert run(capsys, "submit", "-J", name, "--command", "true", "--gpus", "1")[0] == 0
    bob = UserFactory(username="bob")
    Job.objects.create(owner=bob, name="bobs", num_gpus=1, command="true", run_as="bob")
    scheduling_round_run()
    one, two = Job.objects.get(name="one"), Job.objects.get(name="two")
    one.refresh_from_db()
    job_finish(job=one, state=JobState.COMPLETED, exit_code=0)

    code, out, _ = run(capsys, "acct", "--jobs")
    header, *rows = out.splitlines()
    assert header.split() == [
        *("JOBID", "NAME", "STATE", "EXIT", "ELAPSED", "GPUS", "NODES", "SUBMITTED", "END", "USER")
    ]
    cells = {row.split()[0]: row.split() for row in rows}
    assert set(cells) == {str(one.pk), str(two.pk)}  # only one's own: bob's is not listed
    assert cells[str(one.pk)][1:4] == ["one", "COMPLETED", "0"]
    assert re.fullmatch(r"\d\d:\d\d:\d\d", cells[str(one.pk)][4]) and cells[str(one.pk)][5:7] == [
        "1",
        "gpu01",
    ]
    assert cells[str(two.pk)][1:4] == ["two", "RUNNING", "-"]

    assert [r.split()[0] for r in run(capsys, "acct", "--jobs", "-s", "CD")[1].splitlines()[1:]] == [
        str(one.pk)
    ]
    assert len(run(capsys, "acct", "--jobs", "--since", "1h")[1].splitlines()) == 3
    assert len(run(capsys, "acct", "--jobs", "--since", "2999-01-01")[1].splitlines()) == 1
    # Another user's jobs on request (everyone sees every job's summary unless jobs are private).
    assert "bobs" in run(capsys, "acct", "--jobs", "-u", "bob")[1]
    code, _, err = run(capsys, "acct", "--jobs", "--since", "soonish")
    assert code == 2 and "--since takes a date" in err
    code, _, err = run(capsys, "acct", "--state", "CD")
    assert code == 2 and "go with --jobs" in err


def test_the_services_refusals_of_another_users_job_reach_the_user(service, capsys):
    """cancel, hold and log of a job that is not yours: the service's words, exit 1, never "log in"."""
    run(capsys, "--server", service, "login", "--username", "alice")
    bob = UserFactory(username="bob")
    theirs = Job.objects.create(owner=bob, name="theirs", num_gpus=1, command="echo secret", run_as="bob")
    for action in ("cancel", "hold"):
        code, out, err = run(capsys, action, str(theirs.pk))
        assert (code, out) == (1, "")
        assert err == f"job {theirs.pk}: Only the job's owner or staff may change it.\n"
    code, out, err = run(capsys, "log", str(theirs.pk))
    assert (code, out) == (1, "")
    assert err == f"error: job {theirs.pk} is bob's: its output is shown to its owner and staff only\n"
    out = run(capsys, "show", str(theirs.pk))[1]
    assert _field(out, "Output") == "(another user's job: shown to its owner and staff)"
    assert "echo secret" not in out
    theirs.refresh_from_db()
    assert theirs.state == JobState.PENDING and not theirs.held


def test_refusals_name_the_options_typed_not_the_apis_fields(service, capsys):
    run(capsys, "--server", service, "login", "--username", "alice")
    code, _, err = run(capsys, "submit", "x", "--workload", "res18", "--gpus", "0")
    assert code == 1
    assert err == "error: --gpus: Ensure this value is greater than or equal to 1.\n"
    code, _, err = run(capsys, "submit", "x", "--workload", "res18", "--gpus", "1")
    assert code == 1 and err.startswith("error: --iters: "), err
    assert "total_iters" not in err
    assert not Job.objects.exists()


def test_the_api_lists_nodes_and_expanded_files_and_filters_ones_own(service, capsys):
    """What `show` and `acct --jobs` read: the list's and the detail's `nodes`, the detail's files."""
    run(capsys, "--server", service, "login", "--username", "alice")
    run(capsys, "submit", "-J", "a", "--command", "true", "--gpus", "1", "-D", "/data/a")
    UserFactory(username="bob")
    scheduling_round_run()
    job = Job.objects.get(name="a")
    from rest_framework.authtoken.models import Token

    api = Api(service, Token.objects.get(user__username="alice").key)
    assert [j["nodes"] for j in api.jobs({"mine": "true"})] == [["gpu01"]]
    detail = api.job(job.pk)
    assert (detail["stdout_file"], detail["stderr_file"], detail["work_dir"]) == (
        f"attune-{job.pk}.out",
        "",
        "/data/a",
    )


@pytest.mark.parametrize("typed", ["null", "", "yes", "True"])
def test_mine_takes_true_or_false_only(service, typed):
    """A filter that took anything else as "not given" would list every user's jobs as one's own."""
    import httpx
    from rest_framework.authtoken.models import Token

    token = Token.objects.create(user=UserFactory(username="carol")).key
    answer = httpx.get(f"{service}/api/v1/jobs/?mine={typed}", headers={"Authorization": f"Token {token}"})
    assert answer.status_code == 400 and answer.json() == {"mine": ["Give true or false."]}
