"""Teams, Unix accounts, jobs with their states and pending reasons, and each job's history."""

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
    ARRAY_TASK_LIMIT = (
        "JobArrayTaskLimit",
        "its array already runs as many tasks at once as its limit (--array ...%N) allows",
    )


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
    checkpoint_every_s = models.FloatField(
        null=True,
        blank=True,
        help_text="How often the job checkpoints, seconds (own commands and scripts: --checkpoint-every); "
        "a restart loses the work since the last one. Empty: a catalog workload's profile, or (own "
        "command) no checkpoints, so a restart loses all the progress of the lease",
    )
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
    array_task_limit = models.PositiveIntegerField(
        null=True,
        blank=True,
        help_text="At most this many of its array's tasks run at once (--array 0-99%4; Slurm's "
        "ArrayTaskThrottle); empty: no limit",
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
            # A round's read of the live tasks of arrays with a limit (selectors.live_array_limits).
            models.Index(
                fields=["array_job", "array_task_id"],
                condition=Q(array_task_limit__isnull=False, state__in=["PENDING", "RUNNING"]),
                name="job_live_limited_tasks",
            ),
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
            models.CheckConstraint(
                condition=Q(checkpoint_every_s__isnull=True) | Q(checkpoint_every_s__gt=0),
                name="job_checkpoint_every_positive",
            ),
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
            models.CheckConstraint(
                condition=Q(array_task_limit__isnull=True)
                | Q(array_task_limit__gt=0, array_task_id__isnull=False),
                name="job_array_task_limit_of_array",
            ),
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


class JobEndPending(models.Model):
    """A job's end whose follow-ups wait for the worker's applier (services/job_end.py): the learning
    from its measured speeds, its admission outcome and its owner's notification. Written in the
    transaction that ends the job, deleted in the one that runs them, so each runs exactly once.
    `state`, `reason` and `data` are job_finish's, which the notification needs."""

    job = models.OneToOneField(Job, on_delete=models.CASCADE, primary_key=True, related_name="+")
    state = models.CharField(max_length=16)
    reason = models.CharField(max_length=64, blank=True)
    data = models.JSONField(default=dict, blank=True)

    def __str__(self) -> str:
        return f"end of job {self.job_id} ({self.state}) pending"
