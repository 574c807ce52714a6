"""Send a Celery task by its name, so that the code that sends it never imports the task's module."""

from __future__ import annotations

from typing import Any

from celery import current_app


def task_send(
    name: str,
    *,
    args: tuple[Any, ...] = (),
    kwargs: dict[str, Any] | None = None,
    countdown_s: float | None = None,
    expires_s: float | None = None,
) -> None:
    """Queue task `name`; with CELERY_TASK_ALWAYS_EAGER, run it here, as `Task.delay` would.

    `send_task` ignores the eager setting (Celery warns and queues), and the tests and the embedded demo
    rely on eager tasks running in the caller's process: in that mode the task is looked up in the
    registry, the apps' tasks modules loaded first if it is not there yet (Celery's autodiscovery).
    """
    app = current_app
    if app.conf.task_always_eager:
        if name not in app.tasks:
            app.loader.import_default_modules()
        app.tasks[name].apply_async(args=args, kwargs=kwargs, countdown=countdown_s, expires=expires_s)
        return
    app.send_task(name, args=args, kwargs=kwargs, countdown=countdown_s, expires=expires_s)
