"""`submit SCRIPT`: the request the command line builds, without a service (httpx's mock transport)."""

from __future__ import annotations

import io
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from cli import main as cli_main
from cli.api import Api
from cli.commands import submit_body
from cli.main import build_parser
from tests.standalone import ROOT, standalone_env

SCRIPT = """#!/bin/bash
#SBATCH --job-name=train --gpus=2
#SBATCH --time=1:00:00
python train.py
"""


@pytest.fixture
def job_sh(tmp_path: Path) -> Path:
    path = tmp_path / "job.sh"
    path.write_text(SCRIPT)
    return path


def body(*argv: str) -> dict:
    return submit_body(build_parser().parse_args(["submit", *argv]))


def test_a_script_alone_sends_the_script_and_no_option_it_was_not_given(job_sh):
    # No defaults: anything sent would override the script's own directives.
    assert body(str(job_sh)) == {"script": SCRIPT, "script_name": "job.sh", "submit_dir": os.getcwd()}


def test_options_given_with_a_script_are_sent_in_the_apis_names_and_units(job_sh):
    sent = body(
        str(job_sh),
        *("-J", "other", "-G", "4", "-N", "2", "-t", "2:00:00", "--iters", "10", "-a", "0-3"),
        *("-d", "afterok:3:4,afterok:5", "-o", "out-%j.log", "-e", "err-%j.log", "-D", "runs/a"),
        *("--mem-per-gpu", "16G", "--cpus-per-gpu", "4", "--team", "vision", "--priority", "0", "-H"),
        *("--max-latency", "6h"),
    )
    assert sent == {
        "script": SCRIPT,
        "script_name": "job.sh",
        "submit_dir": os.getcwd(),
        "name": "other",
        "num_gpus": 4,
        "nodes": 2,
        "time_limit_s": 7200,
        "total_iters": 10,
        "array": "0-3",
        "depends_on": [3, 4, 5],
        "output": "out-%j.log",
        "error": "err-%j.log",
        "chdir": os.path.abspath("runs/a"),  # as sbatch: relative to where it was typed
        "mem_gb_per_gpu": 16.0,
        "cpus_per_gpu": 4.0,
        "team": "vision",
        "priority": 0,
        "hold": True,
        "qos_max_latency_s": 21600.0,
    }


def test_sbatchs_names_and_the_older_ones_mean_the_same(job_sh):
    new = body(
        str(job_sh), "--job-name", "a", "--gpus", "2", "--time", "30m", "--dependency=afterok:7", "--hold"
    )
    old = body(str(job_sh), "-J", "a", "-G", "2", "--time-limit", "30m", "--after", "7", "-H")
    assert new == old and new["depends_on"] == [7] and new["time_limit_s"] == 1800
    assert body(str(job_sh), "--mem-gb-per-gpu", "12.5")["mem_gb_per_gpu"] == 12.5
    assert body(str(job_sh), "--mem-per-gpu", "4096")["mem_gb_per_gpu"] == 4.0  # Slurm's default: MB


def test_a_command_or_workload_keeps_its_older_form_and_iters_is_optional_for_a_command():
    assert body("eval", "--command", "python eval.py", "--gpus", "1") == {
        "name": "eval",
        "command": "python eval.py",
        "submit_dir": os.getcwd(),
        "num_gpus": 1,
    }
    assert body("--command", "true", "-J", "x")["name"] == "x"
    assert body("r18", "--workload", "res18", "--gpus", "2", "--iters", "5") == {
        "name": "r18",
        "workload": "res18",
        "num_gpus": 2,
        "total_iters": 5,
    }


def test_without_a_name_a_workload_is_named_after_itself_and_a_command_after_its_program():
    assert body("--workload", "res18", "--iters", "5")["name"] == "res18"
    assert body("--command", "/usr/bin/python3 -u 'train me.py'")["name"] == "python3"
    assert body("--command", "./run.sh --fast")["name"] == "run.sh"
    assert body("--command", "echo 'unbalanced")["name"] == "echo"


def test_a_script_on_standard_input(monkeypatch):
    monkeypatch.setattr(sys, "stdin", io.StringIO(SCRIPT))
    assert body("-")["script"] == SCRIPT


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        ((), "give a script, or --workload NAME or --command 'CMD'"),
        (("no-such.sh",), "cannot read the script 'no-such.sh'"),
        (("x", "--workload", "w", "--command", "c"), "not both"),
        (("x", "-J", "y", "--command", "c"), "two names"),
        (("--command", "  "), "give the job a name: -J NAME"),
        (("x", "--command", "c", "--mem-per-gpu", "lots"), "not a memory size"),
        (("x", "--command", "c", "-t", "soon"), "not a duration"),
    ],
)
def test_usage_errors_send_nothing_and_exit_2(argv, message, capsys, monkeypatch):
    monkeypatch.setattr(cli_main, "Api", _refusing_api)
    code = cli_main.main(["--server", "http://attune.test", "--token", "t", "submit", *argv])
    assert code == 2 and message in capsys.readouterr().err


