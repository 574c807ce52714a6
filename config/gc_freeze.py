"""Move what a process loaded at start-up out of the garbage collector's way (gc.freeze).

A Django process holds about 140,000 tracked objects once its modules, URLconf and views are loaded,
nearly all of them for its whole life; Python's oldest-generation collection walks every one, about
75 ms on the dev machine, and under the GIL that pause stalls every thread of a web worker (each
sync, each long-poll answer) or a round in the Celery worker. Frozen objects are skipped by every
later collection. Called once per process after start-up (config/asgi.py, config/wsgi.py, the
Celery worker's process init), as the gc module's documentation suggests for long-lived servers.
"""

import gc
import logging

from django.urls import get_resolver

logger = logging.getLogger(__name__)


def startup_objects_freeze() -> int:
    """Load the URLconf (and with it every view and serializer), collect once, then freeze what is
    left; returns how many objects were frozen."""
    get_resolver().url_patterns  # noqa: B018  (imported lazily by Django on the first request otherwise)
    gc.collect()
    gc.freeze()
    frozen = gc.get_freeze_count()
    logger.debug("gc: %d start-up objects frozen", frozen)
    return frozen
