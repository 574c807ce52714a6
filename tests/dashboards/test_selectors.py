"""Each dashboard series on a small hand-built dataset, with hand-checked numbers."""

from __future__ import annotations

import random
from datetime import timedelta

import pytest
from django.db.models import Avg, F, Sum

from cluster_app.models import GpuUsageSample, UsageSample
from cluster_app.services import GpuUsage, UsageReport, cluster_usage_minutes_rebuild, node_heartbeat
from profiles_app.models import Workload
from scheduler_app.dashboards import selectors
from scheduler_app.dashboards.buckets import (
    BUCKET_LADDER_S,
    TARGET_POINTS,
    WINDOW_CHOICES,
    EpochBucket,
    Window,
    window_for,
    window_label,
    window_span_s,
    window_spanning,
)
from scheduler_app.models import AdmissionPrediction, AllocationGpu, JobState, SchedulingRound
from tests.dashboards.conftest import T0, at, completed_job
from tests.factories import AllocationFactory, JobFactory, ServerFactory, TeamFactory, WorkloadFactory

pytestmark = pytest.mark.django_db


def hourly(hours: int) -> Window:
    return Window(start=T0, end=T0 + timedelta(hours=hours), bucket_s=3600)


@pytest.mark.parametrize("days", [1, 7, 30, 90, 366, 0.01])
def test_windows_have_a_bounded_number_of_aligned_buckets(days):
    now = T0 + timedelta(days=400, seconds=1234)
    window = window_for(days=days, now=now)
    assert window.num_buckets <= TARGET_POINTS
    assert window.bucket_s in BUCKET_LADDER_S
    assert int(window.start.timestamp()) % window.bucket_s == 0
    assert window.start <= now - timedelta(days=days) < window.start + timedelta(seconds=window.bucket_s)
    assert len(window.bucket_starts()) == window.num_buckets


def test_the_offered_windows_get_buckets_sized_for_them():
    now = T0 + timedelta(days=400, seconds=1234)
    widths = {w: window_spanning(span_s=window_span_s(w), now=now).bucket_s for w in WINDOW_CHOICES}
    assert widths == {"1h": 60, "6h": 300, "24h": 900, "7d": 7200, "30d": 21600}
    assert [window_label(w) for w in WINDOW_CHOICES] == ["1 hour", "6 hours", "24 hours", "7 days", "30 days"]


@pytest.mark.parametrize(
    ("text", "span_s"), [("1h", 3600), ("0.5h", 1800), ("7d", 604800), ("366d", 366 * 86400)]
)
def test_window_texts(text, span_s):
    assert window_span_s(text) == span_s


