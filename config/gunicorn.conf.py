"""gunicorn settings of the web tier, the same for the image, compose, the benches and the fault tests.

uvicorn workers on config.asgi: the agents' long-poll is held by asyncio at no cost per waiting agent,
and Django runs on each worker's pool of ATTUNE_WEB_THREADS threads with persistent connections.
"""

import multiprocessing
import os
from pathlib import Path

import environ

# The server's own options below come from .env too, as the settings do (config/settings.py), unless
# the environment sets them: a deployment without Docker puts ATTUNE_BIND there (docs/deploy.md).
environ.Env.read_env(Path(__file__).resolve().parent.parent / ".env", overwrite=False)

wsgi_app = "config.asgi:application"
bind = os.environ.get("ATTUNE_BIND", "0.0.0.0:8000")
worker_class = "uvicorn_worker.UvicornWorker"
# One process per core (measured: docs/performance.md, "The fleet"); more only adds context switches.
workers = int(os.environ.get("WEB_CONCURRENCY", max(2, multiprocessing.cpu_count())))
# Agents keep their connection between syncs (every 10 s): close idle ones only after several.
keepalive = int(os.environ.get("ATTUNE_KEEPALIVE_S", "75"))
graceful_timeout = 20
timeout = 60


def on_starting(server) -> None:
    """Before the first worker: with DEBUG=0, refuse a public or empty SECRET_KEY (config/secret_key.py)."""
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    from config.secret_key import secret_key_refuse  # noqa: PLC0415 - once the settings module is chosen

    secret_key_refuse()
