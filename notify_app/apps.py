"""App config for notify_app: users' notification settings and the delivery record of each message."""

from django.apps import AppConfig


class NotifyAppConfig(AppConfig):
    name = "notify_app"
    verbose_name = "Notifications"
