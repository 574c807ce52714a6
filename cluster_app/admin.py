"""Django admin for servers, GPUs, agent credentials and usage samples."""

from django.contrib import admin, messages

from cluster_app.models import AgentCredential, ClusterUsageMinute, Gpu, GpuUsageSample, Server, UsageSample
from cluster_app.services import ServerStateError, agent_credential_issue, agent_credential_revoke
from scheduler_app.services.nodes import node_drain, node_resume


class GpuInline(admin.TabularInline):
    model = Gpu
    extra = 0
    fields = ("index", "uuid", "model", "memory_mb", "retired_at")


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
        "registered_at",
    )
    # Set only by its agent's registration: a server takes work once that happened (docs/rest-api.md).
    readonly_fields = ("registered_at",)
    list_select_related = ("heartbeat",)
    list_filter = ("state", "gpu_model")
    search_fields = ("name", "hostname")
    inlines = [GpuInline]
    actions = ["drain", "resume", "issue_agent_token"]

    def _each(self, request, queryset, change) -> None:
        for server in queryset:
            try:
                server = change(server=server)
            except ServerStateError as exc:
                self.message_user(request, str(exc), messages.WARNING)
            else:
                self.message_user(request, f"{server.name}: {server.state}")

    @admin.action(description="Drain: running jobs finish, nothing new is placed")
    def drain(self, request, queryset) -> None:
        # The work side (scheduler_app) counts each server's leases: the admin is an entry point above both.
        reason = f"drained by {request.user}"
        self._each(request, queryset, lambda server: node_drain(server=server, reason=reason))

    @admin.action(description="Resume: put drained servers back into service")
    def resume(self, request, queryset) -> None:
        self._each(request, queryset, node_resume)

    @admin.action(description="Issue a new agent token (shown once)")
    def issue_agent_token(self, request, queryset) -> None:
        for server in queryset:
            token = agent_credential_issue(server=server)
            self.message_user(
                request, f"Agent token for {server.name} (copy it now, it is not stored): {token}"
            )


@admin.register(Gpu)
class GpuAdmin(admin.ModelAdmin):
    list_display = ("__str__", "uuid", "model", "memory_mb", "retired_at")
    list_filter = ("server", "model")
    search_fields = ("uuid", "server__name")


@admin.register(AgentCredential)
class AgentCredentialAdmin(admin.ModelAdmin):
    list_display = ("server", "token_prefix", "created_at", "last_used_at", "revoked_at")
    readonly_fields = ("token_digest", "token_prefix", "created_at", "last_used_at")
    list_filter = ("server",)
    actions = ["revoke"]

    def has_add_permission(self, request) -> bool:
        return False  # tokens come from the Server action or `manage.py node_token`, never typed in

    @admin.action(description="Revoke the selected credentials")
    def revoke(self, request, queryset) -> None:
        for credential in queryset:
            agent_credential_revoke(credential=credential)
        self.message_user(request, f"{queryset.count()} credential(s) revoked")


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


@admin.register(ClusterUsageMinute)
class ClusterUsageMinuteAdmin(admin.ModelAdmin):
    """Read-only: the rows are sums of the samples (rebuild with `manage.py usage_minutes_rebuild`)."""

    list_display = ("minute", "servers_sampled", "gpu_samples", "gpu_util_pct_sum", "cpu_cores_sum")
    date_hierarchy = "minute"

    def has_add_permission(self, request) -> bool:  # type: ignore[no-untyped-def]
        return False

    def has_change_permission(self, request, obj=None) -> bool:  # type: ignore[no-untyped-def]
        return False
