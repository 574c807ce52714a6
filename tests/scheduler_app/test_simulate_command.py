"""`manage.py simulate`: options, outputs, stored runs and the error messages for bad input."""

import json
from io import StringIO
from pathlib import Path

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from scheduler_app.models import SimulationRun, SimulationStatus

SMALL = ["--servers", "2", "--jobs", "30", "--load", "20", "--seed", "3", "--quiet"]
RUN_KEYS = {
    "policy",
    "allocator",
    "jobs",
    "avg_jct_h",
    "median_jct_h",
    "p99_jct_h",
    "makespan_h",
    "gpu_alloc_pct",
    "cpu_alloc_pct",
    "mem_alloc_pct",
    "wall_s",
    "speedup_vs_proportional",
}


def run(*args: str) -> str:
    out = StringIO()
    call_command("simulate", *args, stdout=out, stderr=StringIO())
    return out.getvalue()


def test_json_has_one_run_per_combination_with_every_key(tmp_path: Path):
    out_file = tmp_path / "out.json"
    text = run(*SMALL, "--policy", "fifo,srtf", "--allocator", "proportional,tune", "--json", str(out_file))
    runs = json.loads(out_file.read_text())["runs"]
    assert [(r["policy"], r["allocator"]) for r in runs] == [
        ("fifo", "proportional"),
        ("fifo", "tune"),
        ("srtf", "proportional"),
        ("srtf", "tune"),
    ]
    for r in runs:
        assert set(r) >= RUN_KEYS, RUN_KEYS - set(r)
        assert r["jobs"] == 30
    assert runs[0]["speedup_vs_proportional"] == pytest.approx(1.0)
    assert runs[1]["speedup_vs_proportional"] == pytest.approx(runs[0]["avg_jct_h"] / runs[1]["avg_jct_h"])
    # the printed table has a header and one row per combination
    rows = [line for line in text.splitlines() if line.startswith(("fifo", "srtf"))]
    assert len(rows) == 4


def test_a_saved_trace_replays_to_the_same_result(tmp_path: Path):
    trace, first, second = tmp_path / "t.csv", tmp_path / "a.json", tmp_path / "b.json"
    run(*SMALL, "--allocator", "tune", "--save-trace", str(trace), "--json", str(first))
    run("--servers", "2", "--quiet", "--allocator", "tune", "--trace", str(trace), "--json", str(second))
    a, b = (json.loads(p.read_text())["runs"][0] for p in (first, second))
    assert len(trace.read_text().splitlines()) == 30
    assert (a["avg_jct_h"], a["makespan_h"]) == (b["avg_jct_h"], b["makespan_h"])


@pytest.mark.django_db
def test_store_records_a_simulation_run():
    run(*SMALL, "--allocator", "proportional,greedy", "--store")
    stored = SimulationRun.objects.get()
    assert stored.status == SimulationStatus.SUCCEEDED
    assert stored.progress == 1.0
    assert [r["allocator"] for r in stored.results["runs"]] == ["proportional", "greedy"]
    assert stored.parameters["num_jobs"] == 30


@pytest.mark.parametrize(
    "args,message",
    [
        (["--allocator", "tune,magic"], "unknown allocator 'magic'; valid: "),
        (["--policy", "lifo"], "unknown policy 'lifo'; valid: "),
        (["--servers", "0"], "servers must be positive"),
        (["--round-s", "-5"], "round length must be positive"),
        (["--split", "20,80"], "--split takes three percentages"),
        (["--split", "a,b,c"], "--split takes three whole percentages"),
        (["--jobs", "0"], "number of jobs must be at least 1"),
        (["--measure", "5:2"], "LAST must exceed FIRST"),
        (["--trace", "/nonexistent/trace.csv"], "trace file not found"),
        (["--trace", "x.csv", "--jobs", "10"], "--trace replays a file; --jobs"),
    ],
)
def test_bad_options_get_a_clear_message(args, message):
    with pytest.raises(CommandError) as excinfo:
        run("--quiet", *args)
    assert message in str(excinfo.value)


def test_unknown_allocator_message_lists_every_valid_one():
    with pytest.raises(CommandError) as excinfo:
        run("--quiet", "--allocator", "magic")
    for name in ("proportional", "greedy", "tune"):
        assert name in str(excinfo.value)


def test_a_bad_trace_row_names_the_file_and_line(tmp_path: Path):
    trace = tmp_path / "bad.csv"
    trace.write_text("0,res18,0,100,1\n1,res18,10,not-a-number,1\n")
    with pytest.raises(CommandError) as excinfo:
        run("--quiet", "--trace", str(trace))
    assert str(trace) in str(excinfo.value) and ":2" in str(excinfo.value)


