"""`cli show` and `cli queue` say as of when the estimates they print hold (the service's
`estimate_as_of`), as `scontrol show job` gives LastSchedEval."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

import pytest
from django.contrib.auth import get_user_model
from django.utils import timezone

from cli.output import ago, as_of, estimates_as_of_line
from scheduler_app.services.forecasts import job_forecasts_refresh
from scheduler_app.services.rounds import scheduling_round_run
from tests.api.helpers import submit
from tests.cli.helpers import run

NOW = datetime(2026, 11, 30, 12, 30, tzinfo=UTC)


def local(at: datetime) -> str:
    return at.astimezone().strftime("%Y-%m-%d %H:%M")


@pytest.mark.django_db(transaction=True)
def test_show_and_queue_print_as_of_when_the_estimates_hold(service, capsys):
    alice = get_user_model().objects.get(username="alice")
    running = submit(alice, gpus=4, name="big")
    waiting = submit(alice, gpus=4, name="after")
    at = timezone.now().replace(microsecond=0) - timedelta(minutes=7, seconds=5)
    # The refresh ran 7 minutes ago (the embedded demo's inline one, or a worker's cycle that started then).
    scheduling_round_run()
    job_forecasts_refresh(now=at)
    run(capsys, "--server", service, "login", "--username", "alice")

    code, out, err = run(capsys, "show", str(waiting.pk))
    assert code == 0, err
    assert re.search(rf"^Estimate as of +{local(at)} \(7 min ago\)$", out, re.M), out
    code, out, err = run(capsys, "show", str(running.pk))
    assert re.search(r"^Estimated finish +\d{4}-", out, re.M), out
    assert re.search(rf"^Estimate as of +{local(at)} \(7 min ago\)$", out, re.M), out

    code, out, err = run(capsys, "queue")
    assert code == 0 and re.search(rf"^{waiting.pk} +after ", out, re.M), out
    # On stderr: the terminal shows it, a script reading the table does not get it.
    assert "as of" not in out and err == f"Estimates as of {local(at)} (7 min ago) or newer\n", err


def test_as_of_words():
    assert ago("2026-11-30T12:29:30Z", now=NOW) == "just now"
    assert ago("2026-11-30T12:05:00Z", now=NOW) == "25 min ago"
    assert ago("2026-11-30T10:25:00Z", now=NOW) == "2 h 05 min ago"
    assert ago("2026-11-28T08:00:00Z", now=NOW) == "2 d 4 h ago"
    assert as_of(None) == "-"
    assert as_of("2026-11-30T12:05:00Z", now=NOW) == f"{local(NOW - timedelta(minutes=25))} (25 min ago)"


def test_queue_says_the_oldest_as_of_or_nothing():
    jobs = [
        {"estimate_as_of": "2026-11-30T12:20:00Z"},
        {"estimate_as_of": "2026-11-30T12:05:00Z"},  # the oldest shown
        {"estimate_as_of": None},  # ended, or no estimate yet
        {},  # a service that does not say
    ]
    oldest = local(NOW - timedelta(minutes=25))
    assert estimates_as_of_line(jobs, now=NOW) == f"Estimates as of {oldest} (25 min ago) or newer\n"
    assert estimates_as_of_line([{}, {"estimate_as_of": None}], now=NOW) == ""
