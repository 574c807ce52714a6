"""A job's end notifies its owner through a real Celery worker: one email and one webhook, the webhook
retried by the worker after a 500, each recorded as sent once."""

from __future__ import annotations

import pytest

from notify_app.models import Notification, NotificationState
from scheduler_app.models import JobState
from scheduler_app.services.job_control import job_finish
from tests.api.helpers import make_server, started, submit
from tests.e2e.conftest import WORKER_ENV
from tests.e2e.processes import CeleryWorker, wait_until
from tests.factories import UserFactory
from tests.notify_app.helpers import opt_in
from tests.notify_app.receivers import HttpReceiver, SmtpSink

pytestmark = pytest.mark.e2e


@pytest.fixture
def smtp():
    sink = SmtpSink().start()
    yield sink
    sink.stop()


@pytest.fixture
def receiver():
    r = HttpReceiver().start()
    yield r
    r.stop()


@pytest.fixture
def notify_worker(e2e_ready, live_settings, tmp_path, smtp):
    """A worker whose mail goes to the local SMTP sink, retrying notifications after half a second."""
    w = CeleryWorker(
        tmp_path,
        **WORKER_ENV,
        EMAIL_BACKEND="django.core.mail.backends.smtp.EmailBackend",
        EMAIL_HOST="127.0.0.1",
        EMAIL_PORT=str(smtp.port),
        ATTUNE_SITE_URL="https://attune.example.org",
        ATTUNE_NOTIFY_RETRY_BACKOFF_S="0.5",
        ATTUNE_NOTIFY_MAX_TRIES="3",
        ATTUNE_NOTIFY_INLINE="0",
        # The receiver listens on loopback, which webhooks may not reach unless allowed.
        ATTUNE_NOTIFY_WEBHOOK_ALLOWED_NETWORKS="127.0.0.0/8",
    )
    yield w
    w.stop()


def test_a_failed_job_notifies_through_a_real_worker(notify_worker, settings, smtp, receiver):
    settings.ATTUNE_NOTIFY = {**settings.ATTUNE_NOTIFY, "inline": False}
    make_server("gpu01")
    owner = UserFactory(username="alice", email="alice@example.org")
    opt_in(owner, webhook_url=receiver.url)
    receiver.statuses = [500]  # the worker's first POST fails; its retry succeeds
    job = started(submit(owner, name="sweep"))  # a job fails from RUNNING
    job_finish(job=job, state=JobState.FAILED, reason="exit_3")  # commits: the tasks go to the broker

    def both_sent() -> bool:
        return Notification.objects.filter(job=job, state=NotificationState.SENT).count() == 2

    try:
        wait_until(both_sent, timeout_s=60, what="both notifications to be sent by the worker")
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{notify_worker.log_path.read_text()[-3000:]}") from None
    tries = dict(Notification.objects.filter(job=job).values_list("channel", "tries"))
    assert tries == {"email": 1, "webhook": 2}
    assert [r.status for r in receiver.requests] == [500, 200]
    assert receiver.requests[1].body["job_id"] == job.pk and receiver.requests[1].body["state"] == "FAILED"
    (mail,) = smtp.messages
    assert mail["Subject"] == f"[Attune] Job {job.pk} (sweep) ended FAILED (exit_3)"
    assert f"https://attune.example.org/jobs/{job.pk}/" in mail.get_payload()
