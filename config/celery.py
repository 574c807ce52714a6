"""The Celery application: Redis broker, tasks discovered in each Django app's tasks.py."""

import os

from celery import Celery, signals

from config.gc_freeze import startup_objects_freeze
from config.secret_key import secret_key_refuse

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")

app = Celery("attune")
app.config_from_object("django.conf:settings", namespace="CELERY")
# Set on the app, not in settings: these keep every worker alive through Redis outages, whatever a
# deployment configures. Celery's consumer exits when Redis goes away while it holds an unacked message
# (config/celery_consumer.py says why), and its reconnection gives up after 100 attempts (some 50
# minutes of backoff) by default, leaving a worker that exited: retried for as long as Redis is away.
app.conf.worker_consumer = "config.celery_consumer:Consumer"
app.conf.broker_connection_max_retries = None
app.autodiscover_tasks()


@signals.worker_process_init.connect  # each prefork child, after the fork
@signals.worker_ready.connect  # the worker process itself (the solo pool runs tasks there)
def _freeze_startup_objects(**_kwargs) -> None:
    startup_objects_freeze()


@signals.worker_init.connect
@signals.beat_init.connect
def _refuse_public_secret_key(**_kwargs) -> None:
    """With DEBUG=0 a worker or beat does not start on a public or empty SECRET_KEY (config/secret_key.py)."""
    secret_key_refuse()
