"""Prediction accuracy per workload and placement shape: live leases and the GENIE fit's residuals."""

from __future__ import annotations

from datetime import datetime, timedelta

import pytest
from django.urls import reverse
from django.utils import timezone

from cluster_app.models import Server
from profiles_app.models import GenieFit, SpeedObservation, Workload
from scheduler_app.dashboards.buckets import Window
from scheduler_app.dashboards.prediction_accuracy import prediction_accuracy_series, shape_label
from scheduler_app.models import Job
from tests.dashboards.conftest import T0, at
from tests.factories import AllocationFactory, JobFactory, ServerFactory, WorkloadFactory

pytestmark = pytest.mark.django_db

WINDOW = Window(start=T0, end=at(48), bucket_s=86400)


def lease(
    job: Job,
    *,
    predicted: float,
    measured: float,
    server: Server | None = None,
    num_gpus: int | None = None,
    num_servers: int = 1,
    reported_at: datetime | None = None,
    first_at: datetime | None = None,
) -> SpeedObservation:
    """One lease of `job` (its part on one server: `num_gpus`, by default the job's) that reported
    `measured` iterations/s against `predicted`."""
    reported_at = reported_at or at(1)
    return SpeedObservation.objects.create(
        workload=job.workload,
        job=job,
        allocation=AllocationFactory(
            job=job, server=server or ServerFactory(with_gpus=False), num_gpus=num_gpus or job.num_gpus
        ),
        cpus_per_gpu=3,
        mem_gb_per_gpu=62.5,
        num_servers=num_servers,
        predicted_iters_per_s=predicted,
        measured_iters_per_s=measured,
        samples=3,
        first_at=first_at or reported_at,
        at=reported_at,
    )


def genie_fit(workload: Workload, residuals: list[tuple[str, float, float]], **kwargs) -> GenieFit:
    """A stored fit whose samples are `residuals`' configurations: (config key, predicted s, measured s)."""
    Workload.objects.filter(pk=workload.pk).update(genie_alpha_s=0.001, genie_beta_s=0.01)
    workload.refresh_from_db()
    samples = []
    for key, _, measured in residuals:
        n, k = int(key[1]), int(key[3])
        samples.append(
            {"config": key, "num_servers": n, "gpus_per_server": k, "batch": 32, "iter_time_s": measured}
        )
    return GenieFit.objects.create(
        workload=workload,
        alpha_s=0.001,
        beta_s=0.01,
        t_intra_s=0.002,
        t_cross_s=0.02,
        r2=0.99,
        r2_compute=0.99,
        samples=samples,
        residuals=[
            {"config": key, "predicted_s": p, "measured_s": m, "error_pct": 100 * (p - m) / m}
            for key, p, m in residuals
        ],
        **kwargs,
    )


def test_shape_labels():
    assert [shape_label(1, 1), shape_label(4, 1), shape_label(8, 2)] == [
        "1 GPU",
        "4 GPUs, 1 server",
        "8 GPUs, 2 servers",
    ]


def test_live_leases_per_workload_and_shape_give_median_times_and_errors():
    server = ServerFactory(with_gpus=False)
    res18, bert = WorkloadFactory(name="res18"), WorkloadFactory(name="bert")
    one = JobFactory(workload=res18, num_gpus=1)
    # 1 GPU: 0.1 s -> 0.125 s (+25%), 0.25 s -> 0.2 s (-20%), 0.5 s -> 0.5 s (0%).
    lease(one, predicted=10, measured=8, server=server)
    lease(one, predicted=4, measured=5, server=server)
    lease(JobFactory(workload=res18, num_gpus=1), predicted=2, measured=2, server=server)
    # 4 GPUs on one server: 0.5 s -> 1 s (+100%), 1 s -> 1.25 s (+25%).
    four = JobFactory(workload=res18, num_gpus=4)
    lease(four, predicted=2, measured=1, server=server)
    lease(four, predicted=1, measured=0.8, server=server)
    # 8 GPUs over two servers, 4 on each: one lease per server, 2 s -> 2.5 s (+25%) both.
    spread = JobFactory(workload=res18, num_gpus=8)
    lease(spread, predicted=0.5, measured=0.4, num_gpus=4, num_servers=2, server=server)
    lease(
        spread, predicted=0.5, measured=0.4, num_gpus=4, num_servers=2, server=ServerFactory(with_gpus=False)
    )
    # Another workload: 0.2 s -> 0.25 s (+25%).
    lease(JobFactory(workload=bert, num_gpus=1), predicted=5, measured=4, server=server)
    # Left out: last report before the window, first report after it, no measured speed.
    lease(one, predicted=1, measured=100, server=server, first_at=at(-10), reported_at=at(-1))
    lease(one, predicted=1, measured=100, server=server, reported_at=at(50))
    lease(one, predicted=1, measured=0, server=server)

    data = prediction_accuracy_series(window=WINDOW)

    def live(count, predicted_s, measured_s, error_pct, abs_error_pct):
        return {
            "count": count,
            "predicted_iter_s": predicted_s,
            "measured_iter_s": measured_s,
            "error_pct": error_pct,
            "abs_error_pct": abs_error_pct,
        }

    assert [(r["workload"], r["shape"], r["live"], r["profiled"]) for r in data["rows"]] == [
        ("bert", "1 GPU", live(1, 0.2, 0.25, 25.0, 25.0), None),
        ("res18", "1 GPU", live(3, 0.25, 0.2, 0.0, 20.0), None),
        ("res18", "4 GPUs, 1 server", live(2, 0.75, 1.125, 62.5, 62.5), None),
        ("res18", "8 GPUs, 2 servers", live(2, 2.0, 2.5, 25.0, 25.0), None),
    ]
    assert (data["leases"], data["capped"], data["fitted_at"]) == (8, False, {})