def test_utilisation_allocated_and_measured():
    a = ServerFactory(name="a", num_gpus=8, num_cpus=24, mem_gb=500)
    b = ServerFactory(name="b", num_gpus=8, num_cpus=8, mem_gb=100)  # capacity 16 GPUs, 32 cores, 600 GB
    a_gpus, b_gpus = list(a.gpus.order_by("index")), list(b.gpus.order_by("index"))
    # 4 GPUs, 12 cores, 250 GB on a for 30 min in each hour bucket (00:30 to 01:30).
    ended = AllocationFactory(
        server=a, num_gpus=4, num_cpus=12, mem_gb=250, started_at=at(0.5), ended_at=at(1.5)
    )
    for g in a_gpus[:4]:
        AllocationGpu.objects.create(allocation=ended, gpu=g, released_at=at(1.5))
    # All of b, still running, since before the window: the whole of both buckets.
    running = AllocationFactory(server=b, num_gpus=8, num_cpus=8, mem_gb=100, started_at=at(-1))
    for g in b_gpus:
        AllocationGpu.objects.create(allocation=running, gpu=g)
    # Over before the window starts: not counted.
    AllocationFactory(server=a, num_cpus=24, mem_gb=500, started_at=at(-3), ended_at=at(-2))
    GpuUsageSample.objects.bulk_create(
        [
            GpuUsageSample(gpu=a_gpus[0], sampled_at=at(1 / 60), util_pct=100, mem_used_mb=1),
            GpuUsageSample(gpu=a_gpus[1], sampled_at=at(2 / 60), util_pct=50, mem_used_mb=1),
            GpuUsageSample(gpu=a_gpus[0], sampled_at=at(1.5), util_pct=20, mem_used_mb=1),
            GpuUsageSample(gpu=a_gpus[0], sampled_at=at(-1 / 60), util_pct=0, mem_used_mb=1),  # before
        ]
    )
    UsageSample.objects.bulk_create(
        [
            UsageSample(server=a, sampled_at=at(0.25), cpu_util_pct=50, mem_used_gb=250),
            UsageSample(server=b, sampled_at=at(0.25), cpu_util_pct=100, mem_used_gb=50),
        ]
    )
    cluster_usage_minutes_rebuild()  # the samples bypassed ingestion: build the per-minute sums
    data = selectors.utilisation_series(window=hourly(2))
    assert data["t"] == [T0.isoformat(), at(1).isoformat()]
    assert data["capacity"] == {"gpus": 16, "cpus": 32, "mem_gb": 600}
    # GPU: 4 GPUs x 30 min + 8 GPUs x 60 min over 16 GPUs x 60 min = 12.5 % + 50 %.
    assert data["gpu"]["allocated_pct"] == [62.5, 62.5]
    # Cores: 12 x 30 min + 8 x 60 min over 32 x 60 min = 18.75 % + 25 %.
    assert data["cpu"]["allocated_pct"] == [43.75, 43.75]
    # Memory: 250 GB x 30 min + 100 GB x 60 min over 600 GB x 60 min = 20.833 % + 16.667 %.
    assert data["mem"]["allocated_pct"] == [37.5, 37.5]
    assert data["gpu"]["measured_pct"] == [75.0, 20.0]
    # Core-weighted: (50 % x 24 + 100 % x 8) / 32 cores; memory: 300 of 600 GB. No sample in hour 2.
    assert data["cpu"]["measured_pct"] == [62.5, None]
    assert data["mem"]["measured_pct"] == [50.0, None]


def test_utilisation_of_an_empty_cluster_is_null_not_an_error():
    data = selectors.utilisation_series(window=hourly(3))
    assert data["gpu"] == {"allocated_pct": [None] * 3, "measured_pct": [None] * 3}


def test_the_last_bucket_counts_only_its_elapsed_part():
    server = ServerFactory(num_gpus=2)
    lease = AllocationFactory(server=server, num_gpus=1, started_at=at(-1))
    AllocationGpu.objects.create(allocation=lease, gpu=server.gpus.first())
    window = Window(start=T0, end=at(1.25), bucket_s=3600)  # "now" is a quarter into hour 2
    assert selectors.utilisation_series(window=window)["gpu"]["allocated_pct"] == [50.0, 50.0]


def test_jct_cdf_average_and_weekly_average_by_policy():
    placed = completed_job(submitted_h=1, finished_h=2)  # 1 h, placed by a fifo/tune round
    sround = SchedulingRound.objects.create(policy="fifo", allocator="tune", started_at=at(1))
    AllocationFactory(job=placed, round=sround, started_at=at(1), ended_at=at(2))
    completed_job(submitted_h=2, finished_h=5)  # 3 h, no recorded round: the configured las/greedy
    JobFactory(state=JobState.FAILED, submitted_at=at(1), finished_at=at(9))  # not completed
    completed_job(submitted_h=-30, finished_h=-20)  # completed before the window
    data = selectors.jct_series(window=hourly(24))
    assert data["jobs"] == 2
    assert data["avg_jct_h"] == 2.0
    assert data["p50_jct_h"] == 2.0
    assert data["p99_jct_h"] == pytest.approx(2.98)
    assert data["cdf"] == {"jct_h": [1.0, 3.0], "fraction": [0.5, 1.0]}
    assert data["by_week"] == {
        "weeks": [T0.date().isoformat()],
        "series": {
            "fifo/tune": {"avg_jct_h": [1.0], "jobs": [1]},
            "las/greedy": {"avg_jct_h": [3.0], "jobs": [1]},
        },
    }


def test_the_jct_cdf_is_downsampled_keeping_min_and_max():
    values = [float(v) for v in range(1000)]
    xs, ys = selectors._downsample(values, 50)
    assert len(xs) == 50 and xs[0] == 0.0 and xs[-1] == 999.0 and ys[-1] == 1.0
    assert ys == sorted(ys)


