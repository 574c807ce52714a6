"""Reads of notify_app: a user's settings (saved or the defaults) and their recent notifications."""

from django.contrib.auth.models import AbstractBaseUser
from django.db.models import QuerySet

from notify_app.models import Notification, NotificationSettings


def notification_settings_of(*, user: AbstractBaseUser) -> NotificationSettings:
    """The user's saved settings, or the defaults (unsaved: everything off until they opt in)."""
    return NotificationSettings.objects.filter(user=user).first() or NotificationSettings(user=user)


def notification_list(*, user: AbstractBaseUser, limit: int = 20) -> QuerySet[Notification]:
    """The user's most recent notifications, newest first, with their jobs."""
    return Notification.objects.filter(user=user).select_related("job").order_by("-created_at", "-id")[:limit]
