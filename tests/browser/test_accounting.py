"""The accounting page in a real browser: a user's GPU-hours equal the sum over their allocations."""

from __future__ import annotations

import pytest
from django.utils import timezone
from playwright.sync_api import expect

from scheduler_app.models import JobState
from tests.api.accounting_data import H, Ledger
from tests.api.helpers import make_server
from tests.factories import TeamFactory, UserFactory


@pytest.fixture
def history(user):
    """`user` in team vision: a 2-server job partly inside the last 24 h, a finished one, one running;
    another user's job on the same team, which `user` sees only by team."""
    now = timezone.now()
    vision = TeamFactory(name="vision")
    other = UserFactory(username="someone-else")
    vision.members.add(user, other)
    gpu01, gpu02 = make_server("gpu01", gpus=8), make_server("gpu02", gpus=8)
    led = Ledger()
    wide = led.job(
        user, team=vision, submitted_at=now - 30 * H, started_at=now - 28 * H, finished_at=now - 20 * H
    )
    for server in (gpu01, gpu02):  # 4 + 4 GPUs, 4 of their 8 hours inside the last 24 h
        led.allocation(
            wide, server, gpus=4, cpus=12, mem_gb=200, started_at=now - 28 * H, ended_at=now - 20 * H
        )
    done = led.job(
        user, team=vision, state=JobState.FAILED, submitted_at=now - 10 * H, started_at=now - 9 * H,
        finished_at=now - 6.5 * H,
    )  # fmt: skip
    led.allocation(done, gpu01, gpus=3, cpus=9, mem_gb=150, started_at=now - 9 * H, ended_at=now - 6.5 * H)
    running = led.job(
        user, team=vision, state=JobState.RUNNING, submitted_at=now - 3 * H, started_at=now - 2 * H
    )
    led.allocation(running, gpu02, gpus=2, cpus=6, mem_gb=100, started_at=now - 2 * H)
    theirs = led.job(
        other, team=vision, submitted_at=now - 5 * H, started_at=now - 5 * H, finished_at=now - 4 * H
    )
    led.allocation(theirs, gpu01, gpus=1, cpus=3, mem_gb=50, started_at=now - 5 * H, ended_at=now - 4 * H)
    return led, now


def gpu_hours_of(led: Ledger, owner, *, start, now) -> float:
    """Sum over `owner`'s allocations of (overlap with [start, now)) x GPUs, in hours; the GPUs counted
    from the allocation's GPU rows in the database (the page reads the count stored on the lease)."""
    total = 0.0
    for allocation, _ in led.allocations:
        if allocation.job.owner_id != owner.pk:
            continue
        gpus = allocation.gpu_holds.count()
        until = min(allocation.ended_at or now, now)
        total += max(0.0, (until - max(allocation.started_at, start)).total_seconds()) / 3600 * gpus
    return total


def test_a_user_sees_their_gpu_hours_and_their_teams(browser_page, live_server, login, user, history):
    led, now = history
    page = login(browser_page, live_server, user)
    page.get_by_role("link", name="Accounting", exact=True).click()
    expect(page.get_by_role("heading", name="Accounting")).to_be_visible()
    page.get_by_role("navigation", name="Window").get_by_role("link", name="24h").click()
    expect(page).to_have_url(f"{live_server.url}/accounting/?window=24h&by=user")

    table = page.get_by_role("table", name="Accounting")
    expect(table.locator("tbody tr")).to_have_count(1)
    row = table.locator(f'tr[data-name="{user.username}"]')
    # 8 GPUs x 4 h + 3 GPUs x 2.5 h + 2 GPUs x 2 h (running: a few seconds more by the time it is read).
    want = gpu_hours_of(led, user, start=now - 24 * H, now=timezone.now())
    assert round(want, 1) == 43.5
    expect(row.locator("td.gpu-hours")).to_have_text(f"{want:.1f}")
    expect(row.locator("td.jobs-total")).to_have_text("2")

    page.get_by_role("link", name="By team").click()
    expect(page).to_have_url(f"{live_server.url}/accounting/?window=24h&by=team")
    team_row = table.locator('tr[data-name="vision"]')
    expect(team_row.locator("td.gpu-hours")).to_have_text(f"{want + 1:.1f}")  # the other member's GPU-hour
    expect(page.get_by_role("link", name="Download CSV")).to_have_attribute(
        "href", "/api/v1/accounting/?window=24h&by=team&format=csv"
    )
    assert page.console_errors == []
