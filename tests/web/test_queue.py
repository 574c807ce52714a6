"""The queue page: who sees which jobs, filters, squeue's columns, and a constant number of queries."""

import re
from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from scheduler_app.models import Job, JobForecast, JobState, PendingReason
from scheduler_app.services.forecasts import job_forecasts_refresh
from tests.api.helpers import make_server
from tests.factories import TeamFactory, UserFactory
from tests.web.conftest import pending_array, pending_job, running_job

pytestmark = pytest.mark.django_db

URL = "/jobs/"


def job_ids(html: str) -> list[int]:
    return [int(i) for i in re.findall(r'<tr id="job-(\d+)"', html)]


def test_every_user_sees_every_job_as_squeue_shows_them(user, staff_user, client_of, cluster):
    mine = pending_job(user)
    other = UserFactory()
    theirs = pending_job(other)
    html = client_of(user).get(URL).content.decode()
    assert job_ids(html) == [mine.pk, theirs.pk]
    assert f"<td>{other.username}</td>" in html.split(f'<tr id="job-{theirs.pk}"')[1].split("</tr>")[0]
    assert job_ids(client_of(staff_user).get(URL).content.decode()) == [mine.pk, theirs.pk]


def test_private_jobs_shows_a_user_only_their_own(user, staff_user, client_of, cluster, settings):
    settings.ATTUNE_SCHEDULER = {**settings.ATTUNE_SCHEDULER, "private_jobs": True}
    mine = pending_job(user)
    theirs = pending_job(UserFactory())
    assert job_ids(client_of(user).get(URL).content.decode()) == [mine.pk]
    assert job_ids(client_of(staff_user).get(URL).content.decode()) == [mine.pk, theirs.pk]


def test_running_then_pending_with_position_reason_estimate_and_allocation(user, client_of, cluster):
    first = pending_job(user)
    second = pending_job(user, num_gpus=4)
    running, _ = running_job(user, cluster, gpus=2, done_iters=250)
    job_forecasts_refresh()
    html = client_of(user).get(URL).content.decode()
    assert job_ids(html) == [running.pk, first.pk, second.pk]
    row = html.split(f'<tr id="job-{first.pk}"')[1].split("</tr>")[0]
    cells = re.findall(r"<td>(.*?)</td>", row, re.S)
    assert "PENDING" in cells[4] and cells[5] == "1" and "Priority" in cells[6]
    assert re.search(r'<td class="est-start"><time', row) and re.search(
        r'<td class="est-finish"><span[^>]*><time', row
    )
    row = html.split(f'<tr id="job-{second.pk}"')[1].split("</tr>")[0]
    assert re.findall(r"<td>(.*?)</td>", row, re.S)[5] == "2"
    row = html.split(f'<tr id="job-{running.pk}"')[1].split("</tr>")[0]
    assert "<strong>gpu01</strong> GPU 0,1 · 6 cores · 125 GB" in row
    assert 'value="250"' in row and "25%" in row


def test_by_default_only_pending_and_running_jobs_are_listed(user, client_of, cluster):
    pending = pending_job(user)
    done = pending_job(user, state=JobState.COMPLETED)
    assert job_ids(client_of(user).get(URL).content.decode()) == [pending.pk]
    html = client_of(user).get(URL, {"state": "COMPLETED"}).content.decode()
    assert job_ids(html) == [done.pk]
    assert re.search(r'value="COMPLETED"[^>]*checked', html)


def test_filter_by_team_and_user(staff_user, client_of, cluster):
    alice, bob = UserFactory(username="alice"), UserFactory(username="bob")
    vision = TeamFactory(name="vision")
    a = pending_job(alice, team=vision)
    b = pending_job(bob)
    client = client_of(staff_user)
    assert job_ids(client.get(URL, {"team": "vision"}).content.decode()) == [a.pk]
    assert job_ids(client.get(URL, {"owner": "bob"}).content.decode()) == [b.pk]
    assert job_ids(client.get(URL, {"owner": "bob", "team": "vision"}).content.decode()) == []


def test_the_queue_is_paginated_by_100(user, client_of, cluster):
    jobs = [pending_job(user) for _ in range(105)]
    client = client_of(user)
    first = client.get(URL, {"state": "PENDING"}).content.decode()
    assert len(job_ids(first)) == 100 and "Page 1 of 2" in first
    assert 'href="?state=PENDING&amp;page=2"' in first
    second = client.get(URL, {"state": "PENDING", "page": 2}).content.decode()
    assert job_ids(second) == [j.pk for j in jobs[100:]]


