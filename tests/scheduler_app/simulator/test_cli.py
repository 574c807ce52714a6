"""`python -m scheduler_app.simulator`: manage.py simulate's table, without Django, scipy or numpy."""

from __future__ import annotations

import io
import json
import subprocess
import sys
import textwrap
from pathlib import Path

from scheduler_app.simulator.cli import progress_printer, table_lines

REPO_ROOT = Path(__file__).resolve().parents[3]
TRACE = REPO_ROOT / "tests/data/synergy/static_100job.csv"


def test_entry_point_runs_without_django_scipy_or_numpy(tmp_path: Path) -> None:
    out_json = tmp_path / "runs.json"
    script = textwrap.dedent(
        f"""
        import runpy, sys
        sys.argv = ["x", "--trace", {str(TRACE)!r}, "--servers", "4", "--quiet", "--json", {str(out_json)!r}]
        try:
            runpy.run_module("scheduler_app.simulator", run_name="__main__")
        except SystemExit as exc:
            assert exc.code == 0, exc.code
        heavy = sorted(m for m in sys.modules if m.split(".")[0] in ("django", "scipy", "numpy"))
        assert not heavy, heavy
        """
    )
    out = subprocess.run([sys.executable, "-c", script], cwd=REPO_ROOT, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0].split()[:4] == ["policy", "allocator", "jobs", "avg"]
    assert [line.split()[1] for line in lines[1:3]] == ["proportional", "tune"]
    runs = json.loads(out_json.read_text())["runs"]
    assert [r["jobs"] for r in runs] == [100, 100]
    assert runs[0]["speedup_vs_proportional"] == 1.0


def test_bad_option_exits_2_with_the_reason() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "scheduler_app.simulator", "--allocator", "nope", "--jobs", "5"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
    )
    assert out.returncode == 2
    assert "unknown allocator 'nope'" in out.stderr


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_in_a_log_is_one_line_per_report_even_with_runs_in_parallel() -> None:
    log = io.StringIO()
    report = progress_printer(log)
    for fraction in (0.0, 0.05, 0.1, 0.5, 1.0):
        report("fifo", "tune", fraction)
        report("srtf", "tune", fraction / 2)
    lines = log.getvalue().splitlines()
    assert "\r" not in log.getvalue()
    assert lines[:3] == [
        "fifo/tune:   0% of jobs finished",
        "srtf/tune:   0% of jobs finished",
        "fifo/tune:  10% of jobs finished",
    ]
    assert lines[-2:] == ["fifo/tune: 100% of jobs finished", "srtf/tune:  50% of jobs finished"]
    assert len(lines) == 7  # each run's tenths, once each: fifo 0, 10, 50, 100; srtf 0, 20 (.25), 50


def test_progress_on_a_terminal_shows_every_run_going_on_one_line() -> None:
    term = _Terminal()
    report = progress_printer(term)
    report("fifo", "tune", 0.3)
    report("srtf", "tune", 0.5)
    assert term.getvalue().split("\r")[-1] == "\x1b[Kfifo/tune 30%, srtf/tune 50% of jobs finished"
    report("fifo", "tune", 1.0)
    shown = term.getvalue()
    assert "\x1b[Kfifo/tune: 100% of jobs finished\n" in shown
    assert shown.split("\r")[-1] == "\x1b[Ksrtf/tune 50% of jobs finished"


def test_table_leaves_a_dash_in_each_column_without_a_figure() -> None:
    run = {
        "policy": "fifo",
        "allocator": "tune",
        "jobs": 10,
        "avg_jct_h": None,
        "p99_jct_h": 2.5,
        "makespan_h": 3.0,
        "gpu_alloc_pct": 50.0,
        "speedup_vs_proportional": None,  # no proportional run in the grid
        "wall_s": 0.5,
    }
    header, row = table_lines([run])
    assert "-x" not in row
    assert len(row) == len(header)
    assert row.split() == ["fifo", "tune", "10", "-", "2.50", "3.00", "50.0", "-", "0.50"]
    with_baseline = table_lines([{**run, "avg_jct_h": 1.0, "speedup_vs_proportional": 1.25}])[1]
    assert len(with_baseline) == len(header) and " 1.25x " in with_baseline
