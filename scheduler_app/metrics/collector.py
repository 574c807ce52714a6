"""The Prometheus collector: every figure is read from the database (and the cache) when scraped."""

from __future__ import annotations

import math
import time
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from datetime import datetime, timedelta

from django.db.models import (
    Count,
    DateTimeField,
    DurationField,
    ExpressionWrapper,
    F,
    Max,
    OuterRef,
    Q,
    QuerySet,
    Subquery,
    Sum,
    Value,
)
from django.db.models.expressions import Combinable
from django.utils import timezone
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeHistogramMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector, CollectorRegistry
from prometheus_client.utils import floatToGoString

from cluster_app.agent_call_counter import agent_calls
from cluster_app.conf import node_conf
from cluster_app.models import Gpu, GpuUsageSample, NodeState, Server, UsageSample
from cluster_app.selectors import cluster_capacity
from scheduler_app.metrics.tallies import DECISION_FIELDS, report_totals, round_totals
from scheduler_app.models import (
    AdmissionPrediction,
    AgentReportKind,
    Allocation,
    AllocationGpu,
    Job,
    JobState,
    PendingReason,
    RoundDecision,
    SchedulingRound,
)
from scheduler_app.selectors import job_counts_by_state
from scheduler_app.selectors.agent_reports import applier_backlog

# A round takes milliseconds on a small cluster and seconds on a thousand nodes (docs/performance.md).
ROUND_DURATION_BUCKETS_S: tuple[float, ...] = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
# Waits run from a round (a minute) to days on a busy cluster.
WAIT_BUCKETS_S: tuple[float, ...] = (60, 300, 900, 1800, 3600, 7200, 14400, 28800, 86400, 259200, 604800)
START_WAIT_WINDOW = timedelta(hours=1)
ADMISSION_WINDOW = timedelta(days=1)
ADMISSION_QUANTILES = (0.5, 0.9)
BYTES_PER_GB = 1024**3  # "GB" in Attune is GiB (agent/host.py)
BYTES_PER_MB = 1024**2


def _le(bound: float) -> str:
    return floatToGoString(bound)


def _quantile(sorted_values: Sequence[float], q: float) -> float:
    """Linear-interpolated quantile (0..1) of non-empty sorted values."""
    pos = q * (len(sorted_values) - 1)
    lo, hi = math.floor(pos), math.ceil(pos)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)


def _wait_histogram(
    jobs: QuerySet[Job], *, until: Combinable, buckets_s: Sequence[float]
) -> tuple[list[tuple[str, float]], float, float]:
    """(cumulative buckets with +Inf, summed seconds, longest seconds) of `until - submitted_at` over
    `jobs`, in one aggregate query."""
    waits = jobs.annotate(wait=ExpressionWrapper(until - F("submitted_at"), output_field=DurationField()))
    sums = waits.aggregate(
        n=Count("id"),
        total=Sum("wait"),
        longest=Max("wait"),
        **{f"le{i}": Count("id", filter=Q(wait__lte=timedelta(seconds=b))) for i, b in enumerate(buckets_s)},
    )
    buckets = [(_le(b), float(sums[f"le{i}"])) for i, b in enumerate(buckets_s)]
    buckets.append(("+Inf", float(sums["n"])))
    total = sums["total"].total_seconds() if sums["total"] else 0.0
    longest = sums["longest"].total_seconds() if sums["longest"] else 0.0
    return buckets, total, longest


