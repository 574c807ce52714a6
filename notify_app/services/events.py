"""Job events that create notifications: one row per channel the job's owner opted in to.

Flow: a job event (job_finish, the forecast) calls notification_job_ended / notification_qos_at_risk
in its transaction; they create one Notification row per channel the owner turned on (the unique
constraint keeps it to one per job, event and channel) and, after commit, hand each row to a worker
by task name (dispatch.py, notify_app.tasks). The task calls notification_deliver (delivery.py),
which claims the row, sends, and records the outcome; a retryable failure is tried again with
backoff, a bounded number of times.
"""

from __future__ import annotations

import logging
from datetime import datetime
from typing import Any

from django.db import transaction

from notify_app.models import Notification, NotificationChannel, NotificationEvent, NotificationSettings
from notify_app.services.dispatch import notifications_dispatch
from notify_app.services.settings import EVENT_FLAGS
from scheduler_app.models import Job, JobState

logger = logging.getLogger(__name__)

# Terminal states a user hears about as a failure. NODE_FAIL is listed although a node failure
# requeues the job today (scheduler_app/services/nodes.py): should it ever end a job, its owner hears
# of it.
FAILURE_STATES = frozenset(
    {JobState.FAILED, JobState.TIMEOUT, JobState.OUT_OF_MEMORY, JobState.NODE_FAIL, JobState.CANCELLED}
)
LIVE_STATES = frozenset({JobState.PENDING, JobState.RUNNING})


def _ended_event(job: Job, state: str, data: dict[str, Any]) -> str | None:
    if state == JobState.COMPLETED:
        return NotificationEvent.END
    if state == JobState.CANCELLED and data.get("cancelled_by_id") == job.owner_id:
        # job_cancel records who cancelled: owners need no message about their own cancel; staff
        # (or a cancel with nobody recorded) cancelling it is news to them.
        return None
    if state in FAILURE_STATES:
        return NotificationEvent.FAILURE
    return None


def notification_job_ended(
    *,
    job: Job,
    state: str,
    reason: str = "",
    data: dict[str, Any] | None = None,
    owner_settings: dict[int, NotificationSettings] | None = None,
) -> list[Notification]:
    """A job reached a terminal state (job_finish, in its transaction, or the applier after it):
    record the notifications its owner opted in to (end: COMPLETED; failure: the others, a cancel only
    when someone else did it) and send them after commit. Returns the rows created (none when nobody
    asked, or already sent). `owner_settings` (notification_settings_of) spares a caller ending many
    jobs a read per job; an owner missing from it has none."""
    event = _ended_event(job, state, data or {})
    if event is None:
        return []
    if owner_settings is not None and job.owner_id not in owner_settings:
        return []  # opt-in: no settings, no notification
    facts = {"state": str(state), "reason": reason}
    if job.exit_code is not None:
        facts["exit_code"] = job.exit_code
    if (data or {}).get("cancelled_by_id") is not None:
        facts["cancelled_by_id"] = data["cancelled_by_id"]
    prefs = owner_settings[job.owner_id] if owner_settings is not None else None
    return _notifications_create(job=job, event=event, data=facts, prefs=prefs)


@transaction.atomic
def notification_qos_at_risk(*, job: Job, predicted_finish_at: datetime | None) -> list[Notification]:
    """The forecast says this job will finish after its QoS deadline: tell its owner, once per job.

    Nothing without a deadline, without a predicted finish (unknown is not late), when the finish is
    in time, or once the job has ended. Safe to call on every forecast refresh: a job's owner hears
    of it once (later calls find the rows already there). Returns the rows created.
    """
    deadline_at = job.deadline_at
    if deadline_at is None or predicted_finish_at is None or predicted_finish_at <= deadline_at:
        return []
    if job.state not in LIVE_STATES:
        return []
    facts = {
        "state": str(job.state),
        "predicted_finish_at": predicted_finish_at.isoformat(),
        "deadline_at": deadline_at.isoformat(),
    }
    return _notifications_create(job=job, event=NotificationEvent.QOS_AT_RISK, data=facts)


def _channels(prefs: NotificationSettings | None, event: str) -> list[str]:
    """The channels on which `prefs` wants `event` (none without settings: notifications are opt-in)."""
    if prefs is None or not getattr(prefs, EVENT_FLAGS[event]):
        return []
    channels = []
    if prefs.email_enabled and (prefs.email or prefs.user.email):
        channels.append(NotificationChannel.EMAIL)
    if prefs.webhook_url:
        channels.append(NotificationChannel.WEBHOOK)
    return channels


def _notifications_create(
    *, job: Job, event: str, data: dict[str, Any], prefs: NotificationSettings | None = None
) -> list[Notification]:
    """The rows of `event` for the channels the owner's settings turn on (`prefs`: read if not given)."""
    if prefs is None:
        prefs = NotificationSettings.objects.select_related("user").filter(user_id=job.owner_id).first()
    channels = _channels(prefs, event)
    if not channels:
        return []
    created = []
    try:
        # A savepoint: whatever goes wrong here must not undo the caller's change (a job's end).
        with transaction.atomic():
            for channel in channels:
                # get_or_create inserts in a savepoint of its own: when a concurrent caller's row is
                # there first (the unique constraint), this one finds it, and only its creator sends.
                notification, new = Notification.objects.get_or_create(
                    job=job, event=event, channel=channel, defaults={"user_id": job.owner_id, "data": data}
                )
                if new:
                    created.append(notification)
    except Exception:
        logger.exception("job %s: could not record its %s notifications", job.pk, event)
        return []
    if created:
        ids = [n.pk for n in created]
        logger.info("job %s: %s notification(s) %s queued after commit", job.pk, event, ids)
        transaction.on_commit(lambda: notifications_dispatch(notification_ids=ids))
    return created
