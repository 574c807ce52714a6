"""Workload knowledge: the catalog with sensitivity matrices, profiling runs and observed speeds."""

import uuid

from django.db import models
from django.db.models import Q


class WorkloadClass(models.TextChoices):
    IMAGE = "image", "image"
    LANGUAGE = "language", "language"
    SPEECH = "speech", "speech"
    OTHER = "other", "other"


class Workload(models.Model):
    """A catalog entry: a training workload and how its speed responds to CPU and memory per GPU.

    `tput_matrix[i][j]` is throughput at `cpu_per_gpu_grid[i]` cores and `mem_gb_per_gpu_grid[j]` GB
    per GPU, normalised to 1.0 at the GPU-proportional point (Synergy). The genie_* fields hold
    GENIE's predictor: per-iteration time = alpha * batch + beta + ceil(log2 k) * t_intra
    + log2(n) * t_cross, plus a one-off start-up time, with the fit's R^2.

    An empty `tput_matrix` means "not profiled yet": its jobs wait (pending reason Profiling) until a
    ProfilingRun stores one. `argv` is how the workload runs (`--iters N` is appended); empty means the
    synthetic workload (`python -m agent.workload --model <name>`). `ground_truth` exists for demos and
    tests only: the true sensitivity a synthetic stand-in emulates, which the profiler must discover.
    The scheduler never reads it (only the process's environment carries it).

    `speed_correction` is GENIE's feedback (PAPERS 5.6): when a job of this workload ends, r <- 0.8 r +
    0.2 x (measured / predicted speed of its leases), and every estimate of this workload's time (the
    core profile's seconds per iteration) is divided by r. A new profile starts again at 1.

    `placement_penalty` is learnt the same way, from the leases' measured speeds on one server against
    those spread over several (`core.predictor.fit_placement_penalty`): GENIE's cross-node term, which
    the allocators and every estimate of a spread job's time then use. A new profile keeps it (it is a
    property of the network, not of the CPU and memory sweep).
    """

    name = models.SlugField(max_length=100, unique=True)
    workload_class = models.CharField(
        max_length=16, choices=WorkloadClass.choices, default=WorkloadClass.OTHER
    )
    description = models.TextField(blank=True)
    source = models.CharField(max_length=255, blank=True, help_text="Where the profile came from")
    dataset_gb = models.FloatField(default=0, help_text="Training data size, GB (MinIO memory model)")
    dataset_samples = models.PositiveBigIntegerField(default=0, help_text="Samples in the training data")
    batch_size = models.PositiveIntegerField(default=0, help_text="Samples per iteration per GPU")
    working_set_gb = models.FloatField(
        default=0, help_text="Memory per GPU the job needs besides its cache (peak RSS when profiled)"
    )
    argv = models.JSONField(default=list, blank=True, help_text="Command to run; empty: the synthetic one")
    ground_truth = models.JSONField(
        default=dict, blank=True, help_text="Demo/test only: the sensitivity a synthetic stand-in emulates"
    )
    iter_time_s = models.FloatField(help_text="Seconds per iteration at the GPU-proportional point")
    cpu_per_gpu_grid = models.JSONField(default=list)
    mem_gb_per_gpu_grid = models.JSONField(default=list)
    tput_matrix = models.JSONField(default=list, blank=True)
    best_cpus_per_gpu = models.FloatField()
    best_mem_gb_per_gpu = models.FloatField()
    speedup = models.FloatField(default=1.0, help_text="Throughput at the best-case demand / at proportional")
    placement_penalty = models.FloatField(
        default=1.0, help_text="A job spread over servers runs this many times slower (>= 1)"
    )
    placement_penalty_leases = models.PositiveIntegerField(
        default=0,
        help_text="Leases (one server and spread) the learned placement_penalty rests on; 0: as shipped",
    )
    interference_kappa = models.FloatField(
        default=0.0,
        help_text="GENIE's interference: a communicating job runs (1 + kappa x) times slower next to x "
        "other communicating jobs (>= 0; 0 until measured)",
    )
    interference_kappa_leases = models.PositiveIntegerField(
        default=0, help_text="Leases (alone and co-located) the learned interference_kappa rests on"
    )
    startup_s = models.FloatField(
        default=30.0,
        help_text="Seconds from a job's launch to its first progress (process start, CUDA/NCCL set-up, "
        "data loaders); learnt from the leases' measured start-ups, the profile default until then",
    )
    startup_leases = models.PositiveIntegerField(
        default=0, help_text="Leases the learned startup_s rests on; 0: the profile default"
    )
    checkpoint_every_s = models.FloatField(
        default=600.0,
        help_text="How often the workload checkpoints, seconds (a restart redoes the work since)",
    )
    genie_alpha_s = models.FloatField(null=True, blank=True, help_text="Compute seconds per sample")
    genie_beta_s = models.FloatField(null=True, blank=True, help_text="Fixed seconds per iteration")
    genie_t_intra_s = models.FloatField(null=True, blank=True, help_text="Intra-node comm. per log2 step")
    genie_t_cross_s = models.FloatField(null=True, blank=True, help_text="Cross-node comm. per log2 step")
    genie_startup_s = models.FloatField(null=True, blank=True)
    genie_fit_r2 = models.FloatField(null=True, blank=True)
    speed_correction = models.FloatField(
        default=1.0,
        help_text="GENIE's EWMA of measured / predicted speed over finished jobs; estimates multiply by it",
    )
    speed_correction_jobs = models.PositiveIntegerField(
        default=0, help_text="Finished jobs folded into speed_correction since the profile was stored"
    )
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name"]
        constraints = [
            models.CheckConstraint(condition=Q(iter_time_s__gt=0), name="workload_iter_time_positive"),
            models.CheckConstraint(condition=Q(startup_s__gte=0), name="workload_startup_nonneg"),
            models.CheckConstraint(
                condition=Q(checkpoint_every_s__gt=0), name="workload_checkpoint_positive"
            ),
            models.CheckConstraint(condition=Q(speedup__gt=0), name="workload_speedup_positive"),
            models.CheckConstraint(condition=Q(best_cpus_per_gpu__gt=0), name="workload_best_cpus_positive"),
            models.CheckConstraint(condition=Q(best_mem_gb_per_gpu__gt=0), name="workload_best_mem_positive"),
            models.CheckConstraint(
                condition=Q(placement_penalty__gte=1), name="workload_penalty_at_least_one"
            ),
            models.CheckConstraint(
                condition=Q(speed_correction__gt=0), name="workload_speed_correction_positive"
            ),
            models.CheckConstraint(
                condition=Q(interference_kappa__gte=0), name="workload_interference_kappa_non_negative"
            ),
        ]

    def __str__(self) -> str:
        return self.name