def test_the_latest_genie_fit_gives_the_residuals_at_profiling_per_shape():
    res18 = WorkloadFactory(name="res18")
    older = genie_fit(res18, [("n1k1b32", 1.0, 9.0)])
    GenieFit.objects.filter(pk=older.pk).update(created_at=timezone.now() - timedelta(days=3))
    latest = genie_fit(
        res18,
        [
            ("n1k1b32", 0.1, 0.11),  # +10%
            ("n1k1b64", 0.2, 0.19),  # -5%
            ("n1k2b32", 0.12, 0.15),  # +25%
            ("n2k1b32", 0.3, 0.24),  # -20%
        ],
    )
    lease(JobFactory(workload=res18, num_gpus=1), predicted=10, measured=8)

    data = prediction_accuracy_series(window=WINDOW)

    rows = {r["shape"]: r for r in data["rows"]}
    assert list(rows) == ["1 GPU", "2 GPUs, 1 server", "2 GPUs, 2 servers"]
    assert rows["1 GPU"]["live"]["error_pct"] == 25.0
    assert rows["1 GPU"]["profiled"] == {
        "count": 2,
        "predicted_iter_s": 0.15,
        "measured_iter_s": 0.15,
        "error_pct": 2.5,
        "abs_error_pct": 7.5,
    }
    assert rows["2 GPUs, 1 server"]["live"] is None
    assert (
        rows["2 GPUs, 1 server"]["profiled"]["error_pct"],
        rows["2 GPUs, 1 server"]["profiled"]["count"],
    ) == (
        25.0,
        1,
    )
    assert rows["2 GPUs, 2 servers"]["profiled"]["error_pct"] == -20.0
    assert data["fitted_at"] == {"res18": latest.created_at.isoformat()}


def test_the_live_rows_are_capped_to_the_newest_leases():
    job = JobFactory(num_gpus=1)
    server = ServerFactory(with_gpus=False)
    lease(job, predicted=1, measured=0.5, server=server, reported_at=at(1))  # the oldest: left out
    lease(job, predicted=1, measured=1, server=server, reported_at=at(2))
    lease(job, predicted=1, measured=2, server=server, reported_at=at(3))

    data = prediction_accuracy_series(window=WINDOW, max_observations=2)

    assert (data["leases"], data["capped"]) == (2, True)
    (row,) = data["rows"]
    assert (row["live"]["count"], row["live"]["measured_iter_s"], row["live"]["error_pct"]) == (
        2,
        0.75,
        -25.0,
    )


def test_the_endpoint_answers_over_the_dashboards_window(staff_client):
    job = JobFactory(num_gpus=1)
    now = timezone.now()
    lease(job, predicted=4, measured=2, reported_at=now - timedelta(hours=1))
    lease(job, predicted=4, measured=2, reported_at=now - timedelta(hours=3))

    recent = staff_client.get(reverse("dashboards:api_prediction"), {"window": "2h"}).json()
    day = staff_client.get(reverse("dashboards:api_prediction"), {"window": "24h"}).json()

    assert [(r["shape"], r["live"]["count"], r["live"]["error_pct"]) for r in recent["rows"]] == [
        ("1 GPU", 1, 100.0)
    ]
    assert day["rows"][0]["live"]["count"] == 2


def test_the_qos_page_has_the_prediction_accuracy_table(staff_client):
    html = staff_client.get(reverse("dashboards:qos")).content.decode()
    assert "<h2>Prediction accuracy</h2>" in html
    assert f'data-endpoint="{reverse("dashboards:api_prediction")}" data-table="prediction-accuracy"' in html
    assert "Live leases" in html and "At profiling" in html
