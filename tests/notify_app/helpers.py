"""Helpers for notification tests: opting a user in, a job with a deadline."""

from __future__ import annotations

from datetime import timedelta

from django.utils import timezone

from notify_app.models import NotificationSettings
from scheduler_app.models import Job
from tests.api.helpers import submit


def opt_in(user, *, email: bool = True, webhook_url: str = "", **events: bool) -> NotificationSettings:
    """Turn notifications on for `user` (every event unless told otherwise)."""
    prefs, _ = NotificationSettings.objects.update_or_create(
        user=user,
        defaults={
            "email_enabled": email,
            "webhook_url": webhook_url,
            "on_end": events.get("on_end", True),
            "on_failure": events.get("on_failure", True),
            "on_qos_at_risk": events.get("on_qos_at_risk", True),
        },
    )
    return prefs


def job_with_deadline(owner, *, in_s: float = 3600.0, name: str = "train") -> Job:
    return submit(owner, name=name, qos_deadline_at=timezone.now() + timedelta(seconds=in_s))
