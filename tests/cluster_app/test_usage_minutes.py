"""The per-minute cluster usage sums: written at heartbeat, once per sample, concurrently, and rebuilt."""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta

import pytest
from django.core.management import call_command
from django.db import IntegrityError, connection, transaction

from cluster_app.models import ClusterUsageMinute, GpuUsageSample, UsageSample
from cluster_app.services import (
    GpuUsage,
    UsageReport,
    cluster_usage_minutes_rebuild,
    node_heartbeat,
    usage_samples_rollup,
)
from cluster_app.usage_minutes import SUM_FIELDS
from tests.factories import ServerFactory

T0 = datetime(2026, 11, 2, 12, 0, tzinfo=UTC)
COLUMNS = ("minute", *SUM_FIELDS)


def report(server, at: datetime, cpu: float, mem_gb: float, gpu_utils: list[float]) -> UsageReport:
    gpus = [
        GpuUsage(uuid=f"GPU-{server.name}-{i}", util_pct=u, mem_used_mb=100) for i, u in enumerate(gpu_utils)
    ]
    return UsageReport(sampled_at=at, cpu_util_pct=cpu, mem_used_gb=mem_gb, gpus=gpus)


def minutes() -> list[tuple]:
    return list(ClusterUsageMinute.objects.order_by("minute").values_list(*COLUMNS))


def assert_same_minutes(expected: list[tuple]) -> None:
    """The table holds `expected`: the same minutes and counts, sums equal up to float rounding."""
    got = minutes()
    assert [row[0] for row in got] == [row[0] for row in expected]
    for row, want in zip(got, expected, strict=True):
        assert row[1:] == pytest.approx(want[1:], rel=1e-12)


@pytest.mark.django_db
def test_heartbeats_add_hand_checked_sums_per_minute():
    a = ServerFactory(name="a", num_gpus=2, num_cpus=24, mem_gb=500)
    b = ServerFactory(name="b", num_gpus=1, num_cpus=8, mem_gb=100)
    node_heartbeat(server=a, usage=report(a, T0 + timedelta(seconds=5), 50, 250, [100, 50]))
    node_heartbeat(server=a, usage=report(a, T0 + timedelta(seconds=10), 25, 200, [20, 0]))
    node_heartbeat(server=b, usage=report(b, T0 + timedelta(seconds=59.5), 100, 50, [30]))
    node_heartbeat(server=b, usage=report(b, T0 + timedelta(seconds=60), 10, 10, [70]))  # the next minute
    assert minutes() == [
        # 3 server samples: 50x24 + 25x24 + 100x8 = 2,600 core-%, 24+24+8 = 56 cores; 500 GB GPU util
        # over 5 samples; memory 250+200+50 of 500+500+100 GB.
        (T0, 3, 2600.0, 56, 500.0, 1100.0, 5, 200.0),
        (T0 + timedelta(minutes=1), 1, 80.0, 8, 10.0, 100.0, 1, 70.0),
    ]


@pytest.mark.django_db
def test_a_retried_report_is_not_counted_twice():
    a = ServerFactory(name="a", num_gpus=2, num_cpus=24, mem_gb=500)
    beat = report(a, T0 + timedelta(seconds=5), 50, 250, [100, 50])
    node_heartbeat(server=a, usage=beat)
    node_heartbeat(server=a, usage=beat)
    assert UsageSample.objects.count() == 1 and GpuUsageSample.objects.count() == 2
    assert minutes() == [(T0, 1, 1200.0, 24, 250.0, 500.0, 2, 150.0)]
    # A retry with other readings (a resent spool) is still the same instant: nothing is added.
    node_heartbeat(server=a, usage=report(a, T0 + timedelta(seconds=5), 99, 99, [99, 99, 99]))
    assert minutes() == [(T0, 1, 1200.0, 24, 250.0, 500.0, 2, 150.0)]


@pytest.mark.django_db
def test_rebuild_matches_ingestion_and_is_idempotent(capsys):
    a = ServerFactory(name="a", num_gpus=2, num_cpus=24, mem_gb=500)
    b = ServerFactory(name="b", num_gpus=1, num_cpus=8, mem_gb=100)
    for k in range(30):  # every 7 s for 3.5 minutes
        at = T0 + timedelta(seconds=7 * k)
        node_heartbeat(server=a, usage=report(a, at, k % 100, k * 1.5, [k, 100 - k]))
        node_heartbeat(server=b, usage=report(b, at, 3 * k % 100, k * 0.5, [k / 3]))
    ingested = minutes()
    assert len(ingested) == 4
    assert cluster_usage_minutes_rebuild() == 4
    assert_same_minutes(ingested)
    until = T0 + timedelta(hours=1)
    call_command("usage_minutes_rebuild", "--since", T0.isoformat(), "--until", until.isoformat())
    assert "4 minute rows" in capsys.readouterr().out
    assert_same_minutes(ingested)
    # A range of the table: only its minutes are replaced, wiped ones come back the same.
    ClusterUsageMinute.objects.filter(minute=T0 + timedelta(minutes=1)).delete()
    inside = T0 + timedelta(seconds=61)  # widened to the whole minute 12:01
    assert cluster_usage_minutes_rebuild(start=inside, end=inside) == 1
    assert_same_minutes(ingested)
    # A minute whose samples are gone (their server was deleted) goes away with a full rebuild.
    ClusterUsageMinute.objects.create(minute=T0 - timedelta(days=1), servers_sampled=1, cpu_cores_sum=8)
    assert cluster_usage_minutes_rebuild() == 4
    assert_same_minutes(ingested)


