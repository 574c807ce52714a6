"""Prometheus metrics at /metrics: the figures against rows built by hand, access control, the counters."""

from __future__ import annotations

import json
import re
import uuid
from datetime import timedelta
from pathlib import Path

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from prometheus_client.openmetrics.parser import text_string_to_metric_families as openmetrics_families
from prometheus_client.parser import text_string_to_metric_families

from cluster_app.agent_call_counter import agent_calls, agent_calls_forget, count_agent_call
from cluster_app.models import GpuUsageSample, NodeState, UsageSample
from scheduler_app.metrics.access import metrics_access
from scheduler_app.metrics.tallies import REPORTS_SETTLE, tallies_forget
from scheduler_app.models import (
    AdmissionPrediction,
    AgentReport,
    AgentReportPending,
    AllocationGpu,
    JobEndPending,
    JobState,
    PendingReason,
    RoundDecision,
    SchedulingRound,
)
from tests.factories import AllocationFactory, JobFactory, ServerFactory, hold_gpus

DASHBOARD = Path(__file__).resolve().parents[2] / "docs" / "grafana" / "attune.json"
GIB = 1024**3


@pytest.fixture(autouse=True)
def fresh_metrics(settings):
    """Open to loopback only (the default), and no running totals left from another test's rows."""
    settings.ATTUNE_METRICS_TOKEN = ""
    settings.ATTUNE_METRICS_ALLOWED_IPS = []
    tallies_forget()
    agent_calls_forget()
    yield
    tallies_forget()
    agent_calls_forget()


def scrape(client, **extra) -> dict[tuple[str, frozenset], float]:
    """(sample name, labels) -> value of one scrape that must succeed."""
    response = client.get("/metrics", **extra)
    assert response.status_code == 200, response.content
    assert response["Content-Type"].startswith("text/plain")
    samples = {}
    for family in text_string_to_metric_families(response.content.decode()):
        for sample in family.samples:
            samples[(sample.name, frozenset(sample.labels.items()))] = sample.value
    return samples


def value(samples: dict, name: str, **labels: str) -> float:
    return samples[(name, frozenset(labels.items()))]


# --- the figures -----------------------------------------------------------------------------------


@pytest.mark.django_db
def test_jobs_by_state_and_pending_reason(client):
    for reason in (PendingReason.RESOURCES, PendingReason.RESOURCES, PendingReason.PRIORITY):
        JobFactory(state=JobState.PENDING, pending_reason=reason)
    JobFactory.create_batch(2, state=JobState.RUNNING)
    JobFactory(state=JobState.COMPLETED)
    JobFactory(state=JobState.FAILED, pending_reason=PendingReason.RESOURCES)  # not pending: not counted

    samples = scrape(client)

    assert value(samples, "attune_jobs", state="PENDING") == 3
    assert value(samples, "attune_jobs", state="RUNNING") == 2
    assert value(samples, "attune_jobs", state="COMPLETED") == 1
    assert value(samples, "attune_jobs", state="CANCELLED") == 0  # every state, zero when none
    assert value(samples, "attune_jobs_pending", reason="Resources") == 2
    assert value(samples, "attune_jobs_pending", reason="Priority") == 1
    assert value(samples, "attune_jobs_pending", reason="None") == 0


@pytest.mark.django_db
def test_queue_wait_of_pending_jobs_and_of_jobs_started_in_the_last_hour(client):
    now = timezone.now()
    JobFactory(state=JobState.PENDING, submitted_at=now - timedelta(minutes=2))
    JobFactory(state=JobState.PENDING, submitted_at=now - timedelta(hours=3))
    # Waited 20 min before starting 10 min ago; one that started yesterday is out of the window.
    JobFactory(
        state=JobState.RUNNING,
        submitted_at=now - timedelta(minutes=30),
        started_at=now - timedelta(minutes=10),
    )
    JobFactory(
        state=JobState.RUNNING, submitted_at=now - timedelta(days=2), started_at=now - timedelta(days=1)
    )

    samples = scrape(client)

    def wait(le: str) -> float:
        return value(samples, "attune_queue_wait_seconds_bucket", le=le)

    assert (wait("60.0"), wait("300.0"), wait("7200.0"), wait("14400.0"), wait("+Inf")) == (0, 1, 1, 2, 2)
    assert value(samples, "attune_queue_wait_seconds_gcount") == 2
    assert value(samples, "attune_queue_wait_seconds_gsum") == pytest.approx(120 + 3 * 3600, abs=30)
    assert value(samples, "attune_queue_oldest_wait_seconds") == pytest.approx(3 * 3600, abs=30)
    assert value(samples, "attune_job_start_wait_seconds_bucket", le="900.0") == 0
    assert value(samples, "attune_job_start_wait_seconds_bucket", le="1800.0") == 1
    assert value(samples, "attune_job_start_wait_seconds_gsum") == pytest.approx(20 * 60)
    assert value(samples, "attune_job_start_wait_seconds_gcount") == 1


