"""Leases (a job's GPUs, cores and memory on one server), their GPU holds and their agents' reports."""

import uuid

from django.db import models
from django.db.models import Q
from django.utils import timezone

from scheduler_app.models.jobs import Job
from scheduler_app.models.rounds import SchedulingRound

# No measured speed above this is believed or stored (services/report_apply.py; a CHECK constraint).
MAX_STORED_ITERS_PER_S = 1e9


class Allocation(models.Model):
    """A job's lease on one server: its GPUs (AllocationGpu), CPU cores and memory.

    A job spanning servers has one Allocation per server in the same round. The lease is active while
    `ended_at` is empty; its GPUs are released in the same transaction that ends it.
    """

    job = models.ForeignKey(Job, on_delete=models.PROTECT, related_name="allocations")
    round = models.ForeignKey(
        SchedulingRound, on_delete=models.SET_NULL, null=True, blank=True, related_name="allocations"
    )
    server = models.ForeignKey("cluster_app.Server", on_delete=models.PROTECT, related_name="allocations")
    lease_id = models.UUIDField(default=uuid.uuid4, unique=True, editable=False)
    # The GPUs held, as a count: the number of its AllocationGpu rows, fixed when the lease is made (a
    # lease keeps its GPUs until it ends). Stored so that accounting sums GPU-seconds over a year of
    # leases without joining every GPU row (sacct's AllocTRES, likewise, is kept on the job record).
    num_gpus = models.PositiveSmallIntegerField()
    num_cpus = models.PositiveSmallIntegerField()
    mem_gb = models.FloatField()
    speedup = models.FloatField(default=1.0, help_text="Expected speed relative to the proportional share")
    started_at = models.DateTimeField(default=timezone.now)
    ended_at = models.DateTimeField(null=True, blank=True)
    end_reason = models.CharField(max_length=32, blank=True)
    # When a sync answer first carried this lease's `start` (the service's clock): from then on an agent
    # may run it, so a later lease of the job waits for its exit or its fence (selectors/lease_starts.py).
    start_sent_at = models.DateTimeField(null=True, blank=True)
    # What the agent reported about the lease (times on the agent's clock).
    agent_started_at = models.DateTimeField(null=True, blank=True)
    accounted_until = models.DateTimeField(
        null=True, blank=True, help_text="Agent time up to which GPU-seconds were credited to the job"
    )
    iters_per_s = models.FloatField(null=True, blank=True, help_text="Last measured speed")
    exit_code = models.SmallIntegerField(null=True, blank=True)
    exited_at = models.DateTimeField(
        null=True, blank=True, help_text="When the agent reported the lease's process gone (its exit report)"
    )
    log_tail = models.TextField(blank=True, help_text="The last lines of the lease's output (capped)")
    rendezvous_port = models.PositiveIntegerField(
        null=True, blank=True, help_text="MASTER_PORT of a job spanning servers (same on every part)"
    )
    colocated_comm_jobs = models.PositiveSmallIntegerField(
        default=0, help_text="Other communicating jobs on the job's servers in the round that placed it"
    )
    startup_s = models.FloatField(
        null=True, blank=True, help_text="Measured start-up: seconds from the launch to the first progress"
    )
    lost_work_s = models.FloatField(
        null=True,
        blank=True,
        help_text="Seconds of this lease's run to be done again: set when a restart (move, preemption, "
        "node failure) ended it, the run since its last checkpoint",
    )

    class Meta:
        ordering = ["-started_at"]
        indexes = [
            models.Index(fields=["job", "started_at"]),
            models.Index(fields=["server", "ended_at"]),
            # Accounting reads the leases that ended in a window (and the active ones, indexed below).
            models.Index(fields=["ended_at"]),
            # Every round and poll reads the active leases; history grows without bound beside them.
            models.Index(fields=["server"], condition=Q(ended_at__isnull=True), name="allocation_active"),
        ]
        constraints = [
            models.CheckConstraint(condition=Q(num_cpus__gt=0), name="allocation_num_cpus_positive"),
            models.CheckConstraint(condition=Q(mem_gb__gt=0), name="allocation_mem_gb_positive"),
            models.CheckConstraint(
                condition=Q(ended_at__isnull=True) | Q(ended_at__gte=models.F("started_at")),
                name="allocation_ends_after_start",
            ),
            # What agents report (docs/agent-protocol.md section 4): a measured speed, an exit status.
            models.CheckConstraint(
                # A finite bound keeps out infinity and NaN too (PostgreSQL orders NaN above every
                # number), and renders on every database.
                condition=Q(iters_per_s__isnull=True)
                | Q(iters_per_s__gt=0, iters_per_s__lte=MAX_STORED_ITERS_PER_S),
                name="allocation_speed_positive",
            ),
            models.CheckConstraint(
                condition=Q(exit_code__isnull=True) | Q(exit_code__gte=0, exit_code__lte=255),
                name="allocation_exit_code_0_255",
            ),
        ]

    def __str__(self) -> str:
        return f"job {self.job_id} on {self.server_id} ({self.lease_id})"


