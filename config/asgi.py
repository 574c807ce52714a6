"""ASGI entry point, what the image runs (gunicorn with uvicorn workers): the agents' long-poll
(config/agent_wait.py) natively async; the agents' well-formed register and sync calls answered beside
Django's request cycle (config/agent_calls.py) and every other request by Django's WSGI application,
both on a pool of threads (config/wsgi_bridge.py: one hand-over between the loop and a thread per
request). Threads that live as long as the process keep Django's persistent database connections
(CONN_MAX_AGE); Django's own ASGI handler would open one per request.
"""

import os

from django.core.wsgi import get_wsgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
django_wsgi = get_wsgi_application()

from django.conf import settings  # noqa: E402  (after the settings module is chosen)

from config.agent_calls import AgentCallsFirst  # noqa: E402
from config.agent_wait import WAIT_PATH, agent_wait_app, wake_hub  # noqa: E402
from config.gc_freeze import startup_objects_freeze  # noqa: E402
from config.wsgi_bridge import BufferedWSGI  # noqa: E402

django_app = BufferedWSGI(AgentCallsFirst(django_wsgi), workers=settings.ATTUNE_WEB_THREADS)
startup_objects_freeze()  # last: what is loaded by now lives as long as the process


async def application(scope, receive, send):
    if scope["type"] == "lifespan":
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await wake_hub().close()
                await send({"type": "lifespan.shutdown.complete"})
                return
    if scope["type"] == "http" and scope["path"] == WAIT_PATH:
        await agent_wait_app(scope, receive, send)
        return
    await django_app(scope, receive, send)