@pytest.mark.django_db
def test_allocated_counts_active_leases_only_and_measured_reads_the_latest_fresh_samples(client):
    now = timezone.now()
    server = ServerFactory(num_gpus=8, num_cpus=24, mem_gb=500)
    ServerFactory(num_gpus=4, num_cpus=12, mem_gb=250)
    gpus = list(server.gpus.order_by("index"))
    active = AllocationFactory(server=server, num_cpus=9, mem_gb=100)
    hold_gpus(active, *gpus[:3])
    ended = AllocationFactory(
        server=server, num_cpus=6, mem_gb=50, started_at=now - timedelta(hours=1), ended_at=now
    )
    hold_gpus(ended, gpus[3])
    AllocationGpu.objects.filter(allocation=ended).update(released_at=now)
    # Latest reading per server and per GPU, and only if fresh (the other server's is 10 min old).
    UsageSample.objects.create(
        server=server, sampled_at=now - timedelta(seconds=20), cpu_util_pct=90, mem_used_gb=1
    )
    UsageSample.objects.create(
        server=server, sampled_at=now - timedelta(seconds=2), cpu_util_pct=50, mem_used_gb=40
    )
    other = ServerFactory(num_gpus=2, num_cpus=8, mem_gb=64)
    UsageSample.objects.create(
        server=other, sampled_at=now - timedelta(minutes=10), cpu_util_pct=100, mem_used_gb=60
    )
    GpuUsageSample.objects.create(
        gpu=gpus[0], sampled_at=now - timedelta(seconds=2), util_pct=100, mem_used_mb=1024
    )
    GpuUsageSample.objects.create(
        gpu=gpus[1], sampled_at=now - timedelta(seconds=20), util_pct=0, mem_used_mb=0
    )
    GpuUsageSample.objects.create(
        gpu=gpus[1], sampled_at=now - timedelta(seconds=2), util_pct=50, mem_used_mb=512
    )

    samples = scrape(client)

    assert value(samples, "attune_gpus_capacity") == 8 + 4 + 2
    assert value(samples, "attune_gpus_allocated") == 3
    assert value(samples, "attune_cpu_cores_allocated") == 9
    assert value(samples, "attune_memory_allocated_bytes") == 100 * GIB
    assert value(samples, "attune_memory_capacity_bytes") == (500 + 250 + 64) * GIB
    assert value(samples, "attune_gpus_busy_measured") == pytest.approx(1.5)
    assert value(samples, "attune_gpus_sampled") == 2
    assert value(samples, "attune_gpu_memory_used_measured_bytes") == 1536 * 1024**2
    assert value(samples, "attune_cpu_cores_busy_measured") == pytest.approx(12)  # 50 % of 24 cores
    assert value(samples, "attune_memory_used_measured_bytes") == pytest.approx(40 * GIB)
    assert value(samples, "attune_nodes_sampled") == 1


@pytest.mark.django_db
def test_round_durations_fill_cumulative_buckets_and_decisions_keep_counting(client):
    SchedulingRound.objects.create(
        policy="fifo",
        allocator="tune",
        duration_ms=30,
        num_placed=2,
        num_pending=1,
        num_preempted=1,
        num_resized=2,
    )
    samples = scrape(client)
    assert value(samples, "attune_scheduling_round_duration_seconds_bucket", le="0.025") == 0
    assert value(samples, "attune_scheduling_round_duration_seconds_bucket", le="0.05") == 1
    assert value(samples, "attune_scheduling_round_duration_seconds_count") == 1

    # A second scrape adds only the new round to the cached totals.
    last = SchedulingRound.objects.create(
        policy="fifo", allocator="tune", duration_ms=700, num_placed=1, num_infeasible=1
    )
    job, other = JobFactory(), JobFactory()
    RoundDecision.objects.create(round=last, job=job, position=0, outcome="placed", reason="fits")
    RoundDecision.objects.create(round=last, job=other, position=1, outcome="infeasible", reason="too_big")
    samples = scrape(client)

    def bucket(le: str) -> float:
        return value(samples, "attune_scheduling_round_duration_seconds_bucket", le=le)

    assert (bucket("0.05"), bucket("0.5"), bucket("1.0"), bucket("+Inf")) == (1, 1, 2, 2)
    assert value(samples, "attune_scheduling_round_duration_seconds_sum") == pytest.approx(0.73)
    assert value(samples, "attune_scheduling_decisions_total", outcome="placed") == 3
    assert value(samples, "attune_scheduling_decisions_total", outcome="pending") == 1
    assert value(samples, "attune_scheduling_decisions_total", outcome="infeasible") == 1
    assert value(samples, "attune_scheduling_preemptions_total") == 1
    assert value(samples, "attune_scheduling_resizes_total") == 2
    assert value(samples, "attune_scheduling_last_round_decisions", outcome="placed", reason="fits") == 1
    assert (
        value(samples, "attune_scheduling_last_round_decisions", outcome="infeasible", reason="too_big") == 1
    )
    assert value(samples, "attune_scheduling_last_round_timestamp_seconds") == last.started_at.timestamp()

    # Pruned decisions do not lower the counters: they come from the rounds, which stay.
    RoundDecision.objects.all().delete()
    assert value(scrape(client), "attune_scheduling_decisions_total", outcome="placed") == 3


