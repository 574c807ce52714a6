"""The reference trace format: reader errors name the file and line; the writer round-trips."""

from __future__ import annotations

from pathlib import Path

import pytest

from scheduler_app.simulator import TraceError, TraceJob, philly_derived_trace, read_trace, write_trace
from scheduler_app.simulator.trace import format_trace_line
from tests.reference_data import SYNERGY_TRACES

GOOD = "0,alexnet,0.0,3349,1\n1,gnmt,126,26435,2\n"


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "trace.csv"
    path.write_text(text)
    return path


def test_reads_good_rows(tmp_path: Path) -> None:
    jobs = read_trace(write(tmp_path, GOOD + "\n# a comment\n"))
    assert jobs == [TraceJob(0, "alexnet", 0.0, 3349, 1), TraceJob(1, "gnmt", 126.0, 26435, 2)]


@pytest.mark.parametrize(
    ("row", "message"),
    [
        ("2,nosuchmodel,5,10,1", "unknown model 'nosuchmodel'; valid: alexnet"),
        ("2,alexnet,soon,10,1", "arrival_s 'soon' is not a number"),
        ("2,alexnet,5,many,1", "total_iters 'many' is not a number"),
        ("2,alexnet,5,10,x", "gpus 'x' is not a number"),
        ("two,alexnet,5,10,1", "job_id 'two' is not an integer"),
        ("2,alexnet,5,10", "expected 5 columns"),
        ("2,alexnet,5,10,1,7,8", "expected 5 columns"),
        ("2,alexnet,5,10,1,soon", "deadline_s 'soon' is not a number"),
        ("2,alexnet,5,10,1,4", "deadline_s must be finite and >= arrival_s"),
        ("2,alexnet,5,0,1", "total_iters must be positive"),
        ("2,alexnet,5,10,0", "gpus must be positive"),
        ("2,alexnet,5,10,-2", "gpus must be positive"),
        ("2,alexnet,5,10.5,1", "total_iters '10.5' is not a whole number"),
        ("2,alexnet,-5,10,1", "arrival_s must be a finite number >= 0"),
        ("2,alexnet,nan,10,1", "arrival_s must be a finite number >= 0"),
        ("1,alexnet,5,10,1", "duplicate job_id 1 (first on line 2)"),
        ("2,,5,10,1", "empty model name"),
    ],
)
def test_bad_row_names_file_and_line(tmp_path: Path, row: str, message: str) -> None:
    path = write(tmp_path, GOOD + row + "\n")
    with pytest.raises(TraceError) as excinfo:
        read_trace(path)
    assert str(excinfo.value).startswith(f"{path}:3: ")
    assert message in str(excinfo.value)


def test_trace_error_is_a_value_error() -> None:
    assert issubclass(TraceError, ValueError)


def test_missing_and_empty_files(tmp_path: Path) -> None:
    with pytest.raises(TraceError, match="cannot read trace"):
        read_trace(tmp_path / "absent.csv")
    with pytest.raises(TraceError, match="no jobs"):
        read_trace(write(tmp_path, "\n\n"))


def test_round_trip_of_generated_traces(tmp_path: Path) -> None:
    for kwargs in ({}, {"multi_gpu": True, "jobs_per_hour": 3.0}, {"static": True}):
        jobs = philly_derived_trace(300, seed=7, **kwargs)
        path = tmp_path / "gen.csv"
        write_trace(path, jobs)
        assert read_trace(path) == jobs


def test_round_trip_keeps_fractional_arrivals_exact(tmp_path: Path) -> None:
    jobs = [
        TraceJob(0, "res18", 0.1 + 0.2, 5, 1),
        TraceJob(1, "lstm", 1e-3, 7, 8),
        TraceJob(2, "m5", 12.0, 9, 2),
    ]
    path = tmp_path / "frac.csv"
    write_trace(path, jobs)
    assert read_trace(path) == jobs
    assert format_trace_line(jobs[2]) == "2,m5,12,9,2"


def test_reference_trace_round_trips_byte_for_byte(tmp_path: Path) -> None:
    source = SYNERGY_TRACES / "philly1gpu_l9_n1000_s42.csv"
    jobs = read_trace(source)
    assert len(jobs) == 1000
    out = tmp_path / "copy.csv"
    write_trace(out, jobs)
    assert out.read_text() == source.read_text()
