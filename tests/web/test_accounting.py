"""The accounting page: figures against the rows, window and grouping in the URL, who sees what, CSV link."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.utils import timezone

from scheduler_app.models import JobState
from scheduler_app.selectors import NO_TEAM
from scheduler_app.web.accounting_views import readable_duration
from tests.api.accounting_data import H, Ledger, expected
from tests.api.helpers import make_server
from tests.factories import TeamFactory, UserFactory

pytestmark = pytest.mark.django_db

URL = "/accounting/"


@pytest.fixture
def history():
    """alice (team vision) and bob (no team): usage 3 days ago, 2 hours ago, and one allocation running."""
    now = timezone.now()
    alice, bob = UserFactory(username="alice"), UserFactory(username="bob")
    vision = TeamFactory(name="vision")
    vision.members.add(alice)
    server = make_server("gpu01", gpus=8, cpus=32, mem_gb=512)
    led = Ledger()
    old = led.job(
        alice, team=vision, submitted_at=now - 73 * H, started_at=now - 72 * H, finished_at=now - 70 * H
    )
    led.allocation(old, server, gpus=4, cpus=12, mem_gb=200, started_at=now - 72 * H, ended_at=now - 70 * H)
    recent = led.job(
        alice, team=vision, state=JobState.FAILED, submitted_at=now - 2.5 * H, started_at=now - 2 * H,
        finished_at=now - H,
    )  # fmt: skip
    led.allocation(recent, server, gpus=2, cpus=6, mem_gb=100, started_at=now - 2 * H, ended_at=now - H)
    running = led.job(bob, state=JobState.RUNNING, submitted_at=now - 5 * H, started_at=now - 4.5 * H)
    led.allocation(running, server, gpus=1, cpus=3, mem_gb=62.5, started_at=now - 4.5 * H)
    return led, alice, bob


def row_of(html: str, name: str) -> dict[str, str]:
    """The cells of `name`'s row, by class."""
    row = html.split(f'<tr data-name="{name}">')[1].split("</tr>")[0]
    return {
        cls: text.strip() for cls, text in re.findall(r'<t[dh][^>]*class="([\w-]+)"[^>]*>(.*?)</t[dh]>', row)
    }


def names(html: str) -> list[str]:
    return re.findall(r'<tr data-name="([^"]*)">', html)


def test_staff_see_everyone_with_hours_to_one_decimal(history, staff_user, client_of):
    led, _, _ = history
    answer = client_of(staff_user).get(URL, {"window": "24h"})
    assert answer.status_code == 200
    html = answer.content.decode()
    assert names(html) == ["bob", "alice"]  # bob's running GPU: 4.5 h; alice's 2 GPUs x 1 h
    now = timezone.now()
    want = expected(led, start=now - timedelta(hours=24), end=now, now=now, by="user")
    alice, bob = row_of(html, "alice"), row_of(html, "bob")
    assert alice["gpu-hours"] == f"{want['alice']['gpu_hours']:.1f}" == "2.0"
    assert alice["cpu-core-hours"] == "6.0" and alice["mem-gb-hours"] == "100.0"
    assert bob["gpu-hours"] == f"{want['bob']['gpu_hours']:.1f}" == "4.5"
    assert alice["mean-wait"] == "30 min" and bob["mean-wait"] == "30 min"
    assert alice["jobs-total"] == "1"


def test_the_window_changes_the_figures_and_stays_in_the_links(history, staff_user, client_of):
    html = client_of(staff_user).get(URL, {"window": "7d", "by": "team"}).content.decode()
    assert names(html) == ["vision", NO_TEAM]
    # 4 GPUs x 2 h three days ago, 2 GPUs x 1 h two hours ago.
    assert row_of(html, "vision")["gpu-hours"] == "10.0"
    assert 'href="?window=30d&amp;by=team"' in html and 'href="?window=7d&amp;by=user"' in html
    assert 'aria-current="page">7d<' in html and 'aria-current="page">By team<' in html
    assert 'href="/api/v1/accounting/?window=7d&amp;by=team&amp;format=csv"' in html


def test_the_default_is_30_days_by_user(history, staff_user, client_of):
    html = client_of(staff_user).get(URL).content.decode()
    assert 'aria-current="page">30d<' in html and 'aria-current="page">By user<' in html
    assert row_of(html, "alice")["gpu-hours"] == "10.0"


def test_a_user_sees_only_their_own_row_and_their_teams(history, client_of):
    _, alice, bob = history
    assert names(client_of(alice).get(URL).content.decode()) == ["alice"]
    assert names(client_of(alice).get(URL, {"by": "team"}).content.decode()) == ["vision"]
    # bob is in no team: his own teamless jobs only.
    assert names(client_of(bob).get(URL, {"by": "team"}).content.decode()) == [NO_TEAM]
    assert names(client_of(UserFactory()).get(URL).content.decode()) == []


def test_login_required(client):
    answer = client.get(URL)
    assert answer.status_code == 302 and answer["Location"].startswith("/accounts/login/")


@pytest.mark.parametrize("query", [{"window": "2d"}, {"by": "group"}])
def test_a_bad_choice_is_a_400_page_saying_so(user, client_of, query):
    answer = client_of(user).get(URL, query)
    assert answer.status_code == 400
    assert "is not one of the available choices" in answer.content.decode()


def test_the_csv_link_downloads_the_same_rows(history, staff_user, client_of):
    client = client_of(staff_user)
    html = client.get(URL, {"window": "24h"}).content.decode()
    link = re.search(r'id="download-csv" href="([^"]+)"', html).group(1).replace("&amp;", "&")
    answer = client.get(link)
    assert answer.status_code == 200 and answer["Content-Type"].startswith("text/csv")
    assert [line.split(",")[0] for line in answer.content.decode().splitlines()[1:]] == ["bob", "alice"]


def test_the_nav_links_the_page(user, client_of):
    assert '<a href="/accounting/">Accounting</a>' in client_of(user).get("/jobs/").content.decode()


@pytest.mark.parametrize(
    ("seconds", "shown"),
    [
        (None, "-"),
        (0, "0 s"),
        (45.4, "45 s"),
        (240, "4 min"),
        (3599, "60 min"),
        (9000, "2.5 h"),
        (3 * 86400, "3.0 d"),
    ],
)
def test_readable_durations(seconds, shown):
    assert readable_duration(seconds) == shown