class AttuneCollector(Collector):
    """Yields every attune_* metric family; a constant number of queries per scrape (docs/metrics.md)."""

    def __init__(self, *, now: datetime | None = None) -> None:
        self._now = now

    def collect(self) -> Iterator[Metric]:
        t0 = time.perf_counter()
        now = self._now or timezone.now()
        yield from self._rounds()
        yield from self._jobs(now)
        yield from self._resources(now)
        yield from self._nodes(now)
        yield from self._agents(now)
        yield from self._admission(now)
        yield GaugeMetricFamily(
            "attune_metrics_scrape_duration_seconds",
            "Time this scrape spent reading the figures above.",
            value=time.perf_counter() - t0,
        )

    def _rounds(self) -> Iterable[Metric]:
        last = SchedulingRound.objects.order_by("-id").values("id", "started_at").first()
        totals = round_totals(latest_id=last["id"] if last else None, buckets_s=ROUND_DURATION_BUCKETS_S)
        buckets = [(_le(b), totals.get(f"le:{b:g}", 0.0)) for b in ROUND_DURATION_BUCKETS_S]
        buckets.append(("+Inf", totals.get("count", 0.0)))
        yield HistogramMetricFamily(
            "attune_scheduling_round_duration_seconds",
            "Wall time of scheduling rounds, over every round stored (cumulative: use rate()).",
            buckets=buckets,
            sum_value=totals.get("sum_s", 0.0),
        )
        decisions = CounterMetricFamily(
            "attune_scheduling_decisions",
            "Decisions of every round by outcome: placed, pending (may fit later), infeasible (never fits).",
            labels=["outcome"],
        )
        for outcome in DECISION_FIELDS:
            decisions.add_metric([outcome], totals.get(outcome, 0.0))
        yield decisions
        yield CounterMetricFamily(
            "attune_scheduling_preemptions",
            "Running jobs whose lease a round ended: moved elsewhere or sent back to the queue.",
            value=totals.get("preempted", 0.0),
        )
        yield CounterMetricFamily(
            "attune_scheduling_resizes",
            "Running jobs whose cores or memory a round changed in place, without a restart.",
            value=totals.get("resized", 0.0),
        )
        # Declared even before the first round (no sample then), like every family here.
        started = GaugeMetricFamily(
            "attune_scheduling_last_round_timestamp_seconds",
            "Start of the latest scheduling round, Unix time (alert when it stops advancing).",
        )
        if last is not None:
            started.add_metric([], last["started_at"].timestamp())
        yield started
        latest = GaugeMetricFamily(
            "attune_scheduling_last_round_decisions",
            "Decisions of the latest round by outcome and stable reason code.",
            labels=["outcome", "reason"],
        )
        if last is not None:
            rows = (
                RoundDecision.objects.filter(round_id=last["id"])
                .order_by()
                .values_list("outcome", "reason")
                .annotate(n=Count("id"))
            )
            for outcome, reason, n in sorted(rows):
                latest.add_metric([outcome, reason], n)
        yield latest

    def _jobs(self, now: datetime) -> Iterable[Metric]:
        by_state = GaugeMetricFamily("attune_jobs", "Jobs by state (Slurm's words).", labels=["state"])
        for state, n in job_counts_by_state().items():
            by_state.add_metric([state], n)
        yield by_state
        pending = Job.objects.filter(state=JobState.PENDING)
        # The reason a round (or a hold, a dependency) stored on the job: what squeue and the queue
        # page show, so these counts agree with them.
        reasons = dict(pending.order_by().values_list("pending_reason").annotate(n=Count("id")))
        by_reason = GaugeMetricFamily(
            "attune_jobs_pending", "Pending jobs by pending reason (squeue's words).", labels=["reason"]
        )
        for reason in PendingReason.values:
            by_reason.add_metric([reason], reasons.get(reason, 0))
        yield by_reason

        buckets, total, longest = _wait_histogram(
            pending, until=Value(now, output_field=DateTimeField()), buckets_s=WAIT_BUCKETS_S
        )
        yield GaugeHistogramMetricFamily(
            "attune_queue_wait_seconds",
            "How long each pending job (held ones too) has waited since submission, now.",
            buckets=buckets,
            gsum_value=total,
        )
        yield GaugeMetricFamily(
            "attune_queue_oldest_wait_seconds", "Wait of the longest-waiting pending job.", value=longest
        )
        started = Job.objects.filter(started_at__gte=now - START_WAIT_WINDOW, started_at__lte=now)
        buckets, total, _ = _wait_histogram(started, until=F("started_at"), buckets_s=WAIT_BUCKETS_S)
        yield GaugeHistogramMetricFamily(
            "attune_job_start_wait_seconds",
            "Submission to first start of the jobs that first started in the last hour.",
            buckets=buckets,
            gsum_value=total,
        )

    def _resources(self, now: datetime) -> Iterable[Metric]:
        capacity = cluster_capacity()
        active = Allocation.objects.filter(ended_at__isnull=True).aggregate(
            cpus=Sum("num_cpus"), mem_gb=Sum("mem_gb")
        )
        gpus_held = AllocationGpu.objects.filter(released_at__isnull=True).count()
        # A reading older than this is a silent agent's, not the server's current use.
        since = now - timedelta(seconds=node_conf().not_responding_after_s)
        # One correlated lookup per server and per GPU on their (_, sampled_at) indexes: the latest
        # reading of each, however many samples the retention keeps.
        host = UsageSample.objects.filter(server=OuterRef("pk"), sampled_at__gte=since).order_by(
            "-sampled_at"
        )
        measured = Server.objects.annotate(
            cpu_pct=Subquery(host.values("cpu_util_pct")[:1]),
            mem_used_gb=Subquery(host.values("mem_used_gb")[:1]),
        ).aggregate(
            cores=Sum(F("cpu_pct") * F("num_cpus") / 100.0),
            mem_gb_sum=Sum("mem_used_gb"),
            sampled=Count("cpu_pct"),
        )
        gpu = GpuUsageSample.objects.filter(gpu=OuterRef("pk"), sampled_at__gte=since).order_by("-sampled_at")
        measured_gpus = (
            Gpu.objects.filter(retired_at__isnull=True)
            .annotate(
                util=Subquery(gpu.values("util_pct")[:1]), mem_mb=Subquery(gpu.values("mem_used_mb")[:1])
            )
            .aggregate(util_sum=Sum("util"), mem_mb_sum=Sum("mem_mb"), sampled=Count("util"))
        )
        figures = [
            ("attune_gpus_capacity", "GPUs of every server (retired GPUs left out).", capacity["gpus"]),
            ("attune_gpus_allocated", "GPUs held by active leases.", gpus_held),
            (
                "attune_gpus_busy_measured",
                "GPUs busy by the latest readings: the sum of each GPU's utilisation / 100.",
                (measured_gpus["util_sum"] or 0.0) / 100.0,
            ),
            (
                "attune_gpus_sampled",
                "GPUs with a fresh reading (newer than ATTUNE_NODE_NOT_RESPONDING_AFTER_S).",
                measured_gpus["sampled"],
            ),
            (
                "attune_gpu_memory_used_measured_bytes",
                "GPU memory in use by the latest readings.",
                (measured_gpus["mem_mb_sum"] or 0.0) * BYTES_PER_MB,
            ),
            (
                "attune_cpu_cores_capacity",
                "CPU cores the scheduler may allocate, all servers.",
                capacity["cpus"],
            ),
            ("attune_cpu_cores_allocated", "CPU cores held by active leases.", active["cpus"] or 0),
            (
                "attune_cpu_cores_busy_measured",
                "CPU cores busy by the latest readings: each server's CPU % x its cores.",
                measured["cores"] or 0.0,
            ),
            (
                "attune_memory_capacity_bytes",
                "Memory the scheduler may allocate, all servers.",
                capacity["mem_gb"] * BYTES_PER_GB,
            ),
            (
                "attune_memory_allocated_bytes",
                "Memory held by active leases.",
                (active["mem_gb"] or 0.0) * BYTES_PER_GB,
            ),
            (
                "attune_memory_used_measured_bytes",
                "Memory in use by the latest readings.",
                (measured["mem_gb_sum"] or 0.0) * BYTES_PER_GB,
            ),
            ("attune_nodes_sampled", "Servers with a fresh reading, as above.", measured["sampled"]),
        ]
        for name, documentation, value in figures:
            yield GaugeMetricFamily(name, documentation, value=float(value))

    def _nodes(self, now: datetime) -> Iterable[Metric]:
        servers = list(Server.objects.order_by("name").values_list("name", "state", "heartbeat__at"))
        counts = Counter(state for _, state, _ in servers)
        by_state = GaugeMetricFamily(
            "attune_nodes", "Servers by node state (Slurm's words).", labels=["state"]
        )
        for state in NodeState.values:
            by_state.add_metric([state], counts.get(state, 0))
        yield by_state
        age = GaugeMetricFamily(
            "attune_node_last_sync_age_seconds",
            "Seconds since each server's agent last called in; servers never heard from are left out.",
            labels=["node"],
        )
        for name, _, last in servers:
            if last is not None:
                age.add_metric([name], max(0.0, (now - last).total_seconds()))
        yield age

    def _agents(self, now: datetime) -> Iterable[Metric]:
        calls = CounterMetricFamily(
            "attune_agent_calls",
            "Calls from node agents, by kind (cluster_app.agent_call_counter).",
            labels=["kind"],
        )
        for kind, n in agent_calls().items():
            calls.add_metric([kind], n)
        yield calls
        totals = report_totals(now=now)
        reports = CounterMetricFamily(
            "attune_agent_reports",
            "Agent reports ingested (retried duplicates left out), by kind; counted a minute after arrival.",
            labels=["kind"],
        )
        for kind in sorted(set(AgentReportKind.values) | set(totals)):
            reports.add_metric([kind], totals.get(kind, 0.0))
        yield reports
        # The applier's backlog: seconds' worth of progress and of job ends normally; growing, the worker
        # is not running it (docs/agent-protocol.md section 2, docs/architecture.md).
        reports_pending, job_ends_pending = applier_backlog()
        yield GaugeMetricFamily(
            "attune_agent_reports_pending",
            "Agent reports stored and acknowledged but not yet applied to their jobs.",
            value=reports_pending,
        )
        yield GaugeMetricFamily(
            "attune_job_ends_pending",
            "Ended jobs whose follow-ups (learning, admission outcome, notification) have not run yet.",
            value=job_ends_pending,
        )

    def _admission(self, now: datetime) -> Iterable[Metric]:
        since = now - ADMISSION_WINDOW
        # Through the job's own started_at and finished_at, which are indexed and set when it happens
        # (the prediction's actual_* are only copied when the job ends). Finish: COMPLETED jobs only,
        # as on the dashboards: a failure or a cancellation says nothing about the forecast.
        rows = AdmissionPrediction.objects.filter(
            Q(job__started_at__gte=since) | Q(job__finished_at__gte=since, job__state=JobState.COMPLETED)
        ).values_list(
            "predicted_start_at", "predicted_finish_at", "job__started_at", "job__finished_at", "job__state"
        )
        errors: dict[str, list[float]] = {"start": [], "finish": []}
        for predicted_start, predicted_finish, started, finished, state in rows:
            if predicted_start is not None and started is not None and started >= since:
                errors["start"].append((started - predicted_start).total_seconds())
            completed = state == JobState.COMPLETED and finished is not None and finished >= since
            if completed and predicted_finish is not None:
                errors["finish"].append((finished - predicted_finish).total_seconds())
        error = GaugeMetricFamily(
            "attune_admission_forecast_error_seconds",
            "Absolute error of the start and finish predicted at submission, jobs that started or "
            "completed in the last 24 h: quantiles.",
            labels=["event", "quantile"],
        )
        bias = GaugeMetricFamily(
            "attune_admission_forecast_bias_seconds",
            "Mean of actual minus predicted (positive: later than predicted), same jobs.",
            labels=["event"],
        )
        jobs = GaugeMetricFamily(
            "attune_admission_forecast_jobs", "Jobs compared in the two metrics above.", labels=["event"]
        )
        for event, values in errors.items():
            jobs.add_metric([event], len(values))
            if not values:
                continue
            absolute = sorted(abs(v) for v in values)
            for q in ADMISSION_QUANTILES:
                error.add_metric([event, f"{q:g}"], _quantile(absolute, q))
            bias.add_metric([event], sum(values) / len(values))
        yield from (error, bias, jobs)


def metrics_registry(*, now: datetime | None = None) -> CollectorRegistry:
    """A registry holding only Attune's collector, built per scrape (no process metrics: under
    gunicorn they would describe whichever worker answered)."""
    # auto_describe off: registering must not run collect(), the database reads are for the scrape.
    registry = CollectorRegistry(auto_describe=False)
    registry.register(AttuneCollector(now=now))
    return registry
