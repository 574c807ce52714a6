"""Django admin for servers, GPUs, agent credentials and usage samples."""

from django.contrib import admin

from cluster_app.models import AgentCredential, Gpu, GpuUsageSample, Server, UsageSample


class GpuInline(admin.TabularInline):
    model = Gpu
    extra = 0
    fields = ("index", "uuid", "model", "memory_mb")


@admin.register(Server)
class ServerAdmin(admin.ModelAdmin):
    list_display = (
        "name",
        "hostname",
        "state",
        "num_gpus",
        "num_cpus",
        "mem_gb",
        "gpu_model",
        "last_heartbeat_at",
    )
    list_filter = ("state", "gpu_model")
    search_fields = ("name", "hostname")
    inlines = [GpuInline]


@admin.register(Gpu)
class GpuAdmin(admin.ModelAdmin):
    list_display = ("__str__", "uuid", "model", "memory_mb")
    list_filter = ("server", "model")
    search_fields = ("uuid", "server__name")


@admin.register(AgentCredential)
class AgentCredentialAdmin(admin.ModelAdmin):
    list_display = ("server", "token_prefix", "created_at", "last_used_at", "revoked_at")
    readonly_fields = ("token_digest", "token_prefix", "created_at", "last_used_at")
    list_filter = ("server",)


@admin.register(UsageSample)
class UsageSampleAdmin(admin.ModelAdmin):
    list_display = ("server", "sampled_at", "cpu_util_pct", "mem_used_gb")
    list_filter = ("server",)
    date_hierarchy = "sampled_at"


@admin.register(GpuUsageSample)
class GpuUsageSampleAdmin(admin.ModelAdmin):
    list_display = ("gpu", "sampled_at", "util_pct", "mem_used_mb")
    list_filter = ("gpu__server",)
    date_hierarchy = "sampled_at"
