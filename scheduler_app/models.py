"""The work: teams, jobs and their history, allocations, scheduling rounds and simulation runs."""

import uuid
from datetime import datetime, timedelta

from django.conf import settings
from django.db import models
from django.db.models import Q
from django.utils import timezone


class Team(models.Model):
    """A group of users sharing a GPU quota (a Slurm account, a Kueue LocalQueue's tenant)."""

    name = models.CharField(max_length=100, unique=True)
    members = models.ManyToManyField(settings.AUTH_USER_MODEL, related_name="attune_teams", blank=True)
    gpu_quota = models.PositiveIntegerField(
        null=True, blank=True, help_text="Max GPUs at once; empty = no cap"
    )
    may_borrow = models.BooleanField(
        default=False,
        help_text="Beyond its quota, its jobs may use GPUs no job within quota wants; they give them "
        "back (preempted) as soon as one does (Kueue's borrowing)",
    )

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name


# No measured speed above this is believed or stored (services/report_apply.py; a CHECK constraint).
MAX_STORED_ITERS_PER_S = 1e9


class UnixAccount(models.Model):
    """The Unix account a user's jobs run as on the nodes, where it is not their username (staff set it).

    Without a row a job runs as its owner's username, resolved on each node through the system's user
    database (pwd/grp: local files, LDAP or sssd alike), as Slurm does.
    """

    user = models.OneToOneField(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="unix_account"
    )
    unix_user = models.CharField(max_length=32, help_text="Account name on the GPU servers (never root)")

    class Meta:
        constraints = [
            models.CheckConstraint(condition=~Q(unix_user="root"), name="unix_account_not_root"),
        ]

    def __str__(self) -> str:
        return f"{self.user} -> {self.unix_user}"


class JobState(models.TextChoices):
    """Slurm's job states."""

    PENDING = "PENDING", "pending"
    RUNNING = "RUNNING", "running"
    COMPLETED = "COMPLETED", "completed"
    FAILED = "FAILED", "failed"
    CANCELLED = "CANCELLED", "cancelled"
    PREEMPTED = "PREEMPTED", "preempted"
    TIMEOUT = "TIMEOUT", "timeout"
    NODE_FAIL = "NODE_FAIL", "node failure"
    OUT_OF_MEMORY = "OUT_OF_MEMORY", "out of memory"


TERMINAL_JOB_STATES = frozenset(
    {
        JobState.COMPLETED,
        JobState.FAILED,
        JobState.CANCELLED,
        JobState.TIMEOUT,
        JobState.OUT_OF_MEMORY,
    }
)


class PendingReason(models.TextChoices):
    """Why a pending job waits, in squeue's words."""

    NONE = "None", "none"
    PRIORITY = "Priority", "jobs ahead of it come first"
    RESOURCES = "Resources", "waiting for free resources"
    PROFILING = "Profiling", "its workload is being profiled"
    QOS_UNATTAINABLE = "QoSUnattainable", "its QoS target can no longer be met"
    QUOTA = "QuotaExceeded", "its team is at its GPU quota"
    HELD_USER = "JobHeldUser", "held by its owner: release it to queue it again"
    HELD_ADMIN = "JobHeldAdmin", "held by an administrator, who alone can release it"
    DEPENDENCY = "Dependency", "it waits for the jobs it depends on to complete"
    DEPENDENCY_NEVER_SATISFIED = (
        "DependencyNeverSatisfied",
        "a job it depends on ended without completing: cancel it or resubmit",
    )
    INFEASIBLE = "Infeasible", "it can never fit on this cluster"


