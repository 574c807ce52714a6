"""Dashboard pages and JSON endpoints: staff only, bounded queries, answers shaped for the charts."""

from __future__ import annotations

import re
from datetime import datetime

import pytest
from django.urls import reverse
from django.utils import timezone

from cluster_app.models import GpuUsageSample, UsageSample
from cluster_app.services import cluster_usage_minutes_rebuild
from scheduler_app.models import AdmissionPrediction, SchedulingRound
from tests.dashboards.conftest import completed_job
from tests.factories import AllocationFactory, ServerFactory

pytestmark = pytest.mark.django_db

PAGES = ["index", "utilisation", "jobs", "qos", "queue", "whatif"]
ENDPOINTS = [
    "api_utilisation",
    "api_jct",
    "api_qos",
    "api_queue",
    "api_admission",
    "api_prediction",
    "api_restarts",
]


@pytest.mark.parametrize("name", PAGES + ENDPOINTS)
def test_anonymous_users_are_sent_to_log_in(client, name):
    response = client.get(reverse(f"dashboards:{name}"))
    assert response.status_code == 302
    assert "next=" in response["Location"]


@pytest.mark.parametrize("name", PAGES + ENDPOINTS)
def test_users_who_are_not_staff_are_refused(plain_client, name):
    assert plain_client.get(reverse(f"dashboards:{name}")).status_code == 403


@pytest.mark.parametrize("name", PAGES)
def test_staff_see_the_pages_with_local_plotly(staff_client, name):
    response = staff_client.get(reverse(f"dashboards:{name}"))
    assert response.status_code == 200
    html = response.content.decode()
    assert "/static/dashboards/plotly.min.js" in html
    sources = re.findall(r'<(?:script|link)[^>]+(?:src|href)="([^"]+)"', html)
    assert sources and all(src.startswith("/static/") for src in sources)  # nothing from a CDN


def test_plotly_is_served_locally(staff_client):
    response = staff_client.get("/static/dashboards/plotly.min.js")
    assert response.status_code == 200


def seed_a_little():
    server = ServerFactory()
    now = timezone.now()
    gpu = server.gpus.first()
    for minutes in range(0, 120, 5):
        at = now - timezone.timedelta(minutes=minutes)
        UsageSample.objects.create(server=server, sampled_at=at, cpu_util_pct=40, mem_used_gb=100)
        GpuUsageSample.objects.create(gpu=gpu, sampled_at=at, util_pct=80, mem_used_mb=1000)
        SchedulingRound.objects.create(started_at=at, policy="fifo", allocator="tune", num_pending=2)
    cluster_usage_minutes_rebuild()  # the samples bypassed ingestion: build the per-minute sums
    for i in range(5):
        job = completed_job(submitted_h=0, finished_h=1)
        job.submitted_at = now - timezone.timedelta(hours=i + 2)  # each took 2 h
        job.finished_at = now - timezone.timedelta(hours=i)
        job.save()
        AllocationFactory(job=job, server=server, started_at=job.submitted_at, ended_at=job.finished_at)
        AdmissionPrediction.objects.create(  # promised 30 min earlier than it happened
            job=job,
            policy="fifo",
            allocator="tune",
            predicted_finish_at=job.finished_at - timezone.timedelta(minutes=30),
            attainable=i % 2 == 0,
            actual_finish_at=job.finished_at,
            met_deadline=True,
        )


@pytest.mark.parametrize("name", ENDPOINTS)
def test_endpoints_answer_json_in_a_bounded_number_of_queries(
    staff_client, django_assert_max_num_queries, name
):
    seed_a_little()
    # Session and user, then at most four reads whatever the amount of data.
    with django_assert_max_num_queries(6):
        response = staff_client.get(reverse(f"dashboards:{name}"), {"window": "24h"})
    assert response.status_code == 200
    data = response.json()
    assert data["bucket_s"] == 900 and "start" in data and "end" in data
    if "t" in data:
        assert 0 < len(data["t"]) <= 150