@pytest.mark.parametrize("typed", ["afterany:3", "3", "afterok:", "afterok:x"])
def test_dependency_kinds_other_than_afterok_are_refused_by_the_parser(typed, capsys):
    with pytest.raises(SystemExit) as exited:
        build_parser().parse_args(["submit", "job.sh", "--dependency", typed])
    err = capsys.readouterr().err
    assert exited.value.code == 2 and ("only afterok:ID[:ID...] is supported" in err or "not a job id" in err)


def _refusing_api(server: str, token: str | None) -> Api:
    def handler(request: httpx.Request) -> httpx.Response:
        raise AssertionError(f"nothing should be sent: {request.url}")

    return Api(server, token, transport=httpx.MockTransport(handler))


def _fake_service(monkeypatch, answer: httpx.Response) -> list[dict]:
    """Make `main` talk to a handler that records each submission's JSON and gives `answer`."""
    sent: list[dict] = []

    def handler(request: httpx.Request) -> httpx.Response:
        assert (request.method, request.url.path) == ("POST", "/api/v1/jobs/")
        sent.append(json.loads(request.content))
        return answer

    def api(server: str, token: str | None) -> Api:
        return Api(server, token, transport=httpx.MockTransport(handler))

    monkeypatch.setattr(cli_main, "Api", api)
    return sent


def test_submitting_a_script_posts_it_and_prints_the_job(job_sh, capsys, monkeypatch):
    sent = _fake_service(monkeypatch, httpx.Response(201, json={"id": 7, "admission": {}}))
    code = cli_main.main(["--server", "http://attune.test", "--token", "t", "submit", str(job_sh), "-G", "1"])
    assert code == 0 and capsys.readouterr().out == "Submitted job 7\n"
    assert sent == [{"script": SCRIPT, "script_name": "job.sh", "submit_dir": os.getcwd(), "num_gpus": 1}]


def test_a_directive_error_names_the_file_and_line_and_exits_1(job_sh, capsys, monkeypatch):
    refusal = {"script": ["line 4: #SBATCH --gpus=abc: --gpus needs a whole number of GPUs"]}
    _fake_service(monkeypatch, httpx.Response(400, json=refusal))
    code = cli_main.main(["--server", "http://attune.test", "--token", "t", "submit", str(job_sh)])
    err = capsys.readouterr().err
    assert (
        code == 1
        and err == f"error: {job_sh}: line 4: #SBATCH --gpus=abc: --gpus needs a whole number of GPUs\n"
    )

    _fake_service(monkeypatch, httpx.Response(400, json={**refusal, "num_gpus": ["This field is required."]}))
    monkeypatch.setattr(sys, "stdin", io.StringIO(SCRIPT))
    code = cli_main.main(["--server", "http://attune.test", "--token", "t", "submit", "-"])
    assert code == 1 and capsys.readouterr().err == (
        "error: <stdin>: line 4: #SBATCH --gpus=abc: --gpus needs a whole number of GPUs\n"
        "--gpus: This field is required.\n"
    )


def test_submit_help_states_the_checkpoint_contract():
    result = subprocess.run(
        [sys.executable, "-m", "cli", "submit", "--help"],
        cwd=ROOT,
        env=standalone_env(),
        capture_output=True,
        text=True,
    )
    text = " ".join(result.stdout.split())  # the epilog's own line breaks aside
    assert result.returncode == 0
    for words in (
        "SCRIPT",
        "#SBATCH",
        "#ATTUNE",
        "every process of the job gets SIGTERM, then SIGKILL after a grace period (30 s by default)",
        "$ATTUNE_CHECKPOINT_DIR (node-local, private to the job's account)",
        "working directory on a shared filesystem",
        "$ATTUNE_RESUME_ITERS",
        '{"done_iters": N, "iters_per_s": x} to $ATTUNE_PROGRESS_PATH',
        "starts over after each preemption",
        "MASTER_ADDR, MASTER_PORT, NNODES, NODE_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE",
        "SLURM_JOB_ID, SLURM_NNODES, SLURM_NODEID, SLURM_JOB_NODELIST",
        "owner's Unix account in a clean environment",
        "--dependency",
        "--nodes",
        "--chdir",
    ):
        assert words in text, words


def test_show_a_job_without_an_iteration_count(capsys, monkeypatch):
    job = {
        "id": 9,
        "name": "train",
        "owner": "alice",
        "workload": None,
        "command": "",
        "state": "RUNNING",
        "num_gpus": 4,
        "num_nodes": 2,
        "done_iters": 0,
        "total_iters": None,  # an own script without --iters: as long as its time limit
        "submitted_at": "2026-01-01T00:00:00Z",
    }

    def api(server: str, token: str | None) -> Api:
        return Api(
            server, token, transport=httpx.MockTransport(lambda request: httpx.Response(200, json=job))
        )

    monkeypatch.setattr(cli_main, "Api", api)
    assert cli_main.main(["--server", "http://attune.test", "--token", "t", "show", "9"]) == 0
    out = capsys.readouterr().out
    assert re.search(r"^Job +9 train \(script\)$", out, re.M) and re.search(
        r"^GPUs +4 on 2 nodes$", out, re.M
    )
    assert re.search(r"^Progress +0 iterations$", out, re.M)