@pytest.mark.django_db
def test_nodes_by_state_and_last_sync_age(client):
    now = timezone.now()
    ServerFactory(name="gpu01", state=NodeState.IDLE, last_heartbeat_at=now - timedelta(seconds=4))
    ServerFactory(name="gpu02", state=NodeState.DOWN, last_heartbeat_at=now - timedelta(minutes=5))
    ServerFactory(name="gpu03", state=NodeState.DOWN, last_heartbeat_at=None)

    samples = scrape(client)

    assert value(samples, "attune_nodes", state="IDLE") == 1
    assert value(samples, "attune_nodes", state="DOWN") == 2
    assert value(samples, "attune_nodes", state="DRAINED") == 0
    assert value(samples, "attune_node_last_sync_age_seconds", node="gpu01") == pytest.approx(4, abs=5)
    assert value(samples, "attune_node_last_sync_age_seconds", node="gpu02") == pytest.approx(300, abs=5)
    assert ("attune_node_last_sync_age_seconds", frozenset({("node", "gpu03")})) not in samples


@pytest.mark.django_db
def test_reports_ingested_count_settled_rows_and_never_fall_when_rows_are_pruned(client):
    now = timezone.now()
    allocation = AllocationFactory()

    def report(seq: int, kind: str, ago: timedelta) -> AgentReport:
        return AgentReport.objects.create(
            allocation=allocation,
            lease_id=allocation.lease_id,
            seq=seq,
            kind=kind,
            at=now - ago,
            batch_id=uuid.uuid4(),
            received_at=now - ago,
        )

    report(1, "started", timedelta(minutes=10))
    report(2, "progress", timedelta(minutes=9))
    report(3, "progress", timedelta(minutes=5))
    report(4, "progress", REPORTS_SETTLE / 4)  # too recent: its batch may not have committed yet

    samples = scrape(client)
    assert value(samples, "attune_agent_reports_total", kind="started") == 1
    assert value(samples, "attune_agent_reports_total", kind="progress") == 2
    assert value(samples, "attune_agent_reports_total", kind="exited") == 0

    AgentReport.objects.filter(seq__lte=2).delete()  # the retention prunes old rows
    assert value(scrape(client), "attune_agent_reports_total", kind="progress") == 2
    # The applier's backlog: reports stored and not applied yet.
    assert value(samples, "attune_agent_reports_pending") == 0
    AgentReportPending.objects.create(report=AgentReport.objects.get(seq=3), job_id=allocation.job_id)
    assert value(scrape(client), "attune_agent_reports_pending") == 1
    # Ended jobs whose follow-ups wait for the applier (services/job_end.py).
    assert value(samples, "attune_job_ends_pending") == 0
    JobEndPending.objects.create(job_id=allocation.job_id, state=JobState.COMPLETED)
    assert value(scrape(client), "attune_job_ends_pending") == 1


