"""Delivery against a real SMTP server and a real HTTP receiver: one message per event, retried after
a refused connection or a 5xx, bounded, and never duplicated (task run twice, redelivered, a worker
dying after sending)."""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest
from celery.exceptions import Retry
from django.db import connection

from notify_app.models import Notification, NotificationChannel, NotificationEvent, NotificationState
from notify_app.services import delivery
from notify_app.services.delivery import notification_deliver
from notify_app.services.events import notification_job_ended, notification_qos_at_risk
from notify_app.tasks import notification_deliver_task
from scheduler_app.models import JobState
from tests.api.helpers import make_server, submit
from tests.notify_app.helpers import job_with_deadline, opt_in
from tests.notify_app.receivers import HttpReceiver, SmtpSink, email_settings, free_port, subjects

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def cluster(db):
    return make_server("gpu01")


def notify(owner, *, state=JobState.FAILED, reason="exit_1", **settings) -> list[Notification]:
    opt_in(owner, **settings)
    job = submit(owner, name="resnet\nsweep")  # a line break in a name must not break a mail header
    return notification_job_ended(job=job, state=state, reason=reason)


def state_of(n: Notification) -> tuple[str, int]:
    n.refresh_from_db()
    return n.state, n.tries


def test_one_email_and_one_webhook_per_event(owner, smtp, receiver, queued):
    notes = notify(owner, webhook_url=receiver.url)
    for n in notes:
        assert notification_deliver_task.apply(args=(n.pk,)).get() == NotificationState.SENT
    job = notes[0].job
    (mail,) = smtp.messages
    assert mail["Subject"] == f"[Attune] Job {job.pk} (resnet sweep) ended FAILED (exit_1)"
    assert mail["X-Envelope-To"] == "alice@example.org"
    assert f"https://attune.example.org/jobs/{job.pk}/" in mail.get_payload()
    (hook,) = receiver.requests
    assert hook.path == "/hook/secret-token"
    assert hook.headers["Content-Type"] == "application/json"
    assert hook.body["text"].startswith(f"Job {job.pk} (resnet sweep) ended FAILED (exit_1).")
    assert {k: hook.body[k] for k in ("event", "job_id", "state", "reason", "url", "user")} == {
        "event": "failure",
        "job_id": job.pk,
        "state": "FAILED",
        "reason": "exit_1",
        "url": f"https://attune.example.org/jobs/{job.pk}/",
        "user": "alice",
    }
    by_channel = {n.channel: n.pk for n in notes}
    assert mail["X-Attune-Notification"] == f"attune-notification-{by_channel['email']}"
    assert hook.headers["Idempotency-Key"] == f"attune-notification-{by_channel['webhook']}"
    for n in notes:
        n.refresh_from_db()
        assert (n.state, n.tries, n.last_error) == (NotificationState.SENT, 1, "")
        assert n.sent_at is not None


def test_the_messages_of_each_event(owner, smtp, queued):
    opt_in(owner)
    done = notification_job_ended(job=submit(owner, name="a"), state=JobState.COMPLETED)[0]
    job = job_with_deadline(owner, name="b")
    late = notification_qos_at_risk(job=job, predicted_finish_at=job.deadline_at + timedelta(hours=2))[0]
    for n in (done, late):
        notification_deliver(notification_id=n.pk)
    assert subjects(smtp.messages)[0] == f"[Attune] Job {done.job_id} (a) completed"
    assert subjects(smtp.messages)[1].startswith(
        f"[Attune] Job {job.pk} (b) is predicted to miss its deadline: "
    )


def test_running_the_task_again_sends_nothing(owner, smtp, receiver, queued):
    for n in notify(owner, webhook_url=receiver.url):
        assert notification_deliver(notification_id=n.pk).sent_now
        again = notification_deliver(notification_id=n.pk)  # a duplicate or redelivered task
        assert (again.state, again.sent_now, again.retry_in_s) == (NotificationState.SENT, False, None)
        assert notification_deliver_task.apply(args=(n.pk,)).get() == NotificationState.SENT
    assert len(smtp.messages) == 1 and len(receiver.requests) == 1