class ProfilingRunStatus(models.TextChoices):
    QUEUED = "QUEUED", "queued"
    RUNNING = "RUNNING", "running"
    SUCCEEDED = "SUCCEEDED", "succeeded"
    FAILED = "FAILED", "failed"


ACTIVE_PROFILING_STATES = (ProfilingRunStatus.QUEUED, ProfilingRunStatus.RUNNING)


class CpuSearch(models.TextChoices):
    BISECTION = "bisection", "bisection of the CPU grid"
    HALVING = "halving", "the reference repo's halving rule"


class ProfilingKind(models.TextChoices):
    SYNERGY_CPU_SWEEP = "synergy_cpu_sweep", "Synergy optimistic profile (CPU sweep + memory model)"
    GENIE_PREDICTOR = "genie_predictor", "GENIE lightweight predictor fit"


class ProfilingRun(models.Model):
    """One profiling of a workload on a server: the points measured and what it cost.

    While RUNNING it holds `gpu_indices`, `num_cpus` cores and `mem_gb` on `server` (rounds leave them
    alone) and the server's agent measures the core counts in `pending_cpus`; `lease_id` names it in
    the agent protocol (docs/profiling.md). `measured_points` keeps every point in measurement order.

    A GENIE run (kind genie_predictor, docs/genie.md) measures `configs` instead (per-GPU batch sizes on
    1 GPU, 2 GPUs of `server`, 1 GPU on each of `server` and `peer_server`), each bounded by
    `max_s_per_config`; its points carry their `config` and `node_rank`. The peer's GPU, cores and
    memory are held from assignment until its part is measured (`peer_released_at`).
    """

    workload = models.ForeignKey(Workload, on_delete=models.CASCADE, related_name="profiling_runs")
    server = models.ForeignKey("cluster_app.Server", on_delete=models.SET_NULL, null=True, blank=True)
    kind = models.CharField(max_length=32, choices=ProfilingKind.choices)
    status = models.CharField(
        max_length=16, choices=ProfilingRunStatus.choices, default=ProfilingRunStatus.QUEUED
    )
    lease_id = models.UUIDField(default=uuid.uuid4, unique=True, editable=False)
    strategy = models.CharField(max_length=16, choices=CpuSearch.choices, default=CpuSearch.BISECTION)
    rel_tol = models.FloatField(default=0.03, help_text="Refine CPU intervals whose ends differ by more")
    iters_per_point = models.PositiveIntegerField(default=50)
    warmup_iters = models.PositiveIntegerField(default=5, help_text="Per launch, left out of the timing")
    num_gpus = models.PositiveSmallIntegerField(default=1)
    gpu_indices = models.JSONField(default=list, blank=True)
    num_cpus = models.PositiveSmallIntegerField(default=0, help_text="Cores held: the most it measures")
    mem_gb = models.FloatField(default=0, help_text="Memory held while measuring (dataset cached)")
    pending_cpus = models.JSONField(default=list, blank=True, help_text="Core counts the agent measures next")
    measured_points = models.JSONField(
        default=list, blank=True, help_text="[{cpus, cpus_per_gpu, sec_per_iter, wall_s, ...}, ...]"
    )
    host = models.JSONField(default=dict, blank=True, help_text="The agent's mem_gbps and disk_mbps")
    configs = models.JSONField(
        default=list,
        blank=True,
        help_text="GENIE: [{key, num_servers, gpus_per_server, batch}, ...] to measure",
    )
    max_s_per_config = models.FloatField(
        default=0, help_text="GENIE: a configuration's launch is stopped after this many seconds"
    )
    peer_server = models.ForeignKey(
        "cluster_app.Server", on_delete=models.SET_NULL, null=True, blank=True, related_name="+"
    )
    # The peer's agent reports under a lease id of its own: each agent numbers its reports from 1, and
    # (lease id, seq) is what makes a report idempotent.
    peer_lease_id = models.UUIDField(null=True, blank=True, unique=True, editable=False)
    peer_gpu_indices = models.JSONField(default=list, blank=True, help_text="GENIE: GPUs held on peer_server")
    peer_num_cpus = models.PositiveSmallIntegerField(default=0)
    peer_mem_gb = models.FloatField(default=0)
    peer_released_at = models.DateTimeField(null=True, blank=True, help_text="GENIE: peer's part measured")
    result = models.JSONField(default=dict, blank=True, help_text="The derived matrix and its inputs")
    cost_gpu_s = models.FloatField(default=0, help_text="GPU-seconds spent profiling")
    cost_wall_s = models.FloatField(default=0)
    error = models.TextField(blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]
        indexes = [models.Index(fields=["status", "created_at"])]
        constraints = [
            models.CheckConstraint(condition=Q(cost_gpu_s__gte=0), name="profiling_cost_nonneg"),
            models.CheckConstraint(condition=Q(num_gpus__gt=0), name="profiling_num_gpus_positive"),
            # Two runs of one workload at once would waste GPUs and race to store the profile.
            models.UniqueConstraint(
                fields=["workload"],
                condition=Q(status__in=["QUEUED", "RUNNING"]),
                name="one_active_profiling_run_per_workload",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.workload.name} {self.kind} ({self.status})"


class ProfilingReport(models.Model):
    """One agent report about a profiling run; (lease_id, seq) makes a retried report a no-op.

    A requeued run gets a new lease id (its next agent counts seqs from 1 again), so the key is the
    lease id, not the run.
    """

    run = models.ForeignKey(ProfilingRun, on_delete=models.CASCADE, related_name="reports")
    lease_id = models.UUIDField()
    seq = models.BigIntegerField()
    kind = models.CharField(max_length=16)
    at = models.DateTimeField(help_text="When it happened, on the agent's clock")
    data = models.JSONField(default=dict, blank=True)
    received_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["run", "lease_id", "seq"]
        constraints = [models.UniqueConstraint(fields=["lease_id", "seq"], name="profiling_report_once")]

    def __str__(self) -> str:
        return f"{self.run_id}#{self.seq} {self.kind}"


class GenieFit(models.Model):
    """One fit of GENIE's predictor for a workload, from a lightweight profiling run (docs/genie.md).

    Per-iteration time t(n, k, b) = alpha_s*b + beta_s + ceil(log2 k)*t_intra_s + log2(n)*t_cross_s at
    the GPU-proportional CPU/memory share, in the workload's own time; `startup_s` is the one-off
    start-up cost s_0. `samples` are the measured configurations it rests on, `residuals` each
    sample's predicted against measured time, `r2` the R^2 of the whole model over the samples.
    `measured` lists the terms measured; `filled` maps each term that could not be measured to why and
    how it was filled in (the platform model of PAPERS 2.3). The workload's genie_* fields copy the
    latest fit; older fits stay as history.
    """

    workload = models.ForeignKey(Workload, on_delete=models.CASCADE, related_name="genie_fits")
    run = models.OneToOneField(
        ProfilingRun, on_delete=models.SET_NULL, null=True, blank=True, related_name="genie_fit"
    )
    alpha_s = models.FloatField(help_text="Compute seconds per sample (per GPU)")
    beta_s = models.FloatField(help_text="Fixed seconds per iteration")
    t_intra_s = models.FloatField(help_text="Seconds per ceil(log2 k) step inside a server")
    t_cross_s = models.FloatField(help_text="Seconds per log2(n) step across servers (t_o)")
    startup_s = models.FloatField(default=0, help_text="One-off start-up seconds (s_0)")
    r2 = models.FloatField(help_text="R^2 of the model over its samples")
    r2_compute = models.FloatField(help_text="R^2 of the single-GPU fit alpha*b + beta")
    samples = models.JSONField(
        default=list, help_text="[{config, num_servers, gpus_per_server, batch, iter_time_s, ranks}, ...]"
    )
    residuals = models.JSONField(
        default=list, help_text="[{config, measured_s, predicted_s, error_pct}, ...] per sample"
    )
    measured = models.JSONField(default=list, help_text="Terms measured: alpha, beta, t_intra, t_cross")
    filled = models.JSONField(default=dict, blank=True, help_text="Term -> how and why it was filled in")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        indexes = [models.Index(fields=["workload", "created_at"])]

    def __str__(self) -> str:
        return f"{self.workload.name}: GENIE fit ({self.created_at:%Y-%m-%d %H:%M})"


class SpeedObservation(models.Model):
    """Predicted versus measured speed of one lease of a job: how good the workload's profile is.

    predicted = the allocation's expected speed-up / the workload's seconds per iteration at the
    proportional point; measured = what the agent last reported (in the workload's own time, so a
    fake node's time scale is taken out). One row per lease, updated as reports arrive.
    """

    workload = models.ForeignKey(Workload, on_delete=models.CASCADE, related_name="speed_observations")
    job = models.ForeignKey("scheduler_app.Job", on_delete=models.CASCADE, related_name="+")
    allocation = models.OneToOneField(
        "scheduler_app.Allocation", on_delete=models.CASCADE, related_name="speed_observation"
    )
    cpus_per_gpu = models.FloatField()
    mem_gb_per_gpu = models.FloatField()
    num_servers = models.PositiveSmallIntegerField(
        default=1, help_text="Servers the job spans in this lease's round"
    )
    placement_penalty = models.FloatField(
        default=1.0, help_text="The penalty inside predicted_iters_per_s (1 on one server)"
    )
    colocated_comm_jobs = models.PositiveSmallIntegerField(
        default=0, help_text="Other communicating jobs on the lease's servers when its round placed it"
    )
    interference_factor = models.FloatField(
        default=1.0, help_text="The interference (1 + kappa x) inside predicted_iters_per_s"
    )
    predicted_iters_per_s = models.FloatField()
    measured_iters_per_s = models.FloatField()
    samples = models.PositiveIntegerField(default=1)
    first_at = models.DateTimeField()
    at = models.DateTimeField(help_text="Last report, on the agent's clock")

    class Meta:
        ordering = ["-at"]
        indexes = [models.Index(fields=["workload", "at"])]

    def __str__(self) -> str:
        return (
            f"{self.workload.name}: {self.measured_iters_per_s:.3g} vs {self.predicted_iters_per_s:.3g} it/s"
        )

    @property
    def error(self) -> float:
        """(measured - predicted) / predicted."""
        if self.predicted_iters_per_s <= 0:
            return 0.0
        return (self.measured_iters_per_s - self.predicted_iters_per_s) / self.predicted_iters_per_s
