"""Workload knowledge: the catalog with each workload's sensitivity matrix, and profiling runs."""

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
    """

    name = models.SlugField(max_length=100, unique=True)
    workload_class = models.CharField(
        max_length=16, choices=WorkloadClass.choices, default=WorkloadClass.OTHER
    )
    description = models.TextField(blank=True)
    source = models.CharField(max_length=255, blank=True, help_text="Where the profile came from")
    dataset_gb = models.FloatField(default=0)
    batch_size = models.PositiveIntegerField(default=0)
    iter_time_s = models.FloatField(help_text="Seconds per iteration at the GPU-proportional point")
    cpu_per_gpu_grid = models.JSONField(default=list)
    mem_gb_per_gpu_grid = models.JSONField(default=list)
    tput_matrix = models.JSONField(default=list, blank=True)
    best_cpus_per_gpu = models.FloatField()
    best_mem_gb_per_gpu = models.FloatField()
    speedup = models.FloatField(default=1.0, help_text="Throughput at the best-case demand / at proportional")
    placement_penalty = models.FloatField(default=1.0)
    genie_alpha_s = models.FloatField(null=True, blank=True, help_text="Compute seconds per sample")
    genie_beta_s = models.FloatField(null=True, blank=True, help_text="Fixed seconds per iteration")
    genie_t_intra_s = models.FloatField(null=True, blank=True, help_text="Intra-node comm. per log2 step")
    genie_t_cross_s = models.FloatField(null=True, blank=True, help_text="Cross-node comm. per log2 step")
    genie_startup_s = models.FloatField(null=True, blank=True)
    genie_fit_r2 = models.FloatField(null=True, blank=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name"]
        constraints = [
            models.CheckConstraint(condition=Q(iter_time_s__gt=0), name="workload_iter_time_positive"),
            models.CheckConstraint(condition=Q(speedup__gt=0), name="workload_speedup_positive"),
            models.CheckConstraint(condition=Q(best_cpus_per_gpu__gt=0), name="workload_best_cpus_positive"),
            models.CheckConstraint(condition=Q(best_mem_gb_per_gpu__gt=0), name="workload_best_mem_positive"),
            models.CheckConstraint(
                condition=Q(placement_penalty__gte=1), name="workload_penalty_at_least_one"
            ),
        ]

    def __str__(self) -> str:
        return self.name


class ProfilingRunStatus(models.TextChoices):
    QUEUED = "QUEUED", "queued"
    RUNNING = "RUNNING", "running"
    SUCCEEDED = "SUCCEEDED", "succeeded"
    FAILED = "FAILED", "failed"


class ProfilingKind(models.TextChoices):
    SYNERGY_CPU_SWEEP = "synergy_cpu_sweep", "Synergy optimistic profile (CPU sweep + memory model)"
    GENIE_PREDICTOR = "genie_predictor", "GENIE lightweight predictor fit"


class ProfilingRun(models.Model):
    """One profiling of a workload on a server: the points measured and what it cost."""

    workload = models.ForeignKey(Workload, on_delete=models.CASCADE, related_name="profiling_runs")
    server = models.ForeignKey("cluster_app.Server", on_delete=models.SET_NULL, null=True, blank=True)
    kind = models.CharField(max_length=32, choices=ProfilingKind.choices)
    status = models.CharField(
        max_length=16, choices=ProfilingRunStatus.choices, default=ProfilingRunStatus.QUEUED
    )
    measured_points = models.JSONField(
        default=list, blank=True, help_text="[{cpus, mem_gb, iter_time_s}, ...]"
    )
    cost_gpu_s = models.FloatField(default=0, help_text="GPU-seconds spent profiling")
    cost_wall_s = models.FloatField(default=0)
    error = models.TextField(blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]
        constraints = [
            models.CheckConstraint(condition=Q(cost_gpu_s__gte=0), name="profiling_cost_nonneg"),
        ]

    def __str__(self) -> str:
        return f"{self.workload.name} {self.kind} ({self.status})"
