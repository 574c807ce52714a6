"""`nodes`, `workloads` and `acct` against a live service; acct's formatting also against a stub."""

from __future__ import annotations

import io
import json
import re
from datetime import datetime, timedelta

import httpx
import pytest
from django.db import transaction

from cli import cluster_commands
from cli.api import Api
from cli.main import build_parser
from cluster_app.models import NodeState, Server
from scheduler_app.models import Job, JobState
from scheduler_app.services.job_control import job_finish
from scheduler_app.services.rounds import scheduling_round_run
from tests.api.helpers import make_server
from tests.cli.helpers import run, usage_error
from tests.factories import TeamFactory, UserFactory, WorkloadFactory

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("fifo_proportional_minute_rounds"),
]


def words(out: str) -> list[str]:
    """Each printed line with its runs of spaces as one: what a table row says, not how it aligns."""
    return [" ".join(line.split()) for line in out.splitlines()]


def test_nodes_shows_each_servers_free_and_total_resources_and_why_it_is_out(service, capsys):
    make_server("gpu02", gpus=8, cpus=24, mem_gb=500, state=NodeState.DRAINED)
    Server.objects.filter(name="gpu02").update(state_reason="failing disk")
    run(capsys, "--server", service, "login", "--username", "alice")
    run(capsys, "submit", "half", "--workload", "res18", "--gpus", "2", "--iters", "10")
    scheduling_round_run()
    state = Server.objects.get(name="gpu01").state

    code, out, _ = run(capsys, "nodes")
    assert code == 0 and words(out) == [
        "NODE STATE GPUS(F/T) CPUS(F/T) MEM_GB(F/T) GPU_MODEL REASON",
        f"gpu01 {state} 2/4 6/12 125/250 Tesla V100",
        "gpu02 DRAINED 8/8 24/24 500/500 Tesla V100 failing disk",
        "(2 nodes) 10/12 30/36 625/750 4 GPUs schedulable",
    ]
    code, out, _ = run(capsys, "nodes", "-t", "drained,down")
    assert words(out)[1:] == ["gpu02 DRAINED 8/8 24/24 500/500 Tesla V100 failing disk"]
    code, out, _ = run(capsys, "nodes", "--json")
    assert [s["name"] for s in json.loads(out)["servers"]] == ["gpu01", "gpu02"]
    err = usage_error(capsys, "nodes", "--state", "broken")
    assert "unknown state 'BROKEN': choose one of IDLE, MIXED, ALLOCATED, DRAINING, DRAINED, DOWN" in err


def test_workloads_lists_the_catalog_with_what_each_profile_says(service, capsys):
    WorkloadFactory(name="bert", workload_class="language", description="BERT-base fine-tuning on SQuAD")
    WorkloadFactory(name="mine", tput_matrix=[], description="Not measured\nyet")
    run(capsys, "--server", service, "login", "--username", "alice")
    code, out, _ = run(capsys, "workloads")
    header, *rows = words(out)
    assert code == 0 and header == "NAME CLASS S/ITER BEST_CPUS/GPU BEST_MEM_GB/GPU SPEEDUP DESCRIPTION"
    iter_s = f"{WorkloadFactory(name='res18').iter_time_s:.3g}"
    assert rows == [
        f"bert language {iter_s} 9 62.5 2.40x BERT-base fine-tuning on SQuAD",
        "mine image - - - not profiled yet Not measured yet",
        f"res18 image {iter_s} 9 62.5 2.40x",
    ]
    code, out, _ = run(capsys, "workloads", "--json")
    catalog = {w["name"]: w for w in json.loads(out)}
    assert catalog["mine"]["profile"] is None and catalog["res18"]["profile"]["speedup"] == 2.4


def _finished_job(name: str, state: str, *, exit_code: int = 0) -> Job:
    """Place the job (a round), then end it as its agent would."""
    scheduling_round_run()
    with transaction.atomic():
        job = Job.objects.select_for_update().get(name=name)
        return job_finish(job=job, state=state, exit_code=exit_code)


