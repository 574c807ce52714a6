"""Which job events make which notifications, for whom, once, and only after commit."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import transaction

from notify_app.models import Notification, NotificationChannel, NotificationEvent, NotificationState
from notify_app.services.events import notification_job_ended, notification_qos_at_risk
from scheduler_app.models import JobState
from scheduler_app.services.job_control import job_cancel, job_finish
from tests.api.helpers import make_server, started, submit
from tests.factories import UserFactory
from tests.notify_app.helpers import job_with_deadline, opt_in

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def cluster(db):
    return make_server("gpu01")


def rows(job) -> set[tuple[str, str]]:
    return set(Notification.objects.filter(job=job).values_list("event", "channel"))


@pytest.mark.parametrize(
    ("state", "event"),
    [
        (JobState.COMPLETED, NotificationEvent.END),
        (JobState.FAILED, NotificationEvent.FAILURE),
        (JobState.TIMEOUT, NotificationEvent.FAILURE),
        (JobState.OUT_OF_MEMORY, NotificationEvent.FAILURE),
    ],
)
def test_a_job_end_queues_one_notification_per_channel_after_commit(
    owner, queued, django_capture_on_commit_callbacks, state, event
):
    opt_in(owner, webhook_url="https://hooks.example.org/x")
    job = started(submit(owner))  # a job ends from RUNNING
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        job_finish(job=job, state=state, reason="exit_1" if state == JobState.FAILED else "")
    assert rows(job) == {(event, NotificationChannel.EMAIL), (event, NotificationChannel.WEBHOOK)}
    assert queued == []  # nothing leaves before the job's end is committed
    for callback in callbacks:
        callback()
    assert sorted(queued) == sorted(Notification.objects.filter(job=job).values_list("pk", flat=True))
    n = Notification.objects.filter(job=job).first()
    assert n.user == owner and n.state == NotificationState.PENDING and n.tries == 0
    assert n.data["state"] == state


def test_node_fail_counts_as_a_failure(owner, queued):
    opt_in(owner)
    job = submit(owner)
    (n,) = notification_job_ended(job=job, state=JobState.NODE_FAIL, reason="node_down")
    assert n.event == NotificationEvent.FAILURE


def test_nothing_is_recorded_when_the_job_ends_in_a_rolled_back_transaction(
    owner, queued, django_capture_on_commit_callbacks
):
    opt_in(owner)
    job = submit(owner)
    with django_capture_on_commit_callbacks(execute=True), pytest.raises(RuntimeError), transaction.atomic():
        job_finish(job=job, state=JobState.COMPLETED)
        raise RuntimeError("the caller fails after job_finish")
    assert rows(job) == set() and queued == []


def test_notifications_are_opt_in(owner, queued, django_capture_on_commit_callbacks):
    job = started(submit(owner))
    with django_capture_on_commit_callbacks(execute=True):
        job_finish(job=job, state=JobState.FAILED)
    assert rows(job) == set() and queued == []


def test_only_the_channels_and_events_turned_on(owner, queued):
    opt_in(owner, email=False, webhook_url="https://hooks.example.org/x", on_end=False)
    done, failed = submit(owner), submit(owner)
    assert notification_job_ended(job=done, state=JobState.COMPLETED) == []
    (n,) = notification_job_ended(job=failed, state=JobState.FAILED)
    assert (n.event, n.channel) == (NotificationEvent.FAILURE, NotificationChannel.WEBHOOK)


def test_email_needs_an_address(queued):
    user = UserFactory(username="noaddress", email="")
    opt_in(user)
    assert notification_job_ended(job=submit(user), state=JobState.COMPLETED) == []
    prefs = opt_in(user)
    prefs.email = "elsewhere@example.org"
    prefs.save()
    (n,) = notification_job_ended(job=submit(user), state=JobState.COMPLETED)
    assert n.channel == NotificationChannel.EMAIL


def test_one_event_is_recorded_once(owner, queued, django_capture_on_commit_callbacks):
    opt_in(owner)
    job = submit(owner)
    with django_capture_on_commit_callbacks(execute=True):
        first = notification_job_ended(job=job, state=JobState.FAILED)
        again = notification_job_ended(job=job, state=JobState.FAILED)
    assert len(first) == 1 and again == []
    assert queued == [first[0].pk]
    assert Notification.objects.filter(job=job).count() == 1


def test_cancelling_your_own_job_sends_nothing(owner, queued, django_capture_on_commit_callbacks):
    opt_in(owner)
    job = submit(owner)
    with django_capture_on_commit_callbacks(execute=True):
        job_cancel(job=job, by=owner)
    assert rows(job) == set()
    assert job.events.get(kind="cancelled").data == {"cancelled_by_id": owner.pk}


def test_a_cancel_by_someone_else_is_a_failure(owner, staff_user, queued, django_capture_on_commit_callbacks):
    opt_in(owner)
    by_staff, by_nobody = submit(owner), submit(owner)
    with django_capture_on_commit_callbacks(execute=True):
        job_cancel(job=by_staff, by=staff_user)
        job_cancel(job=by_nobody)
    assert rows(by_staff) == {(NotificationEvent.FAILURE, NotificationChannel.EMAIL)}
    assert rows(by_nobody) == {(NotificationEvent.FAILURE, NotificationChannel.EMAIL)}
    assert Notification.objects.get(job=by_staff).data["state"] == JobState.CANCELLED
    assert len(queued) == 2


def test_qos_at_risk_once_per_job(owner, queued, django_capture_on_commit_callbacks):
    opt_in(owner, webhook_url="https://hooks.example.org/x")
    job = job_with_deadline(owner, in_s=3600)
    late = job.deadline_at + timedelta(minutes=30)
    with django_capture_on_commit_callbacks(execute=True):
        created = notification_qos_at_risk(job=job, predicted_finish_at=late)
        # The forecast refresh calls it after every round: later calls add nothing.
        assert notification_qos_at_risk(job=job, predicted_finish_at=late + timedelta(hours=1)) == []
    assert {n.channel for n in created} == {NotificationChannel.EMAIL, NotificationChannel.WEBHOOK}
    assert sorted(queued) == sorted(n.pk for n in created)
    n = created[0]
    assert n.event == NotificationEvent.QOS_AT_RISK
    assert n.data["predicted_finish_at"] == late.isoformat()
    assert n.data["deadline_at"] == job.deadline_at.isoformat()


def test_qos_at_risk_only_when_late_and_live(owner, queued):
    opt_in(owner)
    job = job_with_deadline(owner, in_s=3600)
    assert notification_qos_at_risk(job=job, predicted_finish_at=job.deadline_at) == []  # in time
    assert notification_qos_at_risk(job=job, predicted_finish_at=None) == []  # unknown is not late
    no_deadline = submit(owner)
    assert notification_qos_at_risk(job=no_deadline, predicted_finish_at=job.deadline_at) == []
    job_finish(job=job, state=JobState.COMPLETED)
    assert notification_qos_at_risk(job=job, predicted_finish_at=job.deadline_at + timedelta(hours=1)) == []
    assert not Notification.objects.filter(event=NotificationEvent.QOS_AT_RISK).exists()


def test_qos_at_risk_respects_the_event_setting(owner, queued):
    opt_in(owner, on_qos_at_risk=False)
    job = job_with_deadline(owner)
    assert notification_qos_at_risk(job=job, predicted_finish_at=job.deadline_at + timedelta(hours=1)) == []


def test_a_failure_to_record_never_undoes_the_job_end(owner, queued, monkeypatch):
    from django.db import DatabaseError

    opt_in(owner)
    job = started(submit(owner))

    def broken(**kwargs):
        raise DatabaseError("notification table unavailable")

    monkeypatch.setattr(Notification.objects, "get_or_create", broken)
    job_finish(job=job, state=JobState.FAILED)
    job.refresh_from_db()
    assert job.state == JobState.FAILED and job.events.filter(kind="failed").exists()
    assert queued == []
