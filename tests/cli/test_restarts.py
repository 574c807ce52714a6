"""`cli show` and `cli queue --long` show a job's moves, preemptions and GPU-hours lost to restarts."""

from __future__ import annotations

import re

import pytest
from django.contrib.auth import get_user_model

from scheduler_app.models import Job
from tests.cli.helpers import run
from tests.factories import JobFactory
from tests.scheduler_app.test_restarts_selectors import (
    LOST_WORK_GPU_S,
    STARTUP_GPU_S,
    moved_twice_and_preempted,
)

pytestmark = pytest.mark.django_db(transaction=True)

LOST_GPU_H = f"{(LOST_WORK_GPU_S + STARTUP_GPU_S) / 3600:.2f}"


def test_show_and_queue_long_show_moves_preemptions_and_gpu_hours_lost(service, capsys):
    alice = get_user_model().objects.get(username="alice")
    moved = moved_twice_and_preempted()
    calm = JobFactory(owner=alice, name="calm")
    run(capsys, "--server", service, "login", "--username", "alice")

    code, out, err = run(capsys, "show", str(moved.pk))
    assert code == 0, err
    assert re.search(
        rf"^Restarts +moved 2x, preempted 1x, requeued 0x; {LOST_GPU_H} GPU-hours lost to restarts$",
        out,
        re.M,
    ), out
    code, out, err = run(capsys, "show", str(calm.pk))
    assert re.search(r"^Restarts +none$", out, re.M), out

    code, out, err = run(capsys, "queue", "--long")
    assert code == 0, err
    header, *rows = (line.split() for line in out.splitlines())
    assert header[-3:] == ["MOVES", "PREEMPT", "LOST_GPU_H"]
    by_id = {int(row[0]): row[-3:] for row in rows}
    assert by_id == {moved.pk: ["2", "1", LOST_GPU_H], calm.pk: ["0", "0", "0.00"]}
    # Without --long, the queue is squeue's columns alone.
    code, out, err = run(capsys, "queue")
    assert "MOVES" not in out and "LOST_GPU_H" not in out


def test_acct_lists_the_gpu_hours_lost_to_restarts_per_day(service, capsys, settings):
    settings.TIME_ZONE = "UTC"
    moved = moved_twice_and_preempted()
    Job.objects.filter(pk=moved.pk).update(owner=get_user_model().objects.get(username="alice"))
    run(capsys, "--server", service, "login", "--username", "alice")
    code, out, err = run(capsys, "acct", "--start", "2026-03-01T00:00", "--end", "2026-03-05T00:00")
    assert code == 0, err
    lost = out.split("GPU-hours lost to restarts\n", 1)[1].splitlines()
    day1 = (LOST_WORK_GPU_S + 4 * 50 + 4 * 60) / 3600
    assert [line.split() for line in lost] == [
        ["DAY", "LOST_GPU_H"],
        ["2026-03-02", f"{day1:.2f}"],
        ["2026-03-03", f"{8 * 30 / 3600:.2f}"],
    ]
