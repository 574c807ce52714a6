"""App config for scheduler_app: the work (jobs, QoS targets, allocations, rounds, simulations)."""

from django.apps import AppConfig


class SchedulerAppConfig(AppConfig):
    name = "scheduler_app"
    verbose_name = "Scheduler"

    def ready(self) -> None:
        # Imported here: services import models, which Django loads only after every app's config.
        from scheduler_app.services.round_requests import inline_round_runner_set  # noqa: PLC0415 - after models load
        from scheduler_app.services.rounds import scheduling_round_run  # noqa: PLC0415 - after models load

        # Inline mode (embedded demo) runs a requested round in the requester's process; round_requests
        # sits below the round, so the round is handed to it here rather than imported by it.
        inline_round_runner_set(scheduling_round_run)
