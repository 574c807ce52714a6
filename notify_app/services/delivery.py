"""Delivering one notification at most once: claim the row, send it on its channel, record the outcome."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime

from django.contrib.auth import get_user_model
from django.db.models import F
from django.urls import reverse
from django.utils import timezone

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
from notify_app.services.settings import EVENT_FLAGS
from scheduler_app.models import JobState

logger = logging.getLogger(__name__)


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