def test_acct_reports_usage_by_user_and_team_from_the_live_endpoint(service, capsys):
    TeamFactory(name="vision").members.add(UserFactory(username="alice"))
    run(capsys, "--server", service, "login", "--username", "alice")
    run(capsys, "submit", "a", "--workload", "res18", "--gpus", "2", "--iters", "10", "--team", "vision")
    _finished_job("a", JobState.COMPLETED)
    run(capsys, "submit", "b", "--command", "false", "--gpus", "1", "-t", "10")
    _finished_job("b", JobState.FAILED, exit_code=1)

    code, out, err = run(capsys, "acct", "--window", "24h")
    assert code == 0, err
    title, header, *rows = words(out)
    assert title.startswith("Usage by user from ")
    assert header == "NAME GPU_H CPU_CORE_H MEM_GB_H JOBS COMPLETED FAILED WAIT_MEAN WAIT_P95"
    (row,) = rows
    assert row.split()[0] == "alice" and row.split()[4:7] == ["2", "1", "1"]

    code, out, _ = run(capsys, "acct", "--window", "24h", "--by", "team")
    teams = {line.split()[0]: line.split() for line in words(out)[2:]}
    assert teams["vision"][4:6] == ["1", "1"] and "(no" in teams

    start = (datetime.now() - timedelta(hours=2)).strftime("%Y-%m-%dT%H:%M")
    code, out, _ = run(capsys, "acct", "--start", start, "--csv")
    lines = out.splitlines()
    assert code == 0 and lines[0].startswith("name,gpu_hours,cpu_core_hours,mem_gb_hours,COMPLETED,")
    assert lines[1].startswith("alice,")

    code, out, _ = run(capsys, "acct", "--json")
    assert json.loads(out)["rows"][0]["jobs_total"] == 2


def test_acct_refuses_a_window_and_dates_together_before_sending(capsys):
    given = ("--server", "http://127.0.0.1:9", "--token", "t")  # nothing listens: a request would fail
    code, _, err = run(capsys, *given, "acct", "--window", "7d", "--start", "2026-01-01")
    assert (code, err) == (2, "error: give either --window or --start/--end, not both\n")
    code, _, err = run(capsys, *given, "acct", "--end", "2026-01-01")
    assert (code, err) == (2, "error: give --start with --end\n")
    code, _, err = run(capsys, *given, "acct", "--start", "soon")
    assert code == 2 and "not a date and time" in err
    err = usage_error(capsys, "acct", "--window", "2d")
    # argparse quotes the choices in some Python versions, not in others.
    assert "invalid choice: '2d' (choose from " in err and "24h" in err and "365d" in err


REPORT = {
    "start": "2026-05-01T00:00:00Z",
    "end": "2026-05-31T00:00:00Z",
    "by": "team",
    "rows": [
        {
            "name": "vision",
            "gpu_hours": 1234.56,
            "cpu_core_hours": 9876.5,
            "mem_gb_hours": 100000.04,
            "jobs": {"COMPLETED": 40, "FAILED": 2, "CANCELLED": 0, "TIMEOUT": 1, "OUT_OF_MEMORY": 0},
            "jobs_total": 43,
            "mean_wait_s": 3725.0,
            "p95_wait_s": 200000.0,
        },
        {
            "name": "(no team)",
            "gpu_hours": 0.04,
            "cpu_core_hours": 0.2,
            "mem_gb_hours": 1.0,
            "jobs": {"COMPLETED": 0, "FAILED": 0, "CANCELLED": 0, "TIMEOUT": 0, "OUT_OF_MEMORY": 0},
            "jobs_total": 0,
            "mean_wait_s": 42.4,
            "p95_wait_s": None,
        },
    ],
}


def test_acct_formats_the_report_contract_and_sends_its_query(monkeypatch):
    """Without a service: the query sent for each option, and the table printed from the contract's body."""
    sent: list[httpx.QueryParams] = []

    def answer(request: httpx.Request) -> httpx.Response:
        sent.append(request.url.params)
        return httpx.Response(200, json=REPORT)

    api = Api("http://attune.test", "t", transport=httpx.MockTransport(answer))
    out = io.StringIO()
    args = build_parser().parse_args(["acct", "--by", "team", "--start", "2026-05-01T00:00+00:00"])
    assert cluster_commands.acct(api, args, out) == 0
    assert dict(sent[0]) == {"by": "team", "start": "2026-05-01T00:00:00+00:00"}
    title, *table = words(out.getvalue())
    assert title.startswith("Usage by team from 2026-05-")
    # Only the end states some row has; hours to a tenth; waits as squeue users read them.
    assert table == [
        "NAME GPU_H CPU_CORE_H MEM_GB_H JOBS COMPLETED FAILED TIMEOUT WAIT_MEAN WAIT_P95",
        "vision 1234.6 9876.5 100000.0 43 40 2 1 1h02m 2d07h",
        "(no team) 0.0 0.2 1.0 0 0 0 0 42s -",
    ]
    # A bare local time is sent with its offset (the service would read it as UTC).
    args = build_parser().parse_args(["acct", "--start", "2026-05-01", "--end", "2026-05-02T12:00"])
    cluster_commands.acct(api, args, io.StringIO())
    assert sent[1]["by"] == "user"
    assert re.fullmatch(r"2026-05-01T00:00:00[+-]\d\d:\d\d", sent[1]["start"])
    assert re.fullmatch(r"2026-05-02T12:00:00[+-]\d\d:\d\d", sent[1]["end"])
