"""Notifications: who opted in to which job event, one delivery record each, and sending it once.

Flow: a job event (job_finish, the forecast) calls notification_job_ended / notification_qos_at_risk
in its transaction; they create one Notification row per channel the owner turned on (the unique
constraint keeps it to one per job, event and channel) and, after commit, hand each row to a worker
by task name (notify_app.tasks). The task calls notification_deliver, which claims the row, sends,
and records the outcome; a retryable failure is tried again with backoff, a bounded number of times.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from celery import current_app
from django.contrib.auth import get_user_model
from django.contrib.auth.models import AbstractBaseUser
from django.core.cache import cache
from django.core.exceptions import ValidationError
from django.db import connection, transaction
from django.db.models import F
from django.urls import reverse
from django.utils import timezone

from notify_app.addresses import REFUSED, webhook_url_refused
from notify_app.conf import NotifyConf, notify_conf
from notify_app.models import (
    Notification,
    NotificationChannel,
    NotificationEvent,
    NotificationSettings,
    NotificationState,
)
from notify_app.senders import (
    DeliveryError,
    Message,
    email_send,
    webhook_host,
    webhook_host_allowed,
    webhook_send,
)
from scheduler_app.models import Job, JobState

logger = logging.getLogger(__name__)

# By name: services never import tasks (tasks import services).
DELIVER_TASK = "notify_app.tasks.notification_deliver_task"

# Terminal states a user hears about as a failure. NODE_FAIL is listed although a node failure
# requeues the job today (services/nodes.py): should it ever end a job, its owner hears of it.
FAILURE_STATES = frozenset(
    {JobState.FAILED, JobState.TIMEOUT, JobState.OUT_OF_MEMORY, JobState.NODE_FAIL, JobState.CANCELLED}
)
LIVE_STATES = frozenset({JobState.PENDING, JobState.RUNNING})
# A try that has been `sending` this long is not in a live worker's hands any more (see resend).
SENDING_STALE_AFTER_S = 300
EVENT_FLAGS = {
    NotificationEvent.END: "on_end",
    NotificationEvent.FAILURE: "on_failure",
    NotificationEvent.QOS_AT_RISK: "on_qos_at_risk",
}


class NotificationTestThrottledError(Exception):
    """A test notification was sent moments ago: wait before sending another."""


# ---------------------------------------------------------------------------------------------------
# Settings
# ---------------------------------------------------------------------------------------------------


@transaction.atomic
def notification_settings_save(
    *,
    user: AbstractBaseUser,
    email_enabled: bool,
    email: str,
    webhook_url: str,
    on_end: bool,
    on_failure: bool,
    on_qos_at_risk: bool,
) -> NotificationSettings:
    """Create or update the user's settings; raises ValidationError (by field) when they are wrong."""
    prefs, _ = NotificationSettings.objects.select_for_update().get_or_create(user=user)
    prefs.email_enabled = email_enabled
    prefs.email = email.strip()
    prefs.webhook_url = webhook_url.strip()
    prefs.on_end, prefs.on_failure, prefs.on_qos_at_risk = on_end, on_failure, on_qos_at_risk
    prefs.full_clean(exclude=["user"])
    errors: dict[str, str] = {}
    if prefs.email_enabled and not (prefs.email or getattr(user, "email", "")):
        errors["email"] = "Your account has no email address: give one here, or turn emails off."
    conf = notify_conf()
    if prefs.webhook_url and not webhook_host_allowed(prefs.webhook_url, conf.webhook_hosts):
        errors["webhook_url"] = (
            f"Webhooks may only go to {', '.join(conf.webhook_hosts)} on this cluster "
            f"(not {webhook_host(prefs.webhook_url)})."
        )
    elif prefs.webhook_url and webhook_url_refused(prefs.webhook_url, conf.webhook_allowed_networks):
        errors["webhook_url"] = (
            f"Webhooks may not go to {webhook_host(prefs.webhook_url)}: {REFUSED}. Give a public URL "
            "(an operator can allow internal networks: ATTUNE_NOTIFY_WEBHOOK_ALLOWED_NETWORKS)."
        )
    if errors:
        raise ValidationError(errors)
    prefs.save()
    return prefs