@pytest.mark.django_db
def test_the_rollup_rebuilds_the_minutes_it_folds(settings):
    settings.ATTUNE_USAGE_RAW_RETENTION_DAYS = 2
    a = ServerFactory(name="a", num_gpus=1, num_cpus=24, mem_gb=500)
    for k in range(24):  # two minutes of 5-second samples
        node_heartbeat(server=a, usage=report(a, T0 + timedelta(seconds=5 * k), k, k, [4 * k]))
    assert minutes()[0][1] == 12
    usage_samples_rollup(now=T0 + timedelta(days=3))
    # One averaged sample per server / GPU and minute now: the sums say so too.
    rolled = minutes()
    assert [row[1] for row in rolled] == [1, 1] and [row[6] for row in rolled] == [1, 1]
    assert rolled[0][2] == pytest.approx(5.5 * 24) and rolled[0][7] == pytest.approx(22.0)
    cluster_usage_minutes_rebuild()
    assert_same_minutes(rolled)


@pytest.mark.django_db
def test_counts_may_not_go_negative():
    with pytest.raises(IntegrityError), transaction.atomic():
        ClusterUsageMinute.objects.create(minute=T0, gpu_samples=-1)


@pytest.mark.django_db(transaction=True)
def test_concurrent_heartbeats_lose_no_update():
    """Many agents report the same minute at once, each report twice (a retry racing its original),
    while the minute is rebuilt."""
    if connection.vendor != "postgresql":
        pytest.skip("concurrent writers need PostgreSQL (SQLite has one writer at a time)")
    servers = [ServerFactory(name=f"s{i}", num_gpus=2, num_cpus=8 + i, mem_gb=100 + i) for i in range(8)]
    beats_per_server = 15
    start = threading.Barrier(len(servers) * 2 + 1)
    errors: list[BaseException] = []

    def agent(server, copy: int) -> None:
        try:
            start.wait()
            for k in range(beats_per_server):
                at = T0 + timedelta(seconds=4 * k)  # 15 beats over one minute
                node_heartbeat(server=server, usage=report(server, at, 10.0 + k, 1.0, [k, 2 * k]))
        except BaseException as exc:  # reported by the main thread
            errors.append(exc)
        finally:
            connection.close()

    def rebuilder() -> None:
        # A rebuild of the same minute, again and again while the agents write: it may neither lose
        # nor double a sample, nor clash with a minute row an agent creates meanwhile.
        try:
            start.wait()
            for _ in range(10):
                cluster_usage_minutes_rebuild(start=T0, end=T0 + timedelta(minutes=1))
        except BaseException as exc:  # reported by the main thread
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=agent, args=(s, c)) for s in servers for c in (0, 1)]
    threads.append(threading.Thread(target=rebuilder))
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    row = ClusterUsageMinute.objects.get()
    n = len(servers) * beats_per_server
    assert UsageSample.objects.count() == n and GpuUsageSample.objects.count() == 2 * n
    assert row.servers_sampled == n and row.gpu_samples == 2 * n
    assert row.cpu_cores_sum == beats_per_server * sum(8 + i for i in range(8))
    assert row.gpu_util_pct_sum == pytest.approx(len(servers) * sum(3 * k for k in range(beats_per_server)))
    assert row.cpu_util_pct_cores_sum == pytest.approx(
        sum((8 + i) * (10.0 + k) for i in range(8) for k in range(beats_per_server))
    )
    assert row.mem_capacity_gb_sum == pytest.approx(beats_per_server * sum(100 + i for i in range(8)))


@pytest.mark.django_db
def test_a_rebuild_over_weeks_goes_chunk_by_chunk_and_misses_nothing():
    a = ServerFactory(name="a", num_gpus=1, num_cpus=24, mem_gb=500)
    for days in (0, 6.99, 7, 20):  # on both sides of the 7-day chunk boundaries
        node_heartbeat(server=a, usage=report(a, T0 + timedelta(days=days), 10, 10, [50]))
    ingested = minutes()
    assert cluster_usage_minutes_rebuild() == 4
    assert_same_minutes(ingested)
