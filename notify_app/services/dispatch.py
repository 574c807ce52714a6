"""Handing committed notifications to a worker (by task name, or a thread in inline mode), and an
operator's "send again"."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterable
from datetime import timedelta

from celery import current_app
from django.db import connection, transaction
from django.utils import timezone

from notify_app.conf import notify_conf
from notify_app.models import Notification, NotificationState
from notify_app.services.delivery import notification_deliver

logger = logging.getLogger(__name__)

# By name: services never import tasks (tasks import services).
DELIVER_TASK = "notify_app.tasks.notification_deliver_task"

# A try that has been `sending` this long is not in a live worker's hands any more (see resend).
SENDING_STALE_AFTER_S = 300


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