# ---------------------------------------------------------------------------------------------------
# Events
# ---------------------------------------------------------------------------------------------------


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


def notification_settings_of(user_ids: Iterable[int]) -> dict[int, NotificationSettings]:
    """user -> their notification settings, for those of `user_ids` who have any, in one query."""
    rows = NotificationSettings.objects.select_related("user").filter(user_id__in=set(user_ids))
    return {prefs.user_id: prefs for prefs in rows}


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


# ---------------------------------------------------------------------------------------------------
# Delivery
# ---------------------------------------------------------------------------------------------------


def notifications_dispatch(*, notification_ids: Iterable[int]) -> None:
    """Hand committed notifications to a worker, by task name; call after commit.

    Inline mode (the embedded demo has no worker; eager Celery): deliver each on a daemon thread of
    this process instead, with the same claim, retries and backoff, so that the request or agent
    report that ended the job never waits for a mail server or a webhook. A broker outage leaves the
    rows pending (the admin's "send again" queues them) and never fails the caller.
    """
    conf = notify_conf()
    for notification_id in notification_ids:
        if conf.inline:
            threading.Thread(
                target=_deliver_inline, args=(notification_id,), name=f"notify-{notification_id}", daemon=True
            ).start()
            continue
        try:
            current_app.send_task(DELIVER_TASK, args=(notification_id,))
        except Exception:
            logger.warning(
                "could not queue notification %s: it stays pending", notification_id, exc_info=True
            )


def _deliver_inline(notification_id: int) -> None:
    try:
        while True:
            outcome = notification_deliver(notification_id=notification_id)
            if outcome.retry_in_s is None:
                return
            time.sleep(outcome.retry_in_s)
    except Exception:
        logger.exception("inline delivery of notification %s failed", notification_id)
    finally:
        connection.close()  # this thread's own connection


@dataclass(frozen=True)
class DeliveryOutcome:
    """What one delivery attempt did: the row's state after it (`missing`: no such row), whether this
    call sent the message, and, when it should be tried again, after how many seconds."""

    state: str
    sent_now: bool = False
    retry_in_s: float | None = None


def notification_deliver(*, notification_id: int) -> DeliveryOutcome:
    """Send one notification, at most once.

    1. Claim it: a conditional UPDATE pending -> sending (tries + 1), atomic on its own. Only one
       caller wins; a row already sending, sent or failed is left alone, so a retried, redelivered
       or duplicated task does nothing.
    2. Send it, outside any transaction: no row lock is held across the network.
    3. Record the outcome: sent; or, after a retryable failure, pending again with the error and a
       backoff (failed once `max_tries` tries were made); or failed after a permanent one.
    A worker that dies between 2 and 3 leaves the row `sending`, and nothing sends it again by itself
    (at most once: a duplicate is what this prevents); the admin's "send again" is an operator's
    decision to risk one.
    """
    conf = notify_conf()
    claimed = Notification.objects.filter(pk=notification_id, state=NotificationState.PENDING).update(
        state=NotificationState.SENDING, tries=F("tries") + 1, claimed_at=timezone.now()
    )
    if not claimed:
        state = Notification.objects.filter(pk=notification_id).values_list("state", flat=True).first()
        return DeliveryOutcome(state=state or "missing")
    notification = Notification.objects.select_related("job", "user").get(pk=notification_id)
    try:
        _send(notification, conf)
    except DeliveryError as exc:
        return _record_failure(notification, exc, conf)
    except Exception as exc:  # a bad backend setting, a bug: recorded, rather than left `sending`
        logger.exception("notification %s: unexpected error", notification_id)
        return _record_failure(
            notification, DeliveryError(f"{type(exc).__name__}: {exc}", retryable=False), conf
        )
    _record_sent(notification_id)
    logger.info(
        "notification %s sent (%s, job %s, %s)",
        notification_id,
        notification.event,
        notification.job_id,
        notification.channel,
    )
    return DeliveryOutcome(state=NotificationState.SENT, sent_now=True)


