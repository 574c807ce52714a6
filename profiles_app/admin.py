"""Django admin for the workload catalog, profiling runs and observed speeds."""

from django.contrib import admin

from profiles_app.models import GenieFit, ProfilingReport, ProfilingRun, SpeedObservation, Workload


@admin.register(Workload)
class WorkloadAdmin(admin.ModelAdmin):
    list_display = (
        "name",
        "workload_class",
        "best_cpus_per_gpu",
        "best_mem_gb_per_gpu",
        "speedup",
        "iter_time_s",
        "speed_correction",
        "speed_correction_jobs",
        "placement_penalty",
        "placement_penalty_leases",
        "interference_kappa",
        "interference_kappa_leases",
        "genie_alpha_s",
        "genie_beta_s",
        "genie_t_intra_s",
        "genie_t_cross_s",
        "genie_fit_r2",
        "source",
    )
    list_filter = ("workload_class",)
    search_fields = ("name", "description")


class ProfilingReportInline(admin.TabularInline):
    model = ProfilingReport
    extra = 0
    can_delete = False
    readonly_fields = ("seq", "kind", "at", "data", "received_at")


@admin.register(ProfilingRun)
class ProfilingRunAdmin(admin.ModelAdmin):
    list_display = (
        "workload",
        "kind",
        "status",
        "server",
        "num_cpus",
        "cost_gpu_s",
        "cost_wall_s",
        "created_at",
        "finished_at",
    )
    list_filter = ("kind", "status")
    search_fields = ("workload__name",)
    readonly_fields = ("lease_id", "measured_points", "pending_cpus", "configs", "host", "result")
    inlines = [ProfilingReportInline]


@admin.register(GenieFit)
class GenieFitAdmin(admin.ModelAdmin):
    """GENIE's predictor fits: the coefficients, the samples and residuals, and what was filled in."""

    list_display = (
        "workload",
        "alpha_s",
        "beta_s",
        "t_intra_s",
        "t_cross_s",
        "startup_s",
        "r2",
        "measured",
        "created_at",
    )
    list_filter = ("workload",)
    readonly_fields = ("run", "samples", "residuals", "measured", "filled", "created_at")


@admin.register(SpeedObservation)
class SpeedObservationAdmin(admin.ModelAdmin):
    list_display = (
        "workload",
        "job",
        "cpus_per_gpu",
        "mem_gb_per_gpu",
        "predicted_iters_per_s",
        "measured_iters_per_s",
        "samples",
        "at",
    )
    list_filter = ("workload",)
    raw_id_fields = ("job", "allocation")