def test_a_refused_webhook_connection_is_retried(owner, queued):
    port = free_port()  # nothing listens there yet: the first try is refused
    (n,) = notify(owner, email=False, webhook_url=f"http://127.0.0.1:{port}/hook")
    first = notification_deliver(notification_id=n.pk)
    assert first.state == NotificationState.PENDING and first.retry_in_s == 0.0
    n.refresh_from_db()
    # Said generically: a refused port and an open one that hangs up read the same (test_addresses.py).
    assert n.tries == 1 and n.last_error == (
        "could not deliver to webhook 127.0.0.1: the endpoint did not answer or refused the connection"
    )
    assert "/hook" not in n.last_error  # the URL's path may be a secret
    receiver = HttpReceiver(port=port).start()
    try:
        assert notification_deliver(notification_id=n.pk).sent_now
    finally:
        receiver.stop()
    assert len(receiver.requests) == 1
    assert state_of(n) == (NotificationState.SENT, 2)


def test_a_refused_smtp_connection_is_retried(owner, settings, queued):
    port = free_port()
    email_settings(settings, port)
    (n,) = notify(owner)
    assert notification_deliver(notification_id=n.pk).state == NotificationState.PENDING
    n.refresh_from_db()
    assert "SMTP connection failed" in n.last_error
    sink = SmtpSink(port=port).start()
    try:
        assert notification_deliver(notification_id=n.pk).sent_now
    finally:
        sink.stop()
    assert len(sink.messages) == 1 and state_of(n) == (NotificationState.SENT, 2)


def test_a_500_then_success(owner, receiver, queued):
    receiver.statuses = [500]
    (n,) = notify(owner, email=False, webhook_url=receiver.url)
    assert notification_deliver(notification_id=n.pk).retry_in_s is not None
    n.refresh_from_db()
    assert n.last_error == "webhook 127.0.0.1 answered HTTP 500"
    assert notification_deliver(notification_id=n.pk).sent_now
    assert [r.status for r in receiver.requests] == [500, 200] and len(receiver.delivered) == 1


def test_a_451_from_the_mail_server_then_success(owner, smtp, queued):
    smtp.refuse_next = 1
    (n,) = notify(owner)
    assert notification_deliver(notification_id=n.pk).state == NotificationState.PENDING
    n.refresh_from_db()
    assert n.last_error.startswith("SMTP 451")
    assert notification_deliver(notification_id=n.pk).sent_now
    assert smtp.refused == 1 and len(smtp.messages) == 1


def test_tries_are_bounded(owner, receiver, queued):
    receiver.statuses = [503] * 10
    (n,) = notify(owner, email=False, webhook_url=receiver.url)
    outcomes = [notification_deliver(notification_id=n.pk) for _ in range(5)]
    assert [o.state for o in outcomes] == ["pending", "pending", "failed", "failed", "failed"]
    assert outcomes[2].retry_in_s is None
    assert len(receiver.requests) == 3 and state_of(n) == (NotificationState.FAILED, 3)


def test_backoff_doubles_up_to_its_cap(owner, settings, queued):
    settings.ATTUNE_NOTIFY = {
        **settings.ATTUNE_NOTIFY,
        "max_tries": 6,
        "retry_backoff_s": 10.0,
        "retry_backoff_max_s": 35.0,
    }
    (n,) = notify(owner, email=False, webhook_url=f"http://127.0.0.1:{free_port()}/")
    delays = [notification_deliver(notification_id=n.pk).retry_in_s for _ in range(6)]
    assert delays == [10.0, 20.0, 35.0, 35.0, 35.0, None]


def test_the_task_retries_with_the_backoff(owner, settings, monkeypatch, queued):
    settings.ATTUNE_NOTIFY = {**settings.ATTUNE_NOTIFY, "retry_backoff_s": 7.0}
    (n,) = notify(owner, email=False, webhook_url=f"http://127.0.0.1:{free_port()}/")
    asked = []

    def retry(**kwargs) -> Retry:
        asked.append(kwargs)
        return Retry()

    monkeypatch.setattr(notification_deliver_task, "retry", retry)
    with pytest.raises(Retry):
        notification_deliver_task.run(n.pk)
    assert asked == [{"countdown": 7.0}]


def test_eager_task_retries_until_the_bound(owner, receiver, queued):
    receiver.statuses = [500] * 10
    (n,) = notify(owner, email=False, webhook_url=receiver.url)
    notification_deliver_task.apply(args=(n.pk,))  # eager: Celery runs each retry at once
    assert len(receiver.requests) == 3 and state_of(n) == (NotificationState.FAILED, 3)


