"""App config for scheduler_app: the work (jobs, QoS targets, allocations, rounds, simulations)."""

from django.apps import AppConfig


class SchedulerAppConfig(AppConfig):
    name = "scheduler_app"
    verbose_name = "Scheduler"