def test_the_queue_costs_the_same_queries_for_3_or_150_jobs(
    staff_user, client_of, cluster, django_assert_max_num_queries
):
    # Several owners and teams, so that a missing select_related or prefetch would show as N+1.
    owners = [UserFactory() for _ in range(4)]
    teams = [TeamFactory(), TeamFactory(), None]
    big = make_server("gpu02", gpus=8)
    client = client_of(staff_user)

    def add(pending: int, running: int) -> None:
        for i in range(pending):
            pending_job(owners[i % 4], team=teams[i % 3])
        for i in range(running):
            running_job(owners[i % 4], big, gpus=2, team=teams[i % 3])

    add(pending=2, running=1)
    client.get(URL)  # warm the session
    with CaptureQueriesContext(connection) as few:
        client.get(URL)
    add(pending=140, running=3)
    with django_assert_max_num_queries(len(few)):
        html = client.get(URL).content.decode()
    assert len(job_ids(html)) == 100


def test_an_arrays_waiting_tasks_share_a_row_as_squeue_shows_them(user, client_of, cluster):
    single = pending_job(user)
    tasks = pending_array(user, [0, 1, 2, 3, 5, 6], limit=2)
    array = tasks[0].pk
    Job.objects.filter(pk=tasks[3].pk).update(pending_reason=PendingReason.ARRAY_TASK_LIMIT)
    client = client_of(user)
    html = client.get(URL).content.decode()
    # Task 3 waits for another reason: it splits the run, as squeue's lines do.
    assert job_ids(html) == [single.pk, tasks[0].pk, tasks[3].pk, tasks[4].pk]
    row = html.split(f'<tr id="job-{tasks[0].pk}"')[1].split("</tr>")[0]
    assert f">{array}_[0-2%2]</a>" in row and "3 tasks" in row and 'data-tasks="3"' in row
    assert f'href="?array_job={array}"' in row
    # Its estimated finish is its last task's (2's), its start its first's, as `attune queue` shows them.
    now = timezone.now()
    for hours, task in enumerate(tasks[:3]):
        JobForecast.objects.create(
            job=task,
            start_at=now + timedelta(hours=hours),
            finish_at=now + timedelta(hours=hours + 1),
            computed_at=now,
        )
    row = client.get(URL).content.decode().split(f'<tr id="job-{tasks[0].pk}"')[1].split("</tr>")[0]
    assert re.search(r'class="est-start">.*?datetime="([^"]+)"', row).group(1) == now.isoformat()
    finish = re.search(r'class="est-finish">.*?datetime="([^"]+)"', row, re.S).group(1)
    assert finish == (now + timedelta(hours=3)).isoformat()
    assert f">{array}_[5-6%2]</a>" in html and "7 jobs" in html
    # squeue -r: one row per task, and back.
    html = client.get(URL, {"tasks": "1"}).content.decode()
    assert job_ids(html) == [single.pk, *(t.pk for t in tasks)] and "7 jobs" in html
    assert 'id="tasks-toggle" href="?state=PENDING&amp;state=RUNNING"' in html
    # One array asked for: its tasks one by one.
    html = client.get(URL, {"array_job": array}).content.decode()
    assert job_ids(html) == [t.pk for t in tasks] and 'id="tasks-toggle"' not in html
    # A running task is a row of its own, and the others still share theirs.
    Job.objects.filter(pk=tasks[1].pk).update(state=JobState.RUNNING, pending_reason=PendingReason.NONE)
    html = client.get(URL).content.decode()
    assert job_ids(html) == [tasks[1].pk, single.pk, tasks[0].pk, tasks[3].pk, tasks[4].pk]
    assert f">{array}_[0,2%2]</a>" in html and f">{array}_[5-6%2]</a>" in html


def test_a_page_holds_100_rows_whatever_the_tasks_behind_them(user, client_of, cluster):
    pending_array(user, range(150))
    singles = [pending_job(user) for _ in range(101)]
    html = client_of(user).get(URL, {"state": "PENDING"}).content.decode()
    assert len(job_ids(html)) == 100 and "Page 1 of 2" in html and "251 jobs" in html
    html = client_of(user).get(URL, {"state": "PENDING", "page": 2}).content.decode()
    assert job_ids(html) == [job.pk for job in singles[99:]]
