"""Thin Celery tasks of notify_app: deliver one notification, retrying with backoff when told to."""

from celery import shared_task

from notify_app.services.delivery import notification_deliver
from notify_app.services.dispatch import DELIVER_TASK


# acks_late (also the project default): a worker that dies before it finishes leaves the message to
# another worker, whose claim then finds the row already `sending` or `sent` and does nothing.
# max_retries=None: the row's `tries` (ATTUNE_NOTIFY_MAX_TRIES) bounds the retries, not Celery.
@shared_task(name=DELIVER_TASK, bind=True, ignore_result=True, acks_late=True, max_retries=None)
def notification_deliver_task(self, notification_id: int) -> str:
    """Deliver notification `notification_id` once; returns the row's state after this try."""
    outcome = notification_deliver(notification_id=notification_id)
    if outcome.retry_in_s is not None:
        raise self.retry(countdown=outcome.retry_in_s)
    return outcome.state
