"""The Celery application: Redis broker, tasks discovered in each Django app's tasks.py."""

import os

from celery import Celery, signals

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")

app = Celery("attune")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()


@signals.worker_process_init.connect  # each prefork child, after the fork
@signals.worker_ready.connect  # the worker process itself (the solo pool runs tasks there)
def _freeze_startup_objects(**_kwargs) -> None:
    from config.gc_freeze import startup_objects_freeze

    startup_objects_freeze()
