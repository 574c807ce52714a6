"""Notification settings per user, and one delivery record per (job, event, channel)."""

from django.conf import settings
from django.core.validators import URLValidator
from django.db import models
from django.db.models import Q
from django.utils import timezone

# A webhook is an HTTP POST: other schemes (ftp, file...) make no sense and only widen what a user
# could make the service connect to.
WEBHOOK_SCHEMES = ("http", "https")
webhook_url_validator = URLValidator(schemes=list(WEBHOOK_SCHEMES))


class NotificationEvent(models.TextChoices):
    """What a user can be told about; the values are stable codes (webhook bodies, the API)."""

    END = "end", "job completed"
    FAILURE = "failure", "job ended without completing"
    QOS_AT_RISK = "qos_at_risk", "job predicted to miss its deadline"


class NotificationChannel(models.TextChoices):
    EMAIL = "email", "email"
    WEBHOOK = "webhook", "webhook"


class NotificationState(models.TextChoices):
    """pending -> sending (claimed by one worker) -> sent | pending again (retry) | failed."""

    PENDING = "pending", "pending"
    SENDING = "sending", "sending"
    SENT = "sent", "sent"
    FAILED = "failed", "failed"


class NotificationSettings(models.Model):
    """What one user wants to hear about, and where. Opt-in: nothing is sent until a channel is on."""

    user = models.OneToOneField(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="notification_settings"
    )
    email_enabled = models.BooleanField("Send emails", default=False)
    email = models.EmailField("Email address", blank=True, help_text="Empty: the address of your account.")
    webhook_url = models.URLField(
        "Webhook URL",
        max_length=2000,
        blank=True,
        validators=[webhook_url_validator],
        help_text="Empty: no webhook. Receives an HTTP POST of JSON with a Slack-compatible `text`.",
    )
    on_end = models.BooleanField("When a job completes", default=True)
    on_failure = models.BooleanField(
        "When a job fails",
        default=True,
        help_text="FAILED, TIMEOUT, OUT_OF_MEMORY, NODE_FAIL, or cancelled by someone other than you.",
    )
    on_qos_at_risk = models.BooleanField(
        "When a job's deadline is at risk",
        default=True,
        help_text="Once per job, when the forecast says it will finish after its QoS deadline.",
    )
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        verbose_name = "notification settings"
        verbose_name_plural = "notification settings"

    def __str__(self) -> str:
        return f"notification settings of {self.user}"


class Notification(models.Model):
    """One message about one job event on one channel: the unique constraint makes it at most one.

    A worker claims a pending row (conditional UPDATE to `sending`) before it sends and marks it
    `sent` after, so a retried or redelivered task never sends it twice
    (services.delivery.notification_deliver).
    """

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="notifications")
    job = models.ForeignKey("scheduler_app.Job", on_delete=models.CASCADE, related_name="notifications")
    event = models.CharField(max_length=16, choices=NotificationEvent.choices)
    channel = models.CharField(max_length=8, choices=NotificationChannel.choices)
    state = models.CharField(
        max_length=8, choices=NotificationState.choices, default=NotificationState.PENDING
    )
    tries = models.PositiveSmallIntegerField(default=0)
    last_error = models.CharField(max_length=500, blank=True)
    data = models.JSONField(
        default=dict, blank=True, help_text="What the message says (state, reason, times)"
    )
    created_at = models.DateTimeField(default=timezone.now)
    claimed_at = models.DateTimeField(null=True, blank=True, help_text="When the latest try began")
    sent_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        indexes = [
            models.Index(fields=["user", "-created_at"]),
            models.Index(fields=["state", "created_at"]),
        ]
        constraints = [
            models.UniqueConstraint(fields=["job", "event", "channel"], name="notification_once_per_event"),
            models.CheckConstraint(
                condition=Q(state=NotificationState.SENT, sent_at__isnull=False)
                | (~Q(state=NotificationState.SENT) & Q(sent_at__isnull=True)),
                name="notification_sent_at_iff_sent",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.job_id} {self.event} {self.channel} {self.state}"