def test_qos_rate_over_time_and_per_team():
    x, y = TeamFactory(name="x"), TeamFactory(name="y")
    # Met: deadline 10 h, completed at 5 h (decided at 5 h, day 1).
    completed_job(submitted_h=0, finished_h=5, team=x, qos_deadline_at=at(10))
    # Missed: at most 1 h from 1 h, completed at 3 h (decided at its deadline, 2 h, day 1).
    completed_job(submitted_h=1, finished_h=3, team=x, qos_max_latency_s=3600)
    # Missed: deadline 30 h passed while still running (day 2).
    JobFactory(state=JobState.RUNNING, submitted_at=at(2), team=y, qos_deadline_at=at(30))
    # Undecided: running, deadline after the window's end.
    JobFactory(state=JobState.RUNNING, submitted_at=at(2), team=y, qos_deadline_at=at(60))
    # Left out: failed before its deadline; no QoS target at all.
    JobFactory(state=JobState.FAILED, submitted_at=at(2), finished_at=at(3), team=y, qos_deadline_at=at(9))
    completed_job(submitted_h=0, finished_h=1, team=y)
    window = Window(start=T0, end=at(48), bucket_s=86400)
    data = selectors.qos_series(window=window)
    assert data["decided"] == [2, 1]
    assert data["met"] == [1, 0]
    assert data["rate_pct"] == [50.0, 0.0]
    assert data["overall_pct"] == pytest.approx(33.333)
    assert data["teams"] == {"team": ["x", "y"], "met": [1, 0], "decided": [2, 1], "rate_pct": [50.0, 0.0]}


def predicted(job, *, finish_h: float, attainable: bool | None = None, met: bool | None = None):
    return AdmissionPrediction.objects.create(
        job=job,
        policy="fifo",
        allocator="tune",
        predicted_finish_at=at(finish_h),
        attainable=attainable,
        actual_finish_at=job.finished_at,
        met_deadline=met,
    )


def test_admission_forecast_error_per_bucket_and_workload_and_verdicts():
    res18 = WorkloadFactory(name="res18")
    Workload.objects.filter(pk=res18.pk).update(speed_correction=0.8, placement_penalty=1.25)
    # Day 1: two res18 jobs, 2 h late and 1 h early; the first had a QoS verdict that came true.
    predicted(
        completed_job(submitted_h=0, finished_h=6, workload=res18), finish_h=4, attainable=True, met=True
    )
    predicted(completed_job(submitted_h=0, finished_h=8, workload=res18), finish_h=9)
    # Day 2: an own command 3 h late, whose "attainable" verdict was wrong.
    own = completed_job(submitted_h=20, finished_h=30, workload=None, command="python x.py")
    predicted(own, finish_h=27, attainable=True, met=False)
    # Left out: no predicted finish; cancelled; finished outside the window.
    AdmissionPrediction.objects.create(
        job=completed_job(submitted_h=1, finished_h=2),
        policy="fifo",
        allocator="tune",
        actual_finish_at=at(2),
    )
    cancelled = JobFactory(state=JobState.CANCELLED, submitted_at=at(1), finished_at=at(2))
    predicted(cancelled, finish_h=40)
    predicted(completed_job(submitted_h=40, finished_h=50), finish_h=49)
    window = Window(start=T0, end=at(48), bucket_s=86400)
    data = selectors.admission_accuracy_series(window=window)
    assert data["jobs"] == [2, 1]
    assert data["median_abs_error_h"] == [1.5, 3.0]
    assert data["mean_error_h"] == [0.5, 3.0]
    assert data["overall"] == {
        "jobs": 3,
        "median_abs_error_h": 2.0,
        "p90_abs_error_h": pytest.approx(2.8),
        "mean_error_h": pytest.approx(4 / 3, abs=1e-4),
        "verdicts": 2,
        "verdicts_right_pct": 50.0,
    }
    assert data["workloads"] == {
        "workload": ["(own commands)", "res18"],
        "jobs": [1, 2],
        "median_abs_error_h": [3.0, 1.5],
        "mean_error_h": [3.0, 0.5],
        "speed_correction": [None, 0.8],
        "placement_penalty": [None, 1.25],
    }


def test_admission_accuracy_of_an_empty_window_is_null_not_an_error():
    data = selectors.admission_accuracy_series(window=Window(start=T0, end=at(48), bucket_s=86400))
    assert data["jobs"] == [0, 0] and data["median_abs_error_h"] == [None, None]
    assert data["overall"]["median_abs_error_h"] is None and data["overall"]["verdicts_right_pct"] is None


