"""Fixtures for notification tests: fast retries, a recorded task queue, an SMTP sink, a webhook receiver."""

from __future__ import annotations

import pytest

from tests.notify_app.receivers import HttpReceiver, SmtpSink, email_settings


@pytest.fixture(autouse=True)
def notify_settings(settings):
    """Worker mode (not inline), retries without waiting, three tries."""
    settings.ATTUNE_NOTIFY = {
        **settings.ATTUNE_NOTIFY,
        "site_url": "https://attune.example.org",
        "max_tries": 3,
        "retry_backoff_s": 0.0,
        "inline": False,
        "webhook_hosts": [],
        # The receivers listen on loopback, which webhooks may not reach unless allowed (test_addresses.py
        # takes this away again).
        "webhook_allowed_networks": ["127.0.0.0/8"],
    }
    return settings


@pytest.fixture
def queued(monkeypatch):
    """The notification ids handed to Celery (by task name), instead of a broker."""
    from config import celery_app

    sent: list[int] = []

    def send_task(name, args=(), **kwargs):
        assert name == "notify_app.tasks.notification_deliver_task"
        sent.extend(args)

    monkeypatch.setattr(celery_app, "send_task", send_task)
    return sent


@pytest.fixture
def smtp(settings):
    sink = SmtpSink().start()
    email_settings(settings, sink.port)
    yield sink
    sink.stop()


@pytest.fixture
def receiver():
    r = HttpReceiver().start()
    yield r
    r.stop()


@pytest.fixture
def owner(db):
    from tests.factories import UserFactory

    return UserFactory(username="alice", email="alice@example.org")