def test_the_endpoints_see_the_seeded_data(staff_client):
    seed_a_little()
    util = staff_client.get(reverse("dashboards:api_utilisation"), {"window": "24h"}).json()
    assert 80.0 in util["gpu"]["measured_pct"]
    assert 40.0 in util["cpu"]["measured_pct"]
    jct = staff_client.get(reverse("dashboards:api_jct"), {"window": "24h"}).json()
    assert jct["jobs"] == 5 and jct["avg_jct_h"] == pytest.approx(2.0)
    queue = staff_client.get(reverse("dashboards:api_queue"), {"window": "24h"}).json()
    assert 2.0 in queue["avg_waiting"]


@pytest.mark.parametrize(
    ("query", "span_s", "bucket_s"),
    [
        ({"window": "1h"}, 3600, 60),
        ({"window": "6h"}, 6 * 3600, 300),
        ({"window": "24h"}, 86400, 900),
        ({"window": "7d"}, 7 * 86400, 2 * 3600),
        ({"window": "30d"}, 30 * 86400, 6 * 3600),
        ({}, 86400, 900),  # the default: 24 h
        ({"days": "1"}, 86400, 900),  # the older parameter still answers
        ({"days": "7"}, 7 * 86400, 2 * 3600),
    ],
)
def test_each_window_has_buckets_sized_for_it(staff_client, query, span_s, bucket_s):
    data = staff_client.get(reverse("dashboards:api_queue"), query).json()
    assert data["bucket_s"] == bucket_s
    start, end = datetime.fromisoformat(data["start"]), datetime.fromisoformat(data["end"])
    assert 0 <= (end - start).total_seconds() - span_s < bucket_s  # the start is aligned down
    assert len(data["t"]) <= 150


@pytest.mark.parametrize("days", ["0", "-1", "abc", "400", "nan", "inf"])
def test_bad_days_are_refused(staff_client, days):
    response = staff_client.get(reverse("dashboards:api_jct"), {"days": days})
    assert response.status_code == 400
    assert "days" in response.json()["error"]


@pytest.mark.parametrize("window", ["", "6", "6x", "-1h", "0h", "367d", "1e3h", "6 hours", "nanh"])
def test_bad_windows_are_refused(staff_client, window):
    response = staff_client.get(reverse("dashboards:api_jct"), {"window": window})
    assert response.status_code == 400
    assert "window" in response.json()["error"]


def selected_window(html: str) -> str:
    (value,) = re.findall(r'<option value="([^"]+)" selected>', html)
    return value


def test_pages_offer_windows_from_an_hour_to_a_month_defaulting_to_a_day(staff_client):
    html = staff_client.get(reverse("dashboards:queue")).content.decode()
    assert re.findall(r'<option value="([^"]+)"', html) == ["1h", "6h", "24h", "7d", "30d"]
    assert selected_window(html) == "24h"
    assert 'href="/dashboards/utilisation/"' in html  # the default window needs no query


def test_the_window_in_the_url_is_selected_and_kept_by_the_links(staff_client):
    html = staff_client.get(reverse("dashboards:queue"), {"window": "6h"}).content.decode()
    assert selected_window(html) == "6h"
    assert 'href="/dashboards/utilisation/?window=6h"' in html
    assert 'href="/dashboards/whatif/"' in html  # the what-if page has no window


def test_a_window_from_a_shared_link_that_is_not_offered_is_still_shown(staff_client):
    html = staff_client.get(reverse("dashboards:index"), {"window": "12h"}).content.decode()
    assert selected_window(html) == "12h" and ">last 12 hours</option>" in html


def test_a_mistyped_window_shows_the_default(staff_client):
    html = staff_client.get(reverse("dashboards:jobs"), {"window": "6x"}).content.decode()
    assert selected_window(html) == "24h"


def test_a_refresh_sees_new_samples_in_the_open_bucket(staff_client):
    server = ServerFactory()
    url = reverse("dashboards:api_utilisation")
    before = staff_client.get(url, {"window": "1h"}).json()
    assert before["gpu"]["measured_pct"][-2:] == [None, None]
    GpuUsageSample.objects.create(
        gpu=server.gpus.first(), sampled_at=timezone.now(), util_pct=42, mem_used_mb=1
    )
    cluster_usage_minutes_rebuild()
    after = staff_client.get(url, {"window": "1h"}).json()
    assert 42.0 in after["gpu"]["measured_pct"][-2:]  # the last bucket, or the one before at a boundary