@pytest.mark.django_db
def test_admission_forecast_error_over_the_last_day(client):
    now = timezone.now()

    def predicted(job, *, start_error_s: float | None = None, finish_error_s: float | None = None) -> None:
        AdmissionPrediction.objects.create(
            job=job,
            policy="fifo",
            allocator="tune",
            predicted_start_at=None
            if start_error_s is None
            else job.started_at - timedelta(seconds=start_error_s),
            predicted_finish_at=None
            if finish_error_s is None
            else job.finished_at - timedelta(seconds=finish_error_s),
        )

    started = now - timedelta(hours=1)
    predicted(JobFactory(state=JobState.RUNNING, started_at=started), start_error_s=600)  # 10 min late
    predicted(JobFactory(state=JobState.RUNNING, started_at=started), start_error_s=-300)  # 5 min early
    predicted(
        JobFactory(
            state=JobState.COMPLETED, started_at=now - timedelta(days=3), finished_at=now - timedelta(hours=2)
        ),
        finish_error_s=1200,
    )
    # Out: started three days ago; and a failure says nothing about the predicted finish.
    predicted(JobFactory(state=JobState.RUNNING, started_at=now - timedelta(days=3)), start_error_s=99999)
    predicted(
        JobFactory(
            state=JobState.FAILED, started_at=now - timedelta(days=2), finished_at=now - timedelta(hours=1)
        ),
        finish_error_s=99999,
    )

    samples = scrape(client)

    assert value(samples, "attune_admission_forecast_jobs", event="start") == 2
    assert value(samples, "attune_admission_forecast_error_seconds", event="start", quantile="0.5") == 450
    assert value(samples, "attune_admission_forecast_error_seconds", event="start", quantile="0.9") == 570
    assert value(samples, "attune_admission_forecast_bias_seconds", event="start") == 150
    assert value(samples, "attune_admission_forecast_jobs", event="finish") == 1
    assert value(samples, "attune_admission_forecast_error_seconds", event="finish", quantile="0.5") == 1200


@pytest.mark.django_db
def test_a_scrape_costs_the_same_queries_however_many_rows(client):
    def grow(n: int) -> None:
        for _ in range(n):
            server = ServerFactory()
            UsageSample.objects.create(
                server=server, sampled_at=timezone.now(), cpu_util_pct=10, mem_used_gb=1
            )
            sround = SchedulingRound.objects.create(policy="fifo", allocator="tune", duration_ms=5)
            allocation = AllocationFactory(server=server)
            RoundDecision.objects.create(
                round=sround, job=allocation.job, position=0, outcome="placed", reason="fits"
            )
            hold_gpus(allocation, *server.gpus.all()[:2])
            JobFactory.create_batch(4, state=JobState.PENDING)

    def queries() -> list[str]:
        with CaptureQueriesContext(connection) as captured:
            scrape(client)
        return [q["sql"] for q in captured.captured_queries]

    grow(1)
    first = queries()  # counts every round so far; later scrapes add the new rounds only
    few = queries()
    grow(5)
    assert len(queries()) == len(first)  # new rounds: one query for them
    assert len(queries()) == len(few) == len(first) - 1 <= 15


@pytest.mark.django_db
def test_openmetrics_when_the_scraper_asks_for_it(client):
    response = client.get("/metrics", HTTP_ACCEPT="application/openmetrics-text; version=1.0.0")
    assert response.status_code == 200
    assert response["Content-Type"].startswith("application/openmetrics-text")
    families = {family.name: family.type for family in openmetrics_families(response.content.decode())}
    assert families["attune_queue_wait_seconds"] == "gaugehistogram"
    assert families["attune_agent_reports"] == "counter"


# --- access ----------------------------------------------------------------------------------------


@pytest.mark.django_db
def test_without_settings_only_loopback_may_scrape(client):
    assert client.get("/metrics").status_code == 200  # the test client's REMOTE_ADDR is 127.0.0.1
    assert client.get("/metrics", REMOTE_ADDR="::1").status_code == 200
    assert client.get("/metrics", REMOTE_ADDR="::ffff:127.0.0.1").status_code == 200
    response = client.get("/metrics", REMOTE_ADDR="203.0.113.5")
    assert response.status_code == 403
    assert response["Content-Type"].startswith("text/plain") and b"attune_" not in response.content


@pytest.mark.django_db
def test_a_token_is_required_when_set_and_compared_exactly(client, settings):
    settings.ATTUNE_METRICS_TOKEN = "s3cret-token"
    outside = {"REMOTE_ADDR": "203.0.113.5"}

    response = client.get("/metrics", **outside)
    assert response.status_code == 401 and response["WWW-Authenticate"] == 'Bearer realm="metrics"'
    assert b"attune_" not in response.content
    for wrong in ("Bearer s3cret-toke", "Bearer s3cret-token-and-more", "Token s3cret-token", "s3cret-token"):
        assert client.get("/metrics", HTTP_AUTHORIZATION=wrong, **outside).status_code == 401, wrong
    # With a token set, loopback is no longer let in without it.
    assert client.get("/metrics").status_code == 401
    assert "attune_jobs" in {
        name for name, _ in scrape(client, HTTP_AUTHORIZATION="Bearer s3cret-token", **outside)
    }


