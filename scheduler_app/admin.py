"""Django admin for teams, jobs (with their history), allocations, rounds and simulation runs."""

from django import forms
from django.contrib import admin
from django.core.exceptions import ValidationError

from scheduler_app.job_accounts import run_as_problem
from scheduler_app.models import (
    AgentReport,
    Allocation,
    AllocationGpu,
    Job,
    JobEvent,
    RoundDecision,
    SchedulingRound,
    SimulationRun,
    Team,
    UnixAccount,
)


@admin.register(Team)
class TeamAdmin(admin.ModelAdmin):
    list_display = ("name", "gpu_quota", "may_borrow")
    filter_horizontal = ("members",)
    search_fields = ("name",)


class UnixAccountForm(forms.ModelForm):
    class Meta:
        model = UnixAccount
        fields = ("user", "unix_user")

    def clean_unix_user(self) -> str:
        # The database refuses root too; this says why, next to the field.
        name = self.cleaned_data["unix_user"].strip()
        problem = run_as_problem(name)
        if problem:
            raise ValidationError(problem)
        return name


@admin.register(UnixAccount)
class UnixAccountAdmin(admin.ModelAdmin):
    """Where a user's jobs must run as another account than their username (sacctmgr's mapping)."""

    form = UnixAccountForm
    list_display = ("user", "unix_user")
    search_fields = ("user__username", "unix_user")
    raw_id_fields = ("user",)


class JobEventInline(admin.TabularInline):
    """Read-only: a job's history is append-only."""

    model = JobEvent
    extra = 0
    can_delete = False
    fields = ("at", "kind", "from_state", "to_state", "reason", "message")
    readonly_fields = fields

    def has_add_permission(self, request, obj=None) -> bool:
        return False


class AllocationInline(admin.TabularInline):
    model = Allocation
    extra = 0
    can_delete = False
    fields = ("server", "num_cpus", "mem_gb", "speedup", "started_at", "ended_at", "end_reason")
    readonly_fields = fields

    def has_add_permission(self, request, obj=None) -> bool:
        return False


@admin.register(Job)
class JobAdmin(admin.ModelAdmin):
    list_display = (
        "id",
        "name",
        "owner",
        "team",
        "workload",
        "num_gpus",
        "state",
        "pending_reason",
        "submitted_at",
    )
    list_filter = ("state", "pending_reason", "team", "workload")
    search_fields = ("name", "owner__username", "command")
    date_hierarchy = "submitted_at"
    raw_id_fields = ("owner",)  # a select of every user would render the whole table into the page
    # Fixed at submission, as through the API: editing them here could make two jobs wait on each other.
    # The account is the owner's (UnixAccount) at submission: editing it here would run the job as
    # someone else.
    readonly_fields = ("depends_on", "run_as")
    inlines = [AllocationInline, JobEventInline]


@admin.register(JobEvent)
class JobEventAdmin(admin.ModelAdmin):
    list_display = ("job", "at", "kind", "from_state", "to_state", "reason")
    list_filter = ("kind",)
    search_fields = ("job__name", "message")

    def has_change_permission(self, request, obj=None) -> bool:
        return False

    def has_delete_permission(self, request, obj=None) -> bool:
        return False


class AllocationGpuInline(admin.TabularInline):
    model = AllocationGpu
    extra = 0
    raw_id_fields = ("gpu",)


@admin.register(Allocation)
class AllocationAdmin(admin.ModelAdmin):
    list_display = ("job", "server", "num_cpus", "mem_gb", "speedup", "started_at", "ended_at", "end_reason")
    list_filter = ("server", "end_reason")
    raw_id_fields = ("job", "round")
    search_fields = ("=lease_id",)
    readonly_fields = (
        "lease_id",
        "agent_started_at",
        "accounted_until",
        "iters_per_s",
        "exit_code",
        "log_tail",
    )
    inlines = [AllocationGpuInline]


@admin.register(AgentReport)
class AgentReportAdmin(admin.ModelAdmin):
    """Read-only: what agents reported, kept for idempotency and troubleshooting."""

    list_display = ("lease_id", "seq", "kind", "at", "received_at")
    list_filter = ("kind",)
    search_fields = ("=lease_id",)
    raw_id_fields = ("allocation",)

    def has_add_permission(self, request) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False


class RoundDecisionInline(admin.TabularInline):
    model = RoundDecision
    extra = 0
    can_delete = False
    fields = ("position", "job", "outcome", "reason", "speedup")
    readonly_fields = fields

    def has_add_permission(self, request, obj=None) -> bool:
        return False


@admin.register(SchedulingRound)
class SchedulingRoundAdmin(admin.ModelAdmin):
    list_display = (
        "id",
        "started_at",
        "policy",
        "allocator",
        "trigger",
        "num_runnable",
        "num_placed",
        "duration_ms",
    )
    list_filter = ("policy", "allocator", "trigger")
    inlines = [RoundDecisionInline]


@admin.register(SimulationRun)
class SimulationRunAdmin(admin.ModelAdmin):
    list_display = ("id", "created_at", "created_by", "status", "progress", "finished_at")
    list_filter = ("status",)
    readonly_fields = ("results",)