class Job(models.Model):
    """A training job: its workload, what it asks for, its QoS target and where it stands."""

    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="jobs")
    team = models.ForeignKey(Team, on_delete=models.PROTECT, null=True, blank=True, related_name="jobs")
    name = models.CharField(max_length=200)
    workload = models.ForeignKey(
        "profiles_app.Workload", on_delete=models.PROTECT, null=True, blank=True, related_name="jobs"
    )
    command = models.TextField(blank=True, help_text="Own command to run, when not a catalog workload")
    script = models.TextField(blank=True, help_text="Own batch script, run by bash (its directives applied)")
    run_as = models.CharField(
        max_length=32, blank=True, help_text="Unix account an own command runs as (empty: catalog workload)"
    )
    work_dir = models.CharField(
        max_length=1024, blank=True, help_text="Working directory (--chdir); empty: the account's home"
    )
    output_path = models.CharField(
        max_length=1024, blank=True, help_text="stdout file pattern (--output: %j %a %x %u)"
    )
    error_path = models.CharField(
        max_length=1024, blank=True, help_text="stderr file pattern (--error); empty: with stdout"
    )
    num_gpus = models.PositiveSmallIntegerField()
    num_nodes = models.PositiveSmallIntegerField(
        null=True, blank=True, help_text="Exactly this many servers, GPUs split evenly (--nodes)"
    )
    cpus_per_gpu = models.FloatField(null=True, blank=True, help_text="Override: CPU cores per GPU")
    mem_gb_per_gpu = models.FloatField(null=True, blank=True, help_text="Override: memory GB per GPU")
    total_iters = models.BigIntegerField(
        null=True,
        blank=True,
        help_text="Work to do, in iterations; empty: an own command sized by its time limit",
    )
    qos_deadline_at = models.DateTimeField(null=True, blank=True)
    qos_max_latency_s = models.FloatField(
        null=True, blank=True, help_text="Max response latency (queueing + running) from submission"
    )
    qos_min_rate_iters_per_s = models.FloatField(
        null=True, blank=True, help_text="Minimum processing rate while running, iterations/s (GENIE)"
    )
    priority = models.SmallIntegerField(default=0)
    time_limit_s = models.PositiveIntegerField(null=True, blank=True)
    depends_on = models.ManyToManyField(
        "self",
        symmetrical=False,
        blank=True,
        related_name="dependents",
        help_text="Jobs that must complete before this one may start (Slurm's afterok)",
    )
    array_job = models.ForeignKey(
        "self",
        on_delete=models.PROTECT,
        null=True,
        blank=True,
        related_name="array_tasks",
        help_text="The array this job is a task of: its first task (Slurm's ArrayJobID)",
    )
    array_task_id = models.PositiveIntegerField(
        null=True, blank=True, help_text="This task's index (SLURM_ARRAY_TASK_ID)"
    )
    held = models.BooleanField(
        default=False, help_text="Held out of the queue (scontrol hold) until released; PENDING only"
    )
    state = models.CharField(max_length=16, choices=JobState.choices, default=JobState.PENDING)
    pending_reason = models.CharField(
        max_length=32, choices=PendingReason.choices, default=PendingReason.NONE
    )
    submitted_at = models.DateTimeField(default=timezone.now)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    done_iters = models.BigIntegerField(default=0)
    attained_service_gpu_s = models.FloatField(default=0)
    exit_code = models.SmallIntegerField(null=True, blank=True)

    class Meta:
        ordering = ["-submitted_at", "-id"]
        indexes = [
            models.Index(fields=["state", "submitted_at"]),
            models.Index(fields=["owner", "state"]),
            models.Index(fields=["team", "state"]),
            # Accounting (selectors/accounting.py) reads the jobs that ended or started in a window.
            models.Index(fields=["finished_at"]),
            models.Index(fields=["started_at"]),
        ]
        constraints = [
            models.CheckConstraint(condition=Q(num_gpus__gt=0), name="job_num_gpus_positive"),
            models.CheckConstraint(
                condition=Q(total_iters__isnull=True) | Q(total_iters__gt=0), name="job_total_iters_positive"
            ),
            models.CheckConstraint(
                condition=Q(workload__isnull=True) | Q(total_iters__isnull=False),
                name="job_workload_has_iters",
            ),
            models.CheckConstraint(
                condition=Q(num_nodes__isnull=True) | Q(num_nodes__gt=0), name="job_num_nodes_positive"
            ),
            models.CheckConstraint(condition=~Q(run_as="root"), name="job_never_runs_as_root"),
            models.CheckConstraint(condition=Q(done_iters__gte=0), name="job_done_iters_nonneg"),
            models.CheckConstraint(condition=Q(attained_service_gpu_s__gte=0), name="job_service_nonneg"),
            models.CheckConstraint(
                condition=Q(total_iters__isnull=True) | Q(done_iters__lte=models.F("total_iters")),
                name="job_done_iters_within_total",
            ),
            models.CheckConstraint(
                condition=Q(cpus_per_gpu__isnull=True) | Q(cpus_per_gpu__gt=0),
                name="job_cpus_override_positive",
            ),
            models.CheckConstraint(
                condition=Q(mem_gb_per_gpu__isnull=True) | Q(mem_gb_per_gpu__gt=0),
                name="job_mem_override_positive",
            ),
            models.CheckConstraint(
                condition=Q(qos_max_latency_s__isnull=True) | Q(qos_max_latency_s__gt=0),
                name="job_qos_latency_positive",
            ),
            models.CheckConstraint(
                condition=Q(qos_min_rate_iters_per_s__isnull=True) | Q(qos_min_rate_iters_per_s__gt=0),
                name="job_qos_min_rate_positive",
            ),
            models.CheckConstraint(  # at most one of the three targets
                condition=Q(qos_deadline_at__isnull=True, qos_max_latency_s__isnull=True)
                | Q(qos_deadline_at__isnull=True, qos_min_rate_iters_per_s__isnull=True)
                | Q(qos_max_latency_s__isnull=True, qos_min_rate_iters_per_s__isnull=True),
                name="job_one_qos_target",
            ),
            models.CheckConstraint(
                condition=Q(workload__isnull=False) | ~Q(command="") | ~Q(script=""),
                name="job_has_workload_or_command",
            ),
            models.CheckConstraint(
                condition=Q(array_job__isnull=True, array_task_id__isnull=True)
                | Q(array_job__isnull=False, array_task_id__isnull=False),
                name="job_array_task_complete",
            ),
            models.UniqueConstraint(fields=["array_job", "array_task_id"], name="job_array_task_once"),
        ]

    def __str__(self) -> str:
        return f"{self.id}:{self.name}"

    @property
    def deadline_at(self) -> datetime | None:
        """The QoS target as a time (None without one); see qos_deadline."""
        return qos_deadline(self.submitted_at, self.qos_deadline_at, self.qos_max_latency_s)