@pytest.mark.django_db
def test_an_allow_listed_address_needs_no_token(client, settings):
    settings.ATTUNE_METRICS_ALLOWED_IPS = ["10.0.0.0/8", "2001:db8::1"]
    assert client.get("/metrics", REMOTE_ADDR="10.20.30.40").status_code == 200
    assert client.get("/metrics", REMOTE_ADDR="2001:db8::1").status_code == 200
    assert client.get("/metrics", REMOTE_ADDR="203.0.113.5").status_code == 403
    assert client.get("/metrics", REMOTE_ADDR="127.0.0.1").status_code == 403  # a list replaces loopback
    # X-Forwarded-For is the client's word, never believed.
    assert (
        client.get("/metrics", REMOTE_ADDR="203.0.113.5", HTTP_X_FORWARDED_FOR="10.0.0.1").status_code == 403
    )
    settings.ATTUNE_METRICS_TOKEN = "tok"
    assert client.get("/metrics", REMOTE_ADDR="203.0.113.5").status_code == 401
    assert client.get("/metrics", REMOTE_ADDR="10.0.0.9").status_code == 200


def test_a_malformed_allow_list_is_a_configuration_error(settings):
    settings.ATTUNE_METRICS_ALLOWED_IPS = ["10.0.0.0/33"]
    with pytest.raises(ImproperlyConfigured):
        metrics_access()


@pytest.mark.django_db
def test_only_get(client):
    assert client.post("/metrics").status_code == 405


# --- the call counter ------------------------------------------------------------------------------


@pytest.mark.django_db
def test_agent_call_counter_counts_by_kind_and_is_exposed(client):
    assert agent_calls() == {}
    for _ in range(3):
        count_agent_call("sync")
    count_agent_call("register")
    assert agent_calls() == {"register": 1, "sync": 3}
    samples = scrape(client)
    assert value(samples, "attune_agent_calls_total", kind="sync") == 3
    assert value(samples, "attune_agent_calls_total", kind="register") == 1
    for bad in ("", "Sync", "sync calls", "x" * 40):
        with pytest.raises(ValueError):
            count_agent_call(bad)
    assert agent_calls() == {"register": 1, "sync": 3}


@pytest.mark.django_db
def test_an_agent_call_costs_one_redis_command_once_its_kind_is_known(monkeypatch):
    """Every agent sync counts itself: one INCR, not RedisCache.incr()'s EXISTS + INCR."""
    from django.core.cache import cache, caches
    from django.core.cache.backends.redis import RedisCache

    from cluster_app.agent_call_counter import _counter_key

    if not isinstance(caches["default"], RedisCache):
        pytest.skip("the cache is not Redis (CACHE_URL): the local-memory cache has no round trips")
    import redis

    commands: list[str] = []
    execute = redis.Redis.execute_command

    def counted(self, *args, **options):
        commands.append(str(args[0]))
        return execute(self, *args, **options)

    count_agent_call("sync")  # the first call also registers the kind
    monkeypatch.setattr(redis.Redis, "execute_command", counted)
    count_agent_call("sync")
    count_agent_call("sync")
    assert commands == ["INCRBY", "INCRBY"]  # redis-py sends INCR as INCRBY 1
    monkeypatch.undo()
    assert agent_calls() == {"sync": 3}
    assert cache.get(_counter_key("sync")) == 3  # what INCR wrote, read through the cache


# --- the Grafana dashboard -------------------------------------------------------------------------

SUFFIXES = {"histogram": ("_bucket", "_sum", "_count"), "counter": ("",), "gauge": ("",)}


@pytest.mark.django_db
def test_every_dashboard_query_uses_an_exported_metric(client):
    text = client.get("/metrics").content.decode()
    exported = set()
    for name, kind in re.findall(r"^# TYPE (\S+) (\S+)$", text, flags=re.MULTILINE):
        exported |= {name + suffix for suffix in SUFFIXES.get(kind, ("",))}
    dashboard = json.loads(DASHBOARD.read_text())
    exprs = [target["expr"] for panel in dashboard["panels"] for target in panel.get("targets", [])]
    assert len(exprs) >= 12
    used = {name for expr in exprs for name in re.findall(r"\battune_[a-z0-9_]+", expr)}
    assert used and used <= exported, sorted(used - exported)
    assert all("${DS_PROMETHEUS}" in json.dumps(panel["datasource"]) for panel in dashboard["panels"])