def test_queue_length_per_bucket_from_the_rounds():
    for minute, pending, infeasible, placed in ((5, 3, 1, 2), (35, 1, 0, 4)):
        SchedulingRound.objects.create(
            started_at=T0 + timedelta(minutes=minute),
            policy="fifo",
            allocator="tune",
            num_pending=pending,
            num_infeasible=infeasible,
            num_placed=placed,
        )
    SchedulingRound.objects.create(started_at=at(-1), policy="fifo", allocator="tune", num_pending=99)
    data = selectors.queue_series(window=hourly(2))
    assert data["avg_waiting"] == [2.5, None]
    assert data["max_waiting"] == [4.0, None]
    assert data["avg_running"] == [3.0, None]
    assert data["rounds"] == [2, 0]


def _raw_measured(bucket_s: int, start, end) -> dict[int, tuple]:
    """The per-sample computation the dashboards did before the per-minute sums: the reference."""
    gpu = dict(
        GpuUsageSample.objects.filter(sampled_at__gte=start, sampled_at__lt=end)
        .annotate(bucket=EpochBucket("sampled_at", bucket_s))
        .values("bucket")
        .annotate(util=Avg("util_pct"))
        .order_by("bucket")
        .values_list("bucket", "util")
    )
    rows = (
        UsageSample.objects.filter(sampled_at__gte=start, sampled_at__lt=end)
        .annotate(bucket=EpochBucket("sampled_at", bucket_s))
        .values("bucket")
        .annotate(
            cpu_weighted=Sum(F("cpu_util_pct") * F("server__num_cpus")),
            cpus=Sum("server__num_cpus"),
            mem_used_gb=Sum("mem_used_gb"),
            mem_gb=Sum("server__mem_gb"),
        )
    )
    server = {
        r["bucket"]: (r["cpu_weighted"] / r["cpus"], selectors._pct(r["mem_used_gb"], r["mem_gb"]))
        for r in rows
    }
    return {b: (gpu.get(b), *server.get(b, (None, None))) for b in sorted(set(gpu) | set(server))}


def test_measured_from_minute_sums_equals_the_per_sample_computation():
    rng = random.Random(7)
    shapes = ((2, 24, 500), (1, 8, 96), (3, 64, 1000))  # GPUs, cores, GB
    servers = [ServerFactory(num_gpus=g, num_cpus=c, mem_gb=m) for g, c, m in shapes]
    for server in servers:
        # Heartbeats every 5 to 40 s for an hour, a gap in the middle; some retried.
        when = T0 + timedelta(seconds=rng.uniform(0, 30))
        while when < at(1):
            if not at(0.45) <= when < at(0.55):
                usage = UsageReport(
                    sampled_at=when,
                    cpu_util_pct=rng.uniform(0, 100),
                    mem_used_gb=rng.uniform(0, server.mem_gb),
                    gpus=[
                        GpuUsage(uuid=g.uuid, util_pct=rng.uniform(0, 100), mem_used_mb=1)
                        for g in server.gpus.all()
                        if rng.random() < 0.9  # a GPU missing from a reading now and then
                    ],
                )
                for _ in range(1 + (rng.random() < 0.1)):
                    node_heartbeat(server=server, usage=usage)
            when += timedelta(seconds=rng.choice((5, 5, 5, 12, 40)))
    for bucket_s in (60, 300, 900):
        window = Window(start=T0, end=at(1), bucket_s=bucket_s)
        want = _raw_measured(bucket_s, window.start, window.end)
        got = selectors._measured_by_bucket(bucket_s, window.start, window.end)
        assert sorted(got) == sorted(want) and len(got) >= 2
        for bucket, values in want.items():
            assert got[bucket] == pytest.approx(values, rel=1e-12)
        # And the JSON the page draws: the very same rounded numbers, nulls in the same places.
        data = selectors.utilisation_series(window=window)
        for i, series in enumerate(("gpu", "cpu", "mem")):
            expected = [
                want.get(window.first_index + pos, (None,) * 3)[i] for pos in range(window.num_buckets)
            ]
            assert data[series]["measured_pct"] == [None if v is None else round(v, 3) for v in expected]
