"""The users' view in chromium: one forecast everywhere, pages that update in place, the shared queue."""

from __future__ import annotations

import re
import time

from scheduler_app.models import Job, JobForecast, JobState
from scheduler_app.services.jobs import JobRequest, job_submit
from scheduler_app.services.rounds import scheduling_round_run
from tests.api.helpers import lease_of, workload
from tests.browser.conftest import login
from tests.cli.helpers import run
from tests.factories import UserFactory


def submit(owner, name: str, *, gpus: int = 4, iters: int = 2000, command: str = "") -> Job:
    request = JobRequest(
        name=name,
        num_gpus=gpus,
        total_iters=iters,
        workload=None if command else workload("res18"),
        command=command,
        time_limit_s=3600 if command else None,
    )
    return job_submit(owner=owner, request=request, admission=False)[0]  # the test runs its rounds


def test_the_estimate_reads_the_same_on_the_queue_the_job_page_and_cli_show(
    browser_page, live_server, user, cluster, capsys, monkeypatch, tmp_path
):
    submit(user, "first")
    waiting = submit(user, "second")
    scheduling_round_run()  # the first runs; the refresh after it stores every job's forecast
    forecast = JobForecast.objects.get(job=waiting)
    assert forecast.start_at is not None and forecast.finish_at is not None

    page = login(browser_page, live_server, user)
    row = page.locator(f"#job-{waiting.pk}")
    queue_start = row.locator("td.est-start").inner_text().strip()
    queue_finish = row.locator("td.est-finish").inner_text().strip()
    page.goto(f"{live_server.url}/jobs/{waiting.pk}/")
    page_start = page.locator("#estimated-start").inner_text().strip()
    page_finish = page.locator("#estimated-finish").inner_text().strip()

    monkeypatch.setenv("TZ", "UTC")  # the pages show UTC (TIME_ZONE); the CLI the local time
    time.tzset()
    monkeypatch.setenv("ATTUNE_PASSWORD", "pw-for-tests")
    monkeypatch.setenv("ATTUNE_TOKEN_FILE", str(tmp_path / "token"))
    code, out, _ = run(capsys, "--server", live_server.url, "login", "--username", user.username)
    assert code == 0, out
    code, out, _ = run(capsys, "show", str(waiting.pk))
    assert code == 0, out
    cli_start = re.search(r"^Estimated start\s+(.+)$", out, re.M).group(1).strip()
    cli_finish = re.search(r"^Estimated finish\s+(.+)$", out, re.M).group(1).strip()

    minute = re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d")
    starts = [minute.search(s).group(0) for s in (queue_start, page_start, cli_start)]
    finishes = [minute.search(s).group(0) for s in (queue_finish, page_finish, cli_finish)]
    assert starts == [forecast.start_at.strftime("%Y-%m-%d %H:%M")] * 3
    assert finishes == [forecast.finish_at.strftime("%Y-%m-%d %H:%M")] * 3
    assert browser_page.console_errors == []


def test_the_job_page_updates_state_and_progress_without_a_reload(browser_page, live_server, user, cluster):
    job = submit(user, "watched")
    page = login(browser_page, live_server, user)
    page.goto(f"{live_server.url}/jobs/{job.pk}/")
    page.evaluate("window.__not_reloaded = true")
    assert page.locator("#job-state").inner_text() == "PENDING"
    scheduling_round_run()
    Job.objects.filter(pk=job.pk).update(done_iters=500)
    # Functions, not expressions: playwright evaluates an expression's text with eval, which the page's
    # Content-Security-Policy forbids (no 'unsafe-eval').
    page.wait_for_function(
        "() => document.querySelector('#job-state').textContent === 'RUNNING'", timeout=15_000
    )
    page.wait_for_function(
        "() => document.querySelector('#job-cards').textContent.includes('25.0%')", timeout=15_000
    )
    assert page.evaluate("window.__not_reloaded") is True  # updated in place, not reloaded
    assert lease_of(job) is not None
    assert browser_page.console_errors == []


def test_an_ordinary_user_sees_another_users_job_but_not_its_command_or_log(
    browser_page, live_server, user, cluster
):
    other = UserFactory(username="bob")
    theirs = submit(other, "bobs-run", gpus=1, command="python secret_experiment.py --token=hunter2")
    scheduling_round_run()
    Job.objects.filter(pk=theirs.pk).update(state=JobState.RUNNING)
    allocation = lease_of(theirs)
    allocation.log_tail = "epoch 1 loss 0.5 (bob's private output)"
    allocation.save(update_fields=["log_tail"])

    page = login(browser_page, live_server, user)
    row = page.locator(f"#job-{theirs.pk}")
    assert "bob" in row.inner_text() and "bobs-run" in row.inner_text()
    row.get_by_role("link", name=str(theirs.pk)).click()
    page.wait_for_url(f"{live_server.url}/jobs/{theirs.pk}/")
    text = page.locator("main").inner_text()
    assert f"Job {theirs.pk}: bobs-run" in text and "bob's job" in text
    assert "secret_experiment" not in page.content() and "private output" not in page.content()
    assert page.locator("#cancel-job").count() == 0
    assert browser_page.console_errors == []
