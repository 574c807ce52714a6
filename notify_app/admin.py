"""Django admin for users' notification settings and the delivery record of every notification."""

from django.contrib import admin, messages
from django.db import models
from django.db.models import QuerySet
from django.http import HttpRequest

from notify_app.models import Notification, NotificationSettings
from notify_app.senders import webhook_host
from notify_app.services.dispatch import SENDING_STALE_AFTER_S, notifications_resend


@admin.register(NotificationSettings)
class NotificationSettingsAdmin(admin.ModelAdmin):
    list_display = ("user", "email_enabled", "email", "webhook", "on_end", "on_failure", "on_qos_at_risk")
    list_filter = ("email_enabled", "on_end", "on_failure", "on_qos_at_risk")
    search_fields = ("user__username", "email")
    raw_id_fields = ("user",)
    # Django 6's default (and no DeprecationWarning now): a URL typed without a scheme is https.
    formfield_overrides = {models.URLField: {"assume_scheme": "https"}}

    @admin.display(description="webhook host")
    def webhook(self, obj: NotificationSettings) -> str:
        # The host only: a webhook URL's path is often its secret (Slack's are).
        return webhook_host(obj.webhook_url) if obj.webhook_url else ""


@admin.register(Notification)
class NotificationAdmin(admin.ModelAdmin):
    """Read-only: rows change through deliveries (and the "send again" action) only."""

    list_display = (
        "created_at",
        "user",
        "job",
        "event",
        "channel",
        "state",
        "tries",
        "sent_at",
        "last_error",
    )
    list_filter = ("state", "event", "channel")
    search_fields = ("user__username", "job__id", "job__name")
    raw_id_fields = ("user", "job")
    date_hierarchy = "created_at"
    readonly_fields = (
        "user",
        "job",
        "event",
        "channel",
        "state",
        "tries",
        "last_error",
        "data",
        "created_at",
        "claimed_at",
        "sent_at",
    )
    actions = ["send_again"]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    @admin.action(
        description=(
            "Send again (unsent only; a row `sending` for over "
            f"{SENDING_STALE_AFTER_S // 60} min was left by a dead worker and may already have arrived)"
        )
    )
    def send_again(self, request: HttpRequest, queryset: QuerySet[Notification]) -> None:
        count = notifications_resend(notification_ids=queryset.values_list("pk", flat=True))
        self.message_user(request, f"{count} notification(s) queued again.", messages.SUCCESS)