def qos_deadline(
    submitted_at: datetime, qos_deadline_at: datetime | None, qos_max_latency_s: float | None
) -> datetime | None:
    """A job's QoS target as a time: its deadline, or submission plus its maximum latency.

    A plain function of the three columns, so that code reading them with values_list uses it too.
    """
    if qos_deadline_at is not None:
        return qos_deadline_at
    if qos_max_latency_s is not None:
        return submitted_at + timedelta(seconds=qos_max_latency_s)
    return None


class JobEvent(models.Model):
    """One entry in a job's append-only history (PostgreSQL refuses UPDATE and DELETE on it)."""

    job = models.ForeignKey(Job, on_delete=models.PROTECT, related_name="events")
    at = models.DateTimeField(default=timezone.now)
    kind = models.CharField(max_length=32)
    from_state = models.CharField(max_length=16, blank=True)
    to_state = models.CharField(max_length=16, blank=True)
    reason = models.CharField(max_length=64, blank=True)
    message = models.TextField(blank=True)
    data = models.JSONField(default=dict, blank=True)

    class Meta:
        ordering = ["at", "id"]
        indexes = [models.Index(fields=["job", "at"])]

    def __str__(self) -> str:
        return f"{self.job_id} {self.kind} {self.from_state}->{self.to_state}"


class SchedulingRound(models.Model):
    """One run of the scheduler over the cluster, with its policy, allocator and outcome counts."""

    started_at = models.DateTimeField(default=timezone.now)
    duration_ms = models.FloatField(default=0)
    policy = models.CharField(max_length=32)
    allocator = models.CharField(max_length=32)
    trigger = models.CharField(max_length=32, default="beat")
    num_runnable = models.PositiveIntegerField(default=0)
    num_placed = models.PositiveIntegerField(default=0)
    num_pending = models.PositiveIntegerField(default=0)
    num_infeasible = models.PositiveIntegerField(default=0)
    num_preempted = models.PositiveIntegerField(default=0)

    class Meta:
        ordering = ["-started_at"]
        indexes = [models.Index(fields=["started_at"])]

    def __str__(self) -> str:
        return f"round {self.id} ({self.policy}/{self.allocator})"


