"""The hardware Attune schedules on: servers, their GPUs, agent credentials and usage samples."""

from datetime import datetime

from django.db import models
from django.db.models import Q


class NodeState(models.TextChoices):
    """Slurm's node states, the words our users already know."""

    IDLE = "IDLE", "idle"
    MIXED = "MIXED", "mixed"
    ALLOCATED = "ALLOCATED", "allocated"
    DRAINING = "DRAINING", "draining"
    DRAINED = "DRAINED", "drained"
    DOWN = "DOWN", "down"
    NOT_RESPONDING = "NOT_RESPONDING", "not responding"


class Server(models.Model):
    """A GPU server (a node), with the capacity the scheduler may hand out."""

    name = models.CharField(max_length=100, unique=True)
    hostname = models.CharField(max_length=255, blank=True)
    address = models.CharField(
        max_length=255,
        blank=True,
        help_text="Address its agent registered for peers (MASTER_ADDR); else hostname",
    )
    gpu_model = models.CharField(max_length=100, blank=True)
    num_gpus = models.PositiveSmallIntegerField()
    num_cpus = models.PositiveSmallIntegerField(help_text="CPU cores the scheduler may allocate")
    mem_gb = models.FloatField(help_text="DRAM the scheduler may allocate, in GB")
    storage_mbps = models.FloatField(default=0, help_text="Disk/storage read bandwidth, MB/s")
    nic_gbps = models.FloatField(default=0, help_text="Network bandwidth between servers, Gb/s")
    state = models.CharField(max_length=16, choices=NodeState.choices, default=NodeState.IDLE)
    state_reason = models.CharField(max_length=255, blank=True)
    agent_version = models.CharField(max_length=50, blank=True)
    time_scale = models.FloatField(
        default=1.0,
        help_text="Seconds of the node per second of a job's profile: 1 on a real node; a fake node's "
        "--time-scale (0.05 runs synthetic jobs 20 times faster)",
    )
    live_resize = models.BooleanField(
        default=False,
        help_text="Its agent applies a new size (cores, memory) to a running lease in place (registered "
        "feature `resize`); otherwise a round restarts a job whose cores or memory change",
    )
    registered_at = models.DateTimeField(
        null=True,
        blank=True,
        help_text="When its agent last registered its inventory; empty: never (placeholder GPUs from "
        "node_token or the admin), and the server takes no work until it does",
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["name"]
        constraints = [
            models.CheckConstraint(condition=Q(num_gpus__gt=0), name="server_num_gpus_positive"),
            models.CheckConstraint(condition=Q(num_cpus__gt=0), name="server_num_cpus_positive"),
            models.CheckConstraint(condition=Q(mem_gb__gt=0), name="server_mem_gb_positive"),
            models.CheckConstraint(condition=Q(storage_mbps__gte=0), name="server_storage_mbps_nonneg"),
            models.CheckConstraint(condition=Q(time_scale__gt=0), name="server_time_scale_positive"),
        ]

    def __str__(self) -> str:
        return self.name

    @property
    def last_heartbeat_at(self) -> datetime | None:
        """When its agent was last heard from (None: never); kept in ServerHeartbeat, which see.
        Lists read it through select_related("heartbeat")."""
        heartbeat = getattr(self, "heartbeat", None)  # the reverse one-to-one raises AttributeError
        return heartbeat.at if heartbeat is not None else None


class ServerHeartbeat(models.Model):
    """When a server's agent was last heard from, in a row of its own.

    Not a column of Server: a scheduling round holds every server row locked for its whole
    transaction (cluster_app.selectors.servers_lock_all), so a heartbeat that wrote the server row
    either waited for the round, queueing a thousand agents' syncs behind it, or skipped its touch,
    and servers whose beats kept landing in rounds were marked NOT_RESPONDING while their agents
    were fine. Nothing locks these rows for long; the liveness sweep reads them after locking the
    servers. Kubernetes moved node heartbeats from the Node object to Lease objects for the same reason.
    """

    server = models.OneToOneField(
        Server, on_delete=models.CASCADE, primary_key=True, related_name="heartbeat"
    )
    at = models.DateTimeField(help_text="the service's clock when the last heartbeat arrived")

    def __str__(self) -> str:
        return f"{self.server_id} @ {self.at:%Y-%m-%d %H:%M:%S}"


class Gpu(models.Model):
    """One GPU of a server; the agent reports its UUID (what CUDA_VISIBLE_DEVICES names).

    Only GPUs with an empty `retired_at` are schedulable; `Server.num_gpus` counts exactly those.
    """

    server = models.ForeignKey(Server, on_delete=models.CASCADE, related_name="gpus")
    index = models.PositiveSmallIntegerField()
    uuid = models.CharField(max_length=64, unique=True)
    model = models.CharField(max_length=100, blank=True)
    memory_mb = models.PositiveIntegerField(default=0)
    # Set when the agent stops reporting this GPU. The row stays (allocation history points at it)
    # and comes back if a later registration reports its index again.
    retired_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["server__name", "index"]
        constraints = [
            models.UniqueConstraint(fields=["server", "index"], name="gpu_unique_index_per_server"),
        ]

    def __str__(self) -> str:
        return f"{self.server.name}:gpu{self.index}"


class AgentCredential(models.Model):
    """The secret a server's agent authenticates with; only a SHA-256 digest is stored.

    Tokens are 256-bit random strings, so a fast digest is enough (no password stretching needed);
    `token_prefix` lets an admin tell credentials apart without revealing them.
    """

    server = models.ForeignKey(Server, on_delete=models.CASCADE, related_name="credentials")
    token_digest = models.CharField(max_length=64, unique=True)
    token_prefix = models.CharField(max_length=12)
    created_at = models.DateTimeField(auto_now_add=True)
    last_used_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"{self.server.name} ({self.token_prefix}…)"


class UsageSample(models.Model):
    """A server-wide usage reading from the agent at one moment."""

    # No index of its own, nor a plain (server, sampled_at) one: the unique constraint's index serves
    # both, and every agent sync writes these rows, each index one more write.
    server = models.ForeignKey(Server, on_delete=models.CASCADE, related_name="usage_samples", db_index=False)
    sampled_at = models.DateTimeField()
    cpu_util_pct = models.FloatField()
    mem_used_gb = models.FloatField()

    class Meta:
        ordering = ["-sampled_at"]
        indexes = [models.Index(fields=["sampled_at"])]  # the roll-up and the retention read by time
        constraints = [
            models.UniqueConstraint(fields=["server", "sampled_at"], name="usage_one_sample_per_instant"),
        ]

    def __str__(self) -> str:
        return f"{self.server_id} @ {self.sampled_at:%Y-%m-%d %H:%M:%S}"


class GpuUsageSample(models.Model):
    """One GPU's utilisation and memory at one moment (NVML on real nodes)."""

    # As UsageSample's: the unique constraint's (gpu, sampled_at) index is the only one by GPU.
    gpu = models.ForeignKey(Gpu, on_delete=models.CASCADE, related_name="usage_samples", db_index=False)
    sampled_at = models.DateTimeField()
    util_pct = models.FloatField()
    mem_used_mb = models.FloatField()

    class Meta:
        ordering = ["-sampled_at"]
        indexes = [models.Index(fields=["sampled_at"])]
        constraints = [
            models.UniqueConstraint(fields=["gpu", "sampled_at"], name="gpu_usage_one_sample_per_instant"),
        ]

    def __str__(self) -> str:
        return f"gpu {self.gpu_id} @ {self.sampled_at:%Y-%m-%d %H:%M:%S}"


class ClusterUsageMinute(models.Model):
    """Cluster-wide sums and counts of the usage samples of one minute, what the dashboards read.

    Written at ingestion (cluster_app.usage_minutes: one UPSERT per stored heartbeat, adding only the
    samples actually inserted) and rebuilt from the sample tables by `cluster_usage_minutes_rebuild`
    (the roll-up does so for the minutes it folds). Per bucket of minutes, the dashboards' formulas:
    - GPU % = sum(gpu_util_pct_sum) / sum(gpu_samples)            (mean over GPU samples);
    - CPU % = sum(cpu_util_pct_cores_sum) / sum(cpu_cores_sum)    (core-weighted mean);
    - memory % = 100 x sum(mem_used_gb_sum) / sum(mem_capacity_gb_sum).
    Cores and GB are the server's at the time its sample was added.
    """

    minute = models.DateTimeField(unique=True, help_text="start of the minute, UTC")
    servers_sampled = models.IntegerField(default=0, help_text="UsageSample rows in the minute")
    cpu_util_pct_cores_sum = models.FloatField(default=0, help_text="sum of cpu_util_pct x server cores")
    cpu_cores_sum = models.BigIntegerField(default=0, help_text="sum of the sampled servers' cores")
    mem_used_gb_sum = models.FloatField(default=0)
    mem_capacity_gb_sum = models.FloatField(default=0, help_text="sum of the sampled servers' mem_gb")
    gpu_samples = models.IntegerField(default=0, help_text="GpuUsageSample rows in the minute")
    gpu_util_pct_sum = models.FloatField(default=0)

    class Meta:
        ordering = ["minute"]
        constraints = [
            models.CheckConstraint(condition=Q(servers_sampled__gte=0), name="usage_minute_servers_nonneg"),
            models.CheckConstraint(condition=Q(cpu_cores_sum__gte=0), name="usage_minute_cores_nonneg"),
            models.CheckConstraint(condition=Q(mem_capacity_gb_sum__gte=0), name="usage_minute_mem_nonneg"),
            models.CheckConstraint(condition=Q(gpu_samples__gte=0), name="usage_minute_gpu_samples_nonneg"),
        ]

    def __str__(self) -> str:
        return f"usage {self.minute:%Y-%m-%d %H:%M}"


class UsageRollupMark(models.Model):
    """How far the usage roll-up has folded raw samples (one row): the next run looks for raw samples
    from a little before it, not through all the history rolled up so far (an index walk over one row
    per server and minute since the installation, every hour)."""

    rolled_until = models.DateTimeField(help_text="every raw sample before this was rolled up (UTC)")

    def __str__(self) -> str:
        return f"usage rolled up until {self.rolled_until:%Y-%m-%d %H:%M}"
