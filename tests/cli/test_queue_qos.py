"""The queue's QOS column (cli.commands.qos_cell): a deadline marked when the estimate ends after it."""

from __future__ import annotations

from cli.commands import qos_cell
from cli.output import when

DEADLINE = "2026-11-26T12:00:00Z"


def job(**fields):
    return {"state": "PENDING", "deadline_at": None, "qos_min_rate_iters_per_s": None, **fields}


def test_a_deadline_is_shown_and_marked_when_the_estimate_misses_it():
    on_time = job(deadline_at=DEADLINE, estimated_finish_at="2026-11-26T11:00:00Z")
    late = job(deadline_at=DEADLINE, estimated_finish_at="2026-11-26T12:00:01Z")
    unknown = job(deadline_at=DEADLINE, estimated_finish_at=None)
    assert qos_cell(on_time) == qos_cell(unknown) == when(DEADLINE)
    assert qos_cell(late) == when(DEADLINE) + "!"


def test_a_finished_job_is_judged_by_when_it_finished():
    done = job(state="COMPLETED", deadline_at=DEADLINE, finished_at="2026-11-26T13:00:00+00:00")
    assert qos_cell(done) == when(DEADLINE) + "!"
    assert qos_cell({**done, "finished_at": "2026-11-26T11:59:00+00:00"}) == when(DEADLINE)


def test_a_minimum_rate_and_no_target():
    assert qos_cell(job(qos_min_rate_iters_per_s=2.5)) == ">=2.5 it/s"
    assert qos_cell(job()) == ""