class RoundDecision(models.Model):
    """What a round decided for one job, with its stable reason code."""

    # No index of its own: the unique (round, job) index leads with it, and a round writes a row per
    # queued job, so a second index costs every round's insert (about 2 ms per 1,000 rows).
    round = models.ForeignKey(
        SchedulingRound, on_delete=models.CASCADE, related_name="decisions", db_index=False
    )
    job = models.ForeignKey(Job, on_delete=models.PROTECT, related_name="decisions")
    position = models.PositiveIntegerField(help_text="Place in the policy's order, 0 = first")
    outcome = models.CharField(max_length=16)
    reason = models.CharField(max_length=64)
    speedup = models.FloatField(null=True, blank=True)

    class Meta:
        ordering = ["round", "position"]
        constraints = [
            models.UniqueConstraint(fields=["round", "job"], name="one_decision_per_job_per_round")
        ]

    def __str__(self) -> str:
        return f"round {self.round_id} job {self.job_id}: {self.outcome} ({self.reason})"


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

    `batch_id` names the request that inserted the row: after an insert-or-ignore, the rows carrying
    this request's batch id are exactly the reports seen for the first time. A report not applied to
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
        indexes = [models.Index(fields=["batch_id"]), models.Index(fields=["received_at"])]
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


class SimulationStatus(models.TextChoices):
    QUEUED = "QUEUED", "queued"
    RUNNING = "RUNNING", "running"
    SUCCEEDED = "SUCCEEDED", "succeeded"
    FAILED = "FAILED", "failed"


class SimulationRun(models.Model):
    """A what-if simulation: its parameters, progress and results (one entry per policy/allocator)."""

    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True)
    created_at = models.DateTimeField(default=timezone.now)
    status = models.CharField(
        max_length=16, choices=SimulationStatus.choices, default=SimulationStatus.QUEUED
    )
    parameters = models.JSONField(default=dict)
    progress = models.FloatField(default=0, help_text="0..1")
    results = models.JSONField(null=True, blank=True)
    error = models.TextField(blank=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]
        constraints = [
            models.CheckConstraint(
                condition=Q(progress__gte=0) & Q(progress__lte=1), name="simulation_progress_0_1"
            ),
        ]

    def __str__(self) -> str:
        return f"simulation {self.id} ({self.status})"


class AdmissionPrediction(models.Model):
    """What Attune predicted at submission (start, finish, QoS attainable) and, later, what happened.

    Written once by services/admission.py when the job is submitted; `actual_*` and the errors are
    filled when the job ends, so predictions can be audited (dashboards, docs/genie.md).
    """

    job = models.OneToOneField(Job, on_delete=models.CASCADE, related_name="admission_prediction")
    created_at = models.DateTimeField(default=timezone.now)
    policy = models.CharField(max_length=32)
    allocator = models.CharField(max_length=32)
    predicted_start_at = models.DateTimeField(null=True, blank=True)
    predicted_finish_at = models.DateTimeField(null=True, blank=True)
    deadline_at = models.DateTimeField(null=True, blank=True, help_text="The QoS target as a time")
    attainable = models.BooleanField(
        null=True, blank=True, help_text="Predicted finish by the deadline; empty without a QoS target"
    )
    detail = models.CharField(max_length=200, blank=True, help_text="Why a time could not be predicted")
    actual_start_at = models.DateTimeField(null=True, blank=True)
    actual_finish_at = models.DateTimeField(null=True, blank=True)
    met_deadline = models.BooleanField(null=True, blank=True)
    measured_iters_per_s = models.FloatField(
        null=True, blank=True, help_text="A minimum-rate job's measured rate over its leases, when it ended"
    )
    met_min_rate = models.BooleanField(
        null=True, blank=True, help_text="Completed at or above its minimum rate; empty without one"
    )

    class Meta:
        indexes = [models.Index(fields=["created_at"])]

    def __str__(self) -> str:
        return f"prediction for job {self.job_id}"

    @property
    def finish_error_s(self) -> float | None:
        """Actual minus predicted finish (positive: later than predicted)."""
        if self.actual_finish_at is None or self.predicted_finish_at is None:
            return None
        return (self.actual_finish_at - self.predicted_finish_at).total_seconds()


class JobForecast(models.Model):
    """The current estimate of a pending or running job's start and finish (services/forecasts.py).

    One row per live job, replaced after every scheduling round and at submission; every page, the API
    and the command line show these times. The prediction made at submission stays in
    AdmissionPrediction, to compare with.
    """

    job = models.OneToOneField(Job, on_delete=models.CASCADE, primary_key=True, related_name="forecast")
    start_at = models.DateTimeField(null=True, blank=True)
    finish_at = models.DateTimeField(null=True, blank=True)
    detail = models.CharField(max_length=255, blank=True, help_text="Why a time is unknown")
    computed_at = models.DateTimeField()
    position = models.PositiveIntegerField(
        null=True, blank=True, help_text="A pending job's place in the policy's order at the last round"
    )

    def __str__(self) -> str:
        return f"forecast for job {self.job_id}"
