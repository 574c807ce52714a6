"""Django admin for the workload catalog and profiling runs."""

from django.contrib import admin

from profiles_app.models import ProfilingRun, Workload


@admin.register(Workload)
class WorkloadAdmin(admin.ModelAdmin):
    list_display = (
        "name",
        "workload_class",
        "best_cpus_per_gpu",
        "best_mem_gb_per_gpu",
        "speedup",
        "iter_time_s",
    )
    list_filter = ("workload_class",)
    search_fields = ("name", "description")


@admin.register(ProfilingRun)
class ProfilingRunAdmin(admin.ModelAdmin):
    list_display = ("workload", "kind", "status", "server", "cost_gpu_s", "created_at", "finished_at")
    list_filter = ("kind", "status")
    search_fields = ("workload__name",)
