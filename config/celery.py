"""The Celery application: Redis broker, tasks discovered in each Django app's tasks.py."""

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")

app = Celery("attune")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