def _record_sent(notification_id: int) -> None:
    Notification.objects.filter(pk=notification_id, state=NotificationState.SENDING).update(
        state=NotificationState.SENT, sent_at=timezone.now(), last_error=""
    )


def _record_failure(notification: Notification, exc: DeliveryError, conf: NotifyConf) -> DeliveryOutcome:
    retry = exc.retryable and notification.tries < conf.max_tries
    state = NotificationState.PENDING if retry else NotificationState.FAILED
    Notification.objects.filter(pk=notification.pk, state=NotificationState.SENDING).update(
        state=state, last_error=str(exc)
    )
    delay = (
        min(conf.retry_backoff_max_s, conf.retry_backoff_s * 2 ** (notification.tries - 1)) if retry else None
    )
    logger.warning(
        "notification %s (job %s, %s) try %s/%s failed: %s%s",
        notification.pk,
        notification.job_id,
        notification.channel,
        notification.tries,
        conf.max_tries,
        exc,
        f"; again in {delay:g} s" if retry else "; giving up",
    )
    return DeliveryOutcome(state=state, retry_in_s=delay)


def _send(notification: Notification, conf: NotifyConf) -> None:
    """Send on the row's channel to where the user's settings say now (they may have changed since
    the event: a channel turned off meanwhile is respected)."""
    prefs = NotificationSettings.objects.filter(user_id=notification.user_id).first()
    if prefs is None or not getattr(prefs, EVENT_FLAGS[notification.event]):
        raise DeliveryError("this event was turned off before it was sent", retryable=False)
    message = _message(notification, conf)
    if notification.channel == NotificationChannel.EMAIL:
        to = prefs.email or notification.user.email
        if not prefs.email_enabled or not to:
            raise DeliveryError("emails were turned off before it was sent", retryable=False)
        email_send(to=to, message=message)
        return
    url = prefs.webhook_url
    if not url:
        raise DeliveryError("the webhook was removed before it was sent", retryable=False)
    if not webhook_host_allowed(url, conf.webhook_hosts):
        raise DeliveryError(f"webhook host {webhook_host(url)} is not allowed", retryable=False)
    webhook_send(
        url=url,
        message=message,
        timeout_s=conf.webhook_timeout_s,
        allowed_networks=conf.webhook_allowed_networks,
    )


# ---------------------------------------------------------------------------------------------------
# Messages
# ---------------------------------------------------------------------------------------------------


def _one_line(text: str) -> str:
    # Job names come from users: no line breaks in a mail header.
    return " ".join(str(text).split())


def _when(iso: str | None) -> str:
    if not iso:
        return "unknown"
    return timezone.localtime(datetime.fromisoformat(iso)).strftime("%Y-%m-%d %H:%M %Z")


def _message(notification: Notification, conf: NotifyConf) -> Message:
    job, data = notification.job, notification.data
    url = f"{conf.site_url}{reverse('web:job', args=[job.pk])}"
    what = f"Job {job.pk} ({_one_line(job.name)})"
    state = data.get("state", job.state)
    reason = data.get("reason", "")
    if notification.event == NotificationEvent.END:
        summary = f"{what} completed"
    elif notification.event == NotificationEvent.QOS_AT_RISK:
        summary = (
            f"{what} is predicted to miss its deadline: finish {_when(data.get('predicted_finish_at'))}, "
            f"deadline {_when(data.get('deadline_at'))}"
        )
    elif state == JobState.CANCELLED:
        by = get_user_model().objects.filter(pk=data.get("cancelled_by_id")).first()
        summary = f"{what} was cancelled" + (f" by {by.get_username()}" if by is not None else "")
    else:
        summary = f"{what} ended {state}" + (f" ({reason})" if reason else "")
    return Message(
        subject=f"[Attune] {summary}",
        text=f"{summary}.\n{url}",
        key=f"attune-notification-{notification.pk}",
        fields={
            "event": notification.event,
            "job_id": job.pk,
            "job_name": job.name,
            "state": state,
            "reason": reason,
            "url": url,
            "user": notification.user.get_username(),
            "notification_id": notification.pk,
        },
    )