def test_help_explains_every_option():
    from scheduler_app.management.commands.simulate import Command

    parser = Command().create_parser("manage.py", "simulate")
    ours = [a for a in parser._actions if a.dest in OUR_OPTIONS]
    assert {a.dest for a in ours} == OUR_OPTIONS
    for action in ours:
        assert action.help and len(action.help) > 15, action.dest
    text = parser.format_help()
    for flag in (
        "--servers",
        "--gpus",
        "--cpus",
        "--mem-gb",
        "--trace",
        "--jobs",
        "--load",
        "--split",
        "--multi-gpu",
        "--seed",
        "--policy",
        "--allocator",
        "--round-s",
        "--finish-at-round-end",
        "--json",
        "--store",
    ):
        assert flag in text


OUR_OPTIONS = {
    "servers",
    "gpus",
    "cpus",
    "mem_gb",
    "trace",
    "jobs",
    "load",
    "split",
    "multi_gpu",
    "static",
    "seed",
    "min_rate_share",
    "save_trace",
    "policy",
    "allocator",
    "round_s",
    "finish_at_round_end",
    "restart_overhead_s",
    "measure",
    "json",
    "store",
    "quiet",
}


def test_genie_workload_reports_qos_keys(tmp_path: Path):
    out_file = tmp_path / "genie.json"
    text = run(
        "--servers",
        "2",
        "--workload",
        "genie",
        "--jobs",
        "25",
        "--load",
        "6",
        "--seed",
        "2",
        "--quiet",
        "--policy",
        "swaf,fifo",
        "--allocator",
        "proportional,tune",
        "--json",
        str(out_file),
    )
    runs = json.loads(out_file.read_text())["runs"]
    assert len(runs) == 4
    for r in runs:
        assert r["qos_jobs"] == 25  # every GENIE job carries a deadline
        assert 0.0 <= r["qos_pct"] <= 100.0
        assert r["tardiness_h"] is not None and r["tardiness_h"] >= 0.0
    assert "QoS met %" in text


def test_philly_workload_has_no_qos_jobs(tmp_path: Path):
    out_file = tmp_path / "philly.json"
    run(*SMALL, "--allocator", "tune", "--json", str(out_file))
    assert json.loads(out_file.read_text())["runs"][0]["qos_jobs"] == 0


def test_unknown_workload_is_refused():
    with pytest.raises(CommandError, match="invalid choice: 'magic'"):
        run("--quiet", "--workload", "magic")


def test_event_mode_and_the_genie_allocator_from_the_command_line(tmp_path: Path):
    out_file = tmp_path / "out.json"
    run(
        "--servers",
        "2",
        "--workload",
        "genie",
        "--jobs",
        "30",
        "--load",
        "4",
        "--quiet",
        "--policy",
        "swaf",
        "--allocator",
        "tune,genie",
        "--mode",
        "events",
        "--json",
        str(out_file),
    )
    runs = json.loads(out_file.read_text())["runs"]
    assert [r["allocator"] for r in runs] == ["tune", "genie"]
    assert all(r["qos_jobs"] == 30 and 0 <= r["qos_pct"] <= 100 for r in runs)


def test_event_mode_refuses_round_end_finishing():
    with pytest.raises(CommandError, match="rounds mode only"):
        run(*SMALL, "--mode", "events", "--finish-at-round-end")


def test_genie_min_rate_share_reports_the_rate_kind_apart(tmp_path: Path):
    out_file = tmp_path / "rate.json"
    args = ["--servers", "2", "--workload", "genie", "--jobs", "40", "--load", "6", "--seed", "2", "--quiet"]
    text = run(
        *args, "--min-rate-share", "0.5", "--policy", "swaf", "--allocator", "genie", "--json", str(out_file)
    )
    (r,) = json.loads(out_file.read_text())["runs"]
    assert r["min_rate_jobs"] > 0 and r["qos_jobs"] > 0
    assert r["min_rate_jobs"] + r["qos_jobs"] == 40  # every GENIE job has one target of one kind
    assert 0.0 <= r["min_rate_pct"] <= 100.0
    assert "rate met %" in text
    plain = tmp_path / "plain.json"
    run(*args, "--policy", "swaf", "--allocator", "genie", "--json", str(plain))
    (p,) = json.loads(plain.read_text())["runs"]
    assert (p["min_rate_jobs"], p["min_rate_pct"], p["qos_jobs"]) == (0, None, 40)


def test_min_rate_share_is_checked():
    with pytest.raises(CommandError, match="min-rate share must be in"):
        run(*SMALL, "--workload", "genie", "--min-rate-share", "2")
    with pytest.raises(CommandError, match="genie workload only"):
        run(*SMALL, "--min-rate-share", "0.5")
