"""A job's restarts on its page in a real browser: shown, and updated in place when it moves again."""

from __future__ import annotations

from datetime import timedelta

from django.utils import timezone

from scheduler_app.models import JobState
from tests.browser.conftest import login
from tests.scheduler_app.test_restarts_selectors import interrupt, lease, moved_twice_and_preempted


def test_the_job_page_shows_moves_and_gpu_time_lost_and_follows_a_new_move(browser_page, live_server, user):
    job = moved_twice_and_preempted()
    page = login(browser_page, live_server, user)
    page.goto(f"{live_server.url}/jobs/{job.pk}/")
    page.evaluate("window.__not_reloaded = true")
    restarts = page.locator("#job-restarts")
    assert restarts.inner_text().startswith("moved 2\u00d7, preempted 1\u00d7, requeued 0\u00d7")
    before = float(page.locator("#gpu-time-lost").inner_text().split()[0])

    # Moved once more: its lease ended having lost an hour of 8 GPUs' work; the page's live refresh
    # (every 5 s) shows the third move and the eight GPU-hours more without a reload.
    now = timezone.now()
    lease(job, now, gpus=8, startup_s=None, lost_work_s=3600.0, ended_at=now + timedelta(seconds=1))
    interrupt(job, via=JobState.PREEMPTED, reason="moved", to_state=JobState.RUNNING, at=now)
    page.wait_for_function(
        "() => document.querySelector('#job-restarts').textContent.startsWith('moved 3')", timeout=15_000
    )
    assert float(page.locator("#gpu-time-lost").inner_text().split()[0]) == round(before + 8.0, 2)
    assert page.evaluate("window.__not_reloaded") is True
    assert browser_page.console_errors == []