def notification_test_send(*, user: AbstractBaseUser) -> list[tuple[str, str]]:
    """Send a test message now, on each channel the user's saved settings turn on; (channel, outcome)
    pairs, where the outcome is "sent" or why not. Raises NotificationTestThrottledError when the user
    sent one moments ago (the button must not make the service a mail or HTTP cannon)."""
    conf = notify_conf()
    if not cache.add(f"notify-test:{user.pk}", 1, timeout=conf.test_interval_s):
        raise NotificationTestThrottledError(
            f"A test notification was sent less than {conf.test_interval_s:g} s ago."
        )
    prefs = NotificationSettings.objects.filter(user=user).first()
    url = f"{conf.site_url}{reverse('notify:settings')}"
    text = f"A test notification from Attune for {user.get_username()}: this channel works."
    message = Message(
        subject="[Attune] Test notification",
        text=f"{text}\n{url}",
        key=f"attune-test-{user.pk}-{int(time.time())}",
        fields={"event": "test", "url": url, "user": user.get_username()},
    )
    results: list[tuple[str, str]] = []
    to = (prefs.email or getattr(user, "email", "")) if prefs is not None else ""
    if prefs is not None and prefs.email_enabled and to:
        results.append((NotificationChannel.EMAIL, _try(lambda: email_send(to=to, message=message))))
    if prefs is not None and prefs.webhook_url:
        if webhook_host_allowed(prefs.webhook_url, conf.webhook_hosts):
            outcome = _try(
                lambda: webhook_send(
                    url=prefs.webhook_url,
                    message=message,
                    timeout_s=conf.webhook_timeout_s,
                    allowed_networks=conf.webhook_allowed_networks,
                )
            )
        else:
            outcome = f"webhook host {webhook_host(prefs.webhook_url)} is not allowed"
        results.append((NotificationChannel.WEBHOOK, outcome))
    return results


def _try(send) -> str:
    try:
        send()
    except DeliveryError as exc:
        return str(exc)
    except Exception as exc:  # a misconfigured mail backend: say so on the page, not as a 500
        logger.exception("test notification failed")
        return f"{type(exc).__name__}: {exc}"
    return "sent"


# ---------------------------------------------------------------------------------------------------
# Operators
# ---------------------------------------------------------------------------------------------------


def notifications_resend(*, notification_ids: Iterable[int]) -> int:
    """Put unsent notifications (failed; pending; `sending` for longer than SENDING_STALE_AFTER_S, left
    by a dead worker) back to pending with fresh tries and queue them after commit; returns how many.
    Never a sent one.

    For a `sending` row this may send a message that the dead worker had already sent: the admin
    action that calls this says so.
    """
    # A row claimed moments ago may be in a live worker's hands right now: only older claims count
    # as left by a dead worker (a try lasts at most a connection timeout or two).
    stale_before = timezone.now() - timedelta(seconds=SENDING_STALE_AFTER_S)
    with transaction.atomic():
        ids = list(
            Notification.objects.select_for_update()
            .filter(pk__in=list(notification_ids))
            .exclude(state=NotificationState.SENT)
            .exclude(state=NotificationState.SENDING, claimed_at__gte=stale_before)
            .values_list("pk", flat=True)
        )
        Notification.objects.filter(pk__in=ids).update(
            state=NotificationState.PENDING, tries=0, claimed_at=None, last_error=""
        )
        if ids:
            transaction.on_commit(lambda: notifications_dispatch(notification_ids=ids))
    return len(ids)
