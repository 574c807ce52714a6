"""bench.submit_rate's own arithmetic: calls counted inside their window, submissions stored once."""

from __future__ import annotations

import pytest

from bench.submit_rate import Calls, Submitted, rate_row, stored_once
from tests.api.helpers import submit


def test_a_rate_row_counts_only_the_calls_started_inside_the_window() -> None:
    calls = Calls()
    for started, latency_s in ((0.5, 9.0), (1.0, 0.010), (1.5, 0.030), (2.0, 0.020), (3.5, 5.0)):
        calls.add(started, latency_s, 201)
    calls.add(2.5, 0.001, 500)
    label, n, per_s, p50_ms, _p99, max_ms, errors = rate_row("POST", calls, 1.0, 3.0)
    assert (label, n, per_s) == ("POST", 4, "2.0")
    assert p50_ms == "15.0" and max_ms == "30"
    assert errors == 1  # counted over the whole run, not only the window


@pytest.mark.django_db
def test_every_201_must_be_one_stored_job_and_nothing_else(user) -> None:
    jobs = [submit(user, name=f"rate-0-{n}") for n in range(3)]
    submit(user, name="fill-0")  # the queue's filling is not the bench's submissions
    seen = Submitted()
    seen.ids_seen = [job.pk for job in jobs]
    assert stored_once(seen, accepted=3) == (True, 3)
    assert stored_once(seen, accepted=4) == (False, 3)  # a 201 without its job
    seen.ids_seen = [jobs[0].pk, jobs[0].pk, jobs[1].pk]
    assert stored_once(seen, accepted=3)[0] is False  # one job answered twice, one never


@pytest.mark.django_db
def test_the_workers_answers_are_told_apart_by_what_they_say(user) -> None:
    from django.utils import timezone

    from bench.submit_rate import _worker_answers
    from scheduler_app.models import AdmissionPrediction

    now = timezone.now()
    said = [
        (now, now, ""),
        (now, None, "not finished within 2 s of forecasting"),
        (None, None, "not started within 2 s of forecasting"),
        (None, None, "not started within 2 s of forecasting"),
        (None, None, "queued behind the 1000 jobs the forecast plays forward (the last of them ...)"),
    ]
    jobs = [submit(user, name=f"rate-0-{n}") for n in range(len(said))]
    for job, (start, finish, detail) in zip(jobs, said, strict=True):
        AdmissionPrediction.objects.create(
            job=job, created_at=now, policy="swaf", allocator="genie",
            predicted_start_at=start, predicted_finish_at=finish, detail=detail,
        )  # fmt: skip
    kinds = _worker_answers([job.pk for job in jobs[1:]])
    assert kinds == {
        "with a predicted start, no finish": 1,
        "cut short by the budget": 2,
        "queued behind the 1000 jobs the forecast plays forward": 1,
    }
    assert _worker_answers([jobs[0].pk]) == {"with a predicted start": 1}