class AllocationGpu(models.Model):
    """A GPU held by an allocation. The database refuses a GPU in two unreleased allocations."""

    allocation = models.ForeignKey(Allocation, on_delete=models.CASCADE, related_name="gpu_holds")
    gpu = models.ForeignKey("cluster_app.Gpu", on_delete=models.PROTECT, related_name="holds")
    released_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["allocation", "gpu"], name="allocation_gpu_once"),
            # The guarantee that no GPU is ever double-booked, enforced by the database itself.
            models.UniqueConstraint(
                fields=["gpu"], condition=Q(released_at__isnull=True), name="gpu_in_one_active_allocation"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.gpu_id} in {self.allocation_id}"


class AgentReportKind(models.TextChoices):
    STARTED = "started", "started"
    PROGRESS = "progress", "progress"
    LOG = "log", "log"
    EXITED = "exited", "exited"


class AgentReport(models.Model):
    """One report an agent sent about a lease; (lease_id, seq) makes a retried report a no-op.

    `batch_id` names the request that inserted the row (for whoever traces a report back to its sync;
    no query reads it, so it has no index: every report written is one index write fewer). The rows a
    request inserted for the first time are those its insert-or-ignore returns. A report not applied to
    its job and lease yet has an AgentReportPending row too.
    """

    allocation = models.ForeignKey(Allocation, on_delete=models.CASCADE, related_name="reports")
    lease_id = models.UUIDField()
    seq = models.BigIntegerField()
    kind = models.CharField(max_length=16, choices=AgentReportKind.choices)
    at = models.DateTimeField(help_text="When it happened, on the agent's clock")
    data = models.JSONField(default=dict, blank=True)
    batch_id = models.UUIDField()
    received_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["lease_id", "seq"]
        indexes = [models.Index(fields=["received_at"])]  # the metrics' tallies read by arrival
        constraints = [
            models.UniqueConstraint(fields=["lease_id", "seq"], name="agent_report_once_per_lease_seq"),
        ]

    def __str__(self) -> str:
        return f"{self.lease_id}#{self.seq} {self.kind}"


class AgentReportPending(models.Model):
    """A stored report not applied yet (services/report_ingest.py): the applier's work list, a few
    seconds' worth of progress, deleted as it is applied. A table of its own rather than a flag on
    AgentReport: that table holds days of reports, and whether the planner finds the few flagged rows
    by an index would depend on its statistics being fresh; updating the flag would rewrite every
    report's row and its index entries too. `job_id` is the report's lease's job (a lease's job never
    changes): the applier works job by job, with the job's row locked."""

    report = models.OneToOneField(AgentReport, on_delete=models.CASCADE, primary_key=True, related_name="+")
    job_id = models.BigIntegerField(db_index=True)

    def __str__(self) -> str:
        return f"pending {self.report_id} (job {self.job_id})"
