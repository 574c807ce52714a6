"""infra.task_send: tasks sent by name go to the broker, or run here under CELERY_TASK_ALWAYS_EAGER."""

from __future__ import annotations

import pytest
from celery import current_app

from infra.task_send import task_send
from scheduler_app import task_names, tasks


def test_every_task_name_is_a_registered_task_of_that_name():
    names = {value for key, value in vars(task_names).items() if key.endswith("_TASK")}
    declared = {t.name for t in vars(tasks).values() if hasattr(t, "delay")}
    assert names == declared
    for name in names:
        assert current_app.tasks[name].name == name


def test_a_send_goes_to_the_broker_by_name_with_its_options(settings, monkeypatch):
    settings.CELERY_TASK_ALWAYS_EAGER = False
    sent = []
    monkeypatch.setattr(current_app, "send_task", lambda name, **options: sent.append((name, options)))
    task_send(task_names.WORKLOAD_PROFILE_TASK, args=(7,), countdown_s=2.5, expires_s=60)
    assert sent == [
        (
            task_names.WORKLOAD_PROFILE_TASK,
            {"args": (7,), "kwargs": None, "countdown": 2.5, "expires": 60},
        )
    ]


@pytest.mark.django_db
def test_an_eager_send_runs_the_task_here(settings, monkeypatch):
    settings.CELERY_TASK_ALWAYS_EAGER = True
    ran = []
    monkeypatch.setattr(tasks, "admission_forecasts_serve", lambda: ran.append(42))
    monkeypatch.setattr(current_app, "send_task", lambda *a, **k: pytest.fail("an eager send is no message"))
    task_send(task_names.ADMISSION_FORECAST_TASK, args=(42,))
    assert ran == [42]