def test_a_4xx_is_not_retried(owner, receiver, queued):
    receiver.statuses = [404]
    (n,) = notify(owner, email=False, webhook_url=receiver.url)
    outcome = notification_deliver(notification_id=n.pk)
    assert outcome.state == NotificationState.FAILED and outcome.retry_in_s is None
    assert notification_deliver(notification_id=n.pk).state == NotificationState.FAILED
    assert len(receiver.requests) == 1


def test_a_worker_dying_after_sending_never_sends_twice(owner, smtp, receiver, monkeypatch, queued):
    notes = notify(owner, webhook_url=receiver.url)

    def die(notification_id: int) -> None:
        raise SystemExit("worker killed after sending, before recording it")

    with monkeypatch.context() as m:
        m.setattr(delivery, "_record_sent", die)
        for n in notes:
            with pytest.raises(SystemExit):
                notification_deliver_task.run(n.pk)
    # The broker hands the unacknowledged task to another worker (acks_late): it finds the row claimed.
    for n in notes:
        assert notification_deliver_task.apply(args=(n.pk,)).get() == NotificationState.SENDING
        assert state_of(n) == (NotificationState.SENDING, 1)
    assert len(smtp.messages) == 1 and len(receiver.requests) == 1


def test_a_channel_turned_off_before_sending_is_not_used(owner, receiver, queued):
    (n,) = notify(owner, email=False, webhook_url=receiver.url)
    opt_in(owner, email=False, webhook_url="")
    assert notification_deliver(notification_id=n.pk).state == NotificationState.FAILED
    n.refresh_from_db()
    assert n.last_error == "the webhook was removed before it was sent" and receiver.requests == []


def test_a_webhook_host_outside_the_allowed_ones_is_refused(owner, settings, receiver, queued):
    (n,) = notify(owner, email=False, webhook_url=receiver.url)
    settings.ATTUNE_NOTIFY = {**settings.ATTUNE_NOTIFY, "webhook_hosts": ["hooks.slack.com"]}
    assert notification_deliver(notification_id=n.pk).state == NotificationState.FAILED
    assert receiver.requests == []


def test_a_missing_row_is_nothing_to_do(queued):
    assert notification_deliver(notification_id=987654).state == "missing"


@pytest.mark.django_db(transaction=True)
def test_two_workers_at_once_send_one_message(owner, receiver, queued):
    (n,) = notify(owner, email=False, webhook_url=receiver.url)
    barrier = threading.Barrier(4)
    outcomes = []

    def worker() -> None:
        try:
            barrier.wait()
            outcomes.append(notification_deliver(notification_id=n.pk))
        finally:
            connection.close()

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sum(o.sent_now for o in outcomes) == 1
    assert len(receiver.requests) == 1 and state_of(n) == (NotificationState.SENT, 1)


@pytest.mark.django_db(transaction=True)
def test_inline_mode_delivers_on_a_thread_after_commit(owner, settings, receiver):
    """The embedded demo has no worker: the committed job end is delivered by a thread, with retries."""
    settings.ATTUNE_NOTIFY = {**settings.ATTUNE_NOTIFY, "inline": True}
    receiver.statuses = [502]
    opt_in(owner, email=False, webhook_url=receiver.url)
    job = submit(owner)
    from scheduler_app.services.job_control import job_finish

    job_finish(job=job, state=JobState.COMPLETED)  # its own transaction: committed on return
    n = Notification.objects.get(job=job)
    assert (n.event, n.channel) == (NotificationEvent.END, NotificationChannel.WEBHOOK)
    for _ in range(100):
        if state_of(n)[0] == NotificationState.SENT:
            break
        threading.Event().wait(0.05)
    assert state_of(n) == (NotificationState.SENT, 2)
    assert [r.status for r in receiver.requests] == [502, 200]


def test_a_cancel_by_someone_else_says_who(owner, staff_user, smtp, queued):
    from scheduler_app.services.job_control import job_cancel

    opt_in(owner)
    job = submit(owner, name="c")
    job_cancel(job=job, by=staff_user)
    notification_deliver(notification_id=Notification.objects.get(job=job).pk)
    assert subjects(smtp.messages) == [f"[Attune] Job {job.pk} (c) was cancelled by {staff_user.username}"]
